"""Loss shares: float constants that count devices, not positions (issues #10 and #12).

A data-parallel step divides each device's loss by its share of the global batch,
`loss / (micro * dp)`, and sums the shares with a psum over the data-parallel devices. That
constant is the same number at any dimension size (shape reduction never changes the mesh,
nor a class that cannot shrink, such as 2 micro-batches), so it is read as a fixed constant,
and a dimension class that happens to have its size keeps no size because of it.

It is identified by where it flows, never by its value alone: `x * c` or `x / c` whose
result reaches only `all_reduce` sums (through adds, subtracts, negations, selects,
conversions and reshapes), every one over groups of g devices, with |c| or 1/|c| equal to
g times a divisor of the number of such shares summed there (the micro-batches: `loss_m / c`
for each of m micro-batches, all reaching the same psums). Not any size of a class that
cannot shrink: a count of positions that happens to equal g times such a size (16 = 8
devices x a contracted dimension of 2) is no share. The backward of such a share
(`seed / c`, the seed a value built from constants and the device's id only, dividing by
the very constant value of an identified share) is the same share, transposed.
Argument: docs/equivalence.md, "Shape reduction", loss shares.
"""

from __future__ import annotations

import numpy as np

from tv_ir.ir.program import Module, Op, walk

# ops through which a scaled value is still the same share of the sum (it is not scaled
# again by another value): the operand positions that carry it
_CARRY = {
    "stablehlo.add": (0, 1),
    "stablehlo.subtract": (0, 1),
    "stablehlo.negate": (0,),
    "stablehlo.convert": (0,),
    "stablehlo.reshape": (0,),
    "stablehlo.select": (1, 2),
    "mhlo.copy": (0,),
}


def device_shares(
    module: Module, float_uses: list, floats: dict, known: dict | None = None
) -> tuple[set, dict[int, float]]:
    """The uses `(id(op), operand)` among `float_uses` (`(op, operand, value id)`) whose
    constant is a device share of a psum'd sum (see the module docstring), and the constants
    that a share's backward folded in (value id -> the share's factor in them: `1/16 / 2`,
    the seed's share divided by a mean's count, is 1/32 of which 1/16 is the share).
    `floats`: value id -> its float constant; `known`: value id -> its value on each device
    (`per_device.PerDevice`), where shape reduction folded it from the device's id."""
    ops = list(walk(module.main.body))
    uses: dict[int, list[tuple[Op, int]]] = {}
    for op in ops:
        for k, v in enumerate(op.operands):
            uses.setdefault(v.id, []).append((op, k))
    # candidates: (op, operand, value id, constant, the all_reduce ops reached, the devices
    # of a group that contribute)
    candidates = []
    for op, k, vid in float_uses:
        if not _scales(op, k):
            continue
        reached = _psums_reached(op.results[0].id, uses)
        if reached is None:
            continue
        sums, groups, selects = reached
        if len(groups) != 1:
            continue
        group = next(iter(groups))
        if selects:  # `where(stage == last, share, 0)`: only some devices contribute
            group = _contributing(selects, sums, ops, known or {})
            if group is None:
                continue
        candidates.append((op, k, vid, abs(floats[vid]), sums, group))
    found: set = set()
    share_values: set[int] = set()
    for op, k, vid, c, sums, group in candidates:
        summands = sum(1 for o in candidates if o[4] == sums and _same(o[3], c))
        if _is_share(c, group, _divisors(summands)):
            found.add((id(op), k))
            share_values.add(vid)
    if not share_values:
        return found, {}
    free = _input_free(module, ops)
    seeded: dict[int, float] = {}
    for op, k, vid in float_uses:  # the backward of a share: the seed scaled by it
        if vid in share_values and _scales(op, k) and op.operands[1 - k].id in free:
            found.add((id(op), k))
            c = floats[vid]
            seeded[op.results[0].id] = 1 / c if op.name == "stablehlo.divide" else c
    return found, _fold(ops, seeded, free)


