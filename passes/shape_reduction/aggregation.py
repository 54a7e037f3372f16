"""Which dimension classes some op sums over, or spreads data along.

A float constant equal to a class's size may be the count of that class's positions (a
mean's `1/N`, the cotangent `g/N` of a mean spread over N positions) only if something in
one of the programs sums over that class or spreads a value along it: a count normalises
an aggregation. A class nothing aggregates (a layer stack read and written one layer at a
time, never summed over) has no count to normalise, so a constant that happens to equal its
size (an attention scale `1/sqrt(256)` beside 16 layers per pipeline stage) cannot be it.

Aggregating, conservatively: a reduction's reduced dimensions (whatever its reducer), a
dot's contracting dimensions, every dimension of a convolution, a windowed reduction, a
scatter or select-and-scatter, an FFT, a linear solve and an unknown `custom_call`, and the
dimensions a `broadcast_in_dim` adds or widens (unless it broadcasts the constant 0: a
zero-initialised stack spreads nothing). A merged dimension (a reshape's product) and its
parts count together. Collectives sum over devices, not over a dimension; the counts they
make are device shares (`device_shares.py`).
"""

from __future__ import annotations

from tv_ir.ir.program import Module, Op, TensorType, Value, walk

from .classes import DimClasses, Key

# ops that combine the elements of all their operands' dimensions
WHOLE = frozenset(
    "stablehlo." + n
    for n in (
        "convolution reduce_window select_and_scatter scatter fft triangular_solve cholesky "
        "custom_call"
    ).split()
)


def aggregated(d: DimClasses, modules: list[tuple[Module, dict[int, float]]]) -> set[Key]:
    """The class roots some op of `modules` sums over or spreads along; each module comes
    with its splat float constants (value id -> value), to tell a broadcast 0 apart."""
    keys: list[Key] = []
    for module, floats in modules:
        for fn in module.functions.values():
            for op in walk(fn.body):
                keys += _aggregating_keys(op, floats)
    roots = {d.find(k) for k in keys if k in d.parent}
    # a merged dimension and its parts: summing over one sums over the others' positions
    changed = True
    while changed:
        changed = False
        for whole, parts in d.products:
            group = [k for k in (whole, *parts) if k in d.parent]
            found = {d.find(k) for k in group}
            if found & roots and not found <= roots:
                roots |= found
                changed = True
    return roots


def _aggregating_keys(op: Op, floats: dict[int, float]) -> list[Key]:
    name = op.name
    if name == "stablehlo.reduce":
        n = len(op.operands) // 2
        axes = op.attrs.get("dimensions") or ()
        return [(x.id, a) for x in op.operands[:n] for a in axes]
    if name == "stablehlo.dot_general":
        dn = op.attrs["dot_dimension_numbers"]
        lhs, rhs = op.operands[0], op.operands[1]
        return [(lhs.id, a) for a in dn.lhs_contract] + [(rhs.id, a) for a in dn.rhs_contract]
    if name in WHOLE:
        return [k for v in (*op.operands, *op.results) for k in _all_keys(v)]
    if name == "stablehlo.broadcast_in_dim":
        x, r = op.operands[0], op.results[0]
        if floats.get(x.id) == 0.0:
            return []
        if not isinstance(x.type, TensorType) or not isinstance(r.type, TensorType):
            return []
        return [(r.id, j) for j in spread_dims(op)]
    return []


def spread_dims(op: Op) -> list[int]:
    """The result dimensions a `broadcast_in_dim` spreads its operand along: new ones, or
    widened ones, of size above 1 (a dimension of size 1 added, keepdims undone, spreads
    nothing)."""
    x, r = op.operands[0], op.results[0]
    bd = list(op.attrs["broadcast_dimensions"])
    return [
        j
        for j, n in enumerate(r.type.shape)
        if n > 1 and (j not in bd or x.type.shape[bd.index(j)] != n)
    ]


def _all_keys(v: Value) -> list[Key]:
    t = v.type
    return [(v.id, a) for a in range(len(t.shape))] if isinstance(t, TensorType) else []