def _fold(ops: list[Op], seeded: dict[int, float], free: set[int]) -> dict[int, float]:
    """The input-free values that carry a share's seed on (scaled by other constants,
    broadcast, reshaped, converted): value id -> the share's factor in them."""
    for op in ops:
        if len(op.results) != 1 or not all(v.id in free for v in op.operands):
            continue
        carried = [k for k, v in enumerate(op.operands) if v.id in seeded]
        if len(carried) != 1:
            continue
        k = carried[0]
        if op.name in ("stablehlo.multiply", "stablehlo.negate", "stablehlo.convert") or (
            op.name in ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.divide")
            and k == 0
        ):
            seeded[op.results[0].id] = seeded[op.operands[k].id]
    return seeded


def _scales(op: Op, k: int) -> bool:
    """Operand k of op scales the other operand (`x * c`, `c * x`, `x / c`)."""
    if op.name == "stablehlo.multiply":
        return len(op.operands) == 2
    return op.name == "stablehlo.divide" and k == 1


def _psums_reached(vid: int, uses: dict) -> tuple[frozenset, set[int], set] | None:
    """The `all_reduce` sums that the value `vid` reaches (their op ids), their group sizes
    and the selects it passes (`(predicate value id, operand)`), when every path from it
    ends in one (through the ops of `_CARRY` only); else None."""
    sums: set[int] = set()
    sizes: set[int] = set()
    selects: set[tuple[int, int]] = set()
    stack, seen = [vid], set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        users = uses.get(v, [])
        if not users:
            return None  # a result, or unused: not (only) summed over devices
        for op, k in users:
            if op.name == "stablehlo.all_reduce":
                g = sum_group_size(op)
                if g is None:
                    return None
                sums.add(id(op))
                sizes.add(g)
            elif k in _CARRY.get(op.name, ()):
                if op.name == "stablehlo.select":
                    selects.add((op.operands[0].id, k))
                stack.extend(r.id for r in op.results)
            else:
                return None
    return (frozenset(sums), sizes, selects) if sums else None


def _contributing(selects: set, sums: frozenset, ops: list[Op], known: dict) -> int | None:
    """How many devices of each group of the sums `sums` pass a share through the select
    `selects` names (one: paths through several selects are not counted) to them: its
    predicate a boolean per device (folded from the device's id), the same count in every
    group; None when that is not known."""
    if len(selects) != 1:
        return None
    [(pred, k)] = selects
    held = known.get(pred)
    values = held.scalars() if held is not None else None
    if values is None:
        return None
    passes = np.array([bool(v) == (k == 1) for v in values])[held.which]
    counts = set()
    for op in ops:
        if id(op) not in sums:
            continue
        groups = np.asarray(op.attrs.get("replica_groups", []), dtype=np.int64)
        if groups.ndim != 2 or groups.size == 0 or groups.max() >= len(passes):
            return None
        counts |= {int(passes[g].sum()) for g in groups}
    if len(counts) != 1 or 0 in counts:
        return None
    return counts.pop()


def sum_group_size(op: Op) -> int | None:
    """The members of each replica group of an all_reduce that adds (None otherwise, or
    when its groups differ in size)."""
    if not op.regions:
        return None
    body = [o.name for o in op.regions[0].block.ops]
    if "stablehlo.add" not in body or any(
        n not in ("stablehlo.add", "stablehlo.return") for n in body
    ):
        return None
    try:  # dense groups only (mesh-axes groups are not read here: no share is assumed)
        groups = np.asarray(op.attrs.get("replica_groups", []), dtype=np.int64)
    except (TypeError, ValueError):
        return None
    if groups.ndim != 2 or groups.shape[1] < 2:
        return None
    return int(groups.shape[1])


def _divisors(n: int) -> set[int]:
    """The divisors of n (the multipliers n shares summed in one psum explain: all of them
    on every device, or on 1/k of the devices each)."""
    return {m for m in range(1, n + 1) if n % m == 0}


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b))


def _is_share(c: float, group: int, counts: set[int]) -> bool:
    """|c| or 1/|c| is `group` devices times one of `counts`."""
    for m in counts:
        n = group * m
        if abs(c - n) <= 1e-6 * n or abs(c * n - 1) <= 1e-6:
            return True
    return False


def _input_free(module: Module, ops: list[Op]) -> set[int]:
    """Value ids computed from constants and the device's id only (no argument read)."""
    args = {a.id for a in module.main.args}
    free: set[int] = set()
    for op in ops:
        if op.regions:
            continue
        if all(v.id in free for v in op.operands) and not any(v.id in args for v in op.operands):
            free.update(r.id for r in op.results)
    return free
