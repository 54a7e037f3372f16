"""Layer stacks: a loop over stacked layers shrinks with the stack (the layer count is a class).

`jax.lax.scan` over stacked weights lowers to a `stablehlo.while` whose counter `i` counts
from 0 to N and is used for nothing but picking one layer of a stacked value: the start of a
`dynamic_slice` (a layer read) or a `dynamic_update_slice` (a layer written) along dimension
0, at `i` or at `N-1-i` (a reversed scan: the backward pass), where N is that dimension's
size. Such a loop is a *layer loop*: its trip count is a member of the stack dimension's
class (a size-carrying constant), tied to every stack it indexes, so the class shrinks like
any other and the trip count with it (the condition's bound and the `N` of a reversed index
are read at the reduced count).

Two more forms are read, for refutations only (`LayerLoop.singled_out`): a counter the
scanned function carries itself (`(h, i) -> (.., i + 1)` from 0: another integer in the
state counting with the loop's), and the counter compared for (in)equality with a constant
`K` (`jnp.where(i == K, ...)`: layer K singled out, a *marker*). At a reduced count
N' = N / f the marker reads `K // f`, the reduced layer that stands for layer K (a
counterexample blown up repeats reduced layer j over layers j*f .. j*f + f - 1). The layers
are then not one function repeated, so a proof at fewer layers says nothing and is not used
(pipeline._by_layer_reduction); a refutation is, once it replays at the real layer count.
Any other use of the counter (compared with a non-constant or by order, used in arithmetic,
a layer-dependent branch), another integer in the loop state, or a condition that reads
anything else keeps the loop as it is (`rules.keep_all`).

A layer count is not a tensor size: a trip count reduced this way is not sound by itself
(`x = x` against `x = -x`), so the pipeline checks the pair at the real layer count, other
classes reduced, before trusting a proof (docs/equivalence.md, "Layer stacks").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tv_ir.ir.program import Op, TensorType, Value, captured, integer_constant, walk

from .classes import Key

MIN_LAYERS = 2  # a layer loop keeps at least this many iterations (w[0] for every layer)


@dataclass
class LayerLoop:
    """A while loop whose counter only picks layers: its trip count, the counter's state
    position, and the constants that carry the trip count (op, operand, bias: the constant
    is N - bias, read as N' - bias at the reduced count N')."""

    loop: Op
    counter: int
    trips: int
    bounds: list[tuple[Op, int, int]] = field(default_factory=list)
    # index value id -> the stacked operand's dimension-0 reads and writes at it
    starts: set[int] = field(default_factory=set)
    stacks: list[Value] = field(default_factory=list)  # the values indexed by layer
    # the counter compared with a constant K (op, constant operand, K): layer K singled out
    markers: list[tuple[Op, int, int]] = field(default_factory=list)
    aliases: list[int] = field(default_factory=list)  # state positions counting with it
    # state positions (of any type) that change from one iteration to the next without
    # reading data: a float counter `t = t + 1.0`, a schedule, a key split each layer
    evolving: list[int] = field(default_factory=list)

    @property
    def singled_out(self) -> str | None:
        """Why the layers are not one function repeated (a proof at fewer layers is then
        not used), or None."""
        why = [f"compares its layer index with {k} at {op.loc}" for op, _, k in self.markers]
        if self.aliases:
            why.append("carries a second layer counter")
        if self.evolving:
            where = ", ".join(str(j) for j in self.evolving)
            why.append(
                f"carries state (position {where}) that changes with each layer without "
                "reading data (a counter in floats): its layers are not one function"
            )
        return f"the loop at {self.loop.loc} " + " and ".join(why) if why else None


def layer_loop(loop: Op, known: dict) -> LayerLoop | str:
    """`loop` as a layer loop, or why it is not one. `known`: value id -> per-device values
    (`per_device.PerDevice`) of integers folded before the loop (the counter's start must
    be 0 on every device)."""
    cond, body = loop.regions[0].block, loop.regions[1].block
    ints = [
        k
        for k, v in enumerate(loop.operands)
        if (not isinstance(v.type, TensorType) or v.type.is_integer)
        and k not in invariant_integers(loop, known)
    ]
    if not ints or any(
        not isinstance(loop.operands[j].type, TensorType) or loop.operands[j].type.shape != ()
        for j in ints
    ):  # a token or tuple in the state is no counter
        return "its state holds integers other than scalar counters and constants"
    for j in ints:
        start = known.get(loop.operands[j].id)
        if start is None or any(int(np.asarray(s).reshape(-1)[0]) != 0 for s in start.values):
            return "its counter does not start at 0"
    found = [(j, _bound(cond, j)) for j in ints]
    bounded = [(j, trips, bound) for j, (trips, bound) in found if trips is not None]
    if len(bounded) != 1:
        return found[0][1][1] if len(ints) == 1 else "its state holds more than one counter"
    k, trips, bound = bounded[0]
    out = LayerLoop(loop, k, trips, [bound], aliases=[j for j in ints if j != k])
    # every counter (the loop's and those counting with it) is i at iteration i
    affine: dict[int, tuple[int, int, list]] = {body.args[j].id: (1, 0, []) for j in ints}
    for op in body.ops:
        hits = [j for j, v in enumerate(op.operands) if v.id in affine]
        nested = {v.id for inner in _nested(op) for v in inner.operands}
        if nested & set(affine):
            return f"its counter is used inside {op.short_name} at {op.loc}"
        if not hits:
            continue
        why = _index_use(op, hits, affine, out)
        if why is not None:
            return why
    for j in ints:
        if affine.get(body.results[j].id, (0, 0))[:2] != (1, 1):
            return "its counter does not count up by one"
    for j, r in enumerate(body.results):
        if j not in ints and r.id in affine:
            return "its counter is carried in another position"
    if not out.stacks:
        return "it indexes no stacked value"
    out.evolving = evolving_state(loop, set(ints))
    return out


def evolving_state(loop: Op, counters: set[int]) -> list[int]:
    """State positions (other than `counters`) whose values differ between iterations
    without depending on data: each starts from constants and is updated from constants
    and such positions alone, and is not passed on unchanged. Their value at iteration i
    is a function of i, so a body reading them is not the same function at every layer:
    layer 17 may do what layers 0 and 1 never do, and no run on random inputs need show it
    (`where((t == 17.0) & (x[0, 0] == 3.0), 2 * h, h)`)."""
    body = loop.regions[1].block
    free = {j for j, v in enumerate(loop.operands) if j not in counters and _data_free(v, set())}
    inside = {r.id for op in walk(body) for r in op.results}
    changed = True
    while changed:  # drop positions whose update reads data (or a position that does)
        allowed = {body.args[j].id for j in free | counters}
        reading = {j for j in free if not _reads_only(body.results[j], allowed, inside)}
        free -= reading
        changed = bool(reading)
    return sorted(j for j in free if body.results[j] is not body.args[j])


def _data_free(v: Value, seen: set[int]) -> bool:
    """Whether `v` is computed from constants alone (no argument, no block argument)."""
    if v.id in seen:
        return True
    seen.add(v.id)
    op = v.owner
    if op is None:
        return False  # an argument: data
    return all(_data_free(x, seen) for x in list(op.operands) + captured(op))


def _reads_only(v: Value, allowed: set[int], inside: set[int]) -> bool:
    """Whether `v`, computed in the loop body (whose op results are `inside`), reads no
    block argument outside `allowed` and no value from outside the loop other than
    constants."""
    seen: set[int] = set()
    todo = [v]
    while todo:
        x = todo.pop()
        if x.id in seen:
            continue
        seen.add(x.id)
        if x.id in allowed:
            continue
        op = x.owner
        if op is None:
            return False  # another block argument: data
        if x.id not in inside and not _data_free(x, set()):
            return False
        todo.extend(list(op.operands) + captured(op))
    return True


def invariant_integers(loop: Op, known: dict) -> list[int]:
    """State positions holding an integer known before the loop and passed on unchanged (a
    constant index closed over by the scanned function): constants inside the loop too."""
    body = loop.regions[1].block
    return [
        k
        for k, (v, a, r) in enumerate(zip(loop.operands, body.args, body.results, strict=True))
        if isinstance(v.type, TensorType) and v.type.is_integer and v.id in known and r is a
    ]


def _bound(cond, k: int) -> tuple[int | None, object]:
    """(N, (compare, operand, 0)) for a condition `i < N`, else (None, why not)."""
    counter = cond.args[k]
    ops = cond.ops
    if not cond.results or cond.results[0].owner is None:
        return None, "its condition is not a comparison"
    cmp = cond.results[0].owner
    if cmp.short_name != "compare" or str(cmp.attrs.get("comparison_direction")) != "LT":
        return None, "its condition is not i < N"
    if cmp.operands[0] is not counter:
        return None, "its condition is not i < N"
    n = integer_constant(cmp.operands[1])
    if n is None or n < MIN_LAYERS:
        return None, "its condition is not i < N with N a constant of at least 2"
    for op in ops:
        if op is not cmp and op.name != "stablehlo.constant":  # constants read nothing
            return None, f"its condition computes {op.short_name} at {op.loc}"
    return n, (cmp, 1, 0)


def _index_use(op: Op, hits: list[int], affine: dict, out: LayerLoop) -> str | None:
    """Record op's use of counter-derived integers (a*i + b): arithmetic with a constant
    gives another, a layer read or write at i or N-1-i is what a layer loop does; any other
    use is why the loop is not a layer loop (None when this use is fine)."""
    name = op.short_name
    n = out.trips
    if name in ("add", "subtract") and len(hits) == 1 and len(op.operands) == 2:
        j = hits[0]
        c = integer_constant(op.operands[1 - j])
        if c is None:
            return f"its counter meets a value that is not a constant at {name} {op.loc}"
        a, b, consts = affine[op.operands[j].id]
        if name == "add":
            a2, b2, sign = a, b + c, 1
        elif j == 0:  # i - c
            a2, b2, sign = a, b - c, -1
        else:  # c - i
            a2, b2, sign = -a, c - b, 1
        affine[op.results[0].id] = (a2, b2, [*consts, (op, 1 - j, c, sign)])
        return None
    if name == "compare" and len(hits) == 1 and len(op.operands) == 2:
        j = hits[0]
        c = integer_constant(op.operands[1 - j])
        direction = str(op.attrs.get("comparison_direction"))
        if c is None or direction not in ("EQ", "NE") or affine[op.operands[j].id][:2] != (1, 0):
            return f"its counter is compared at {op.loc} other than i == K for a constant K"
        if not 0 <= c < n:
            return f"its counter is compared at {op.loc} with {c}, not a layer of {n}"
        out.markers.append((op, 1 - j, c))
        return None
    if name == "dynamic_slice" and hits == [1]:
        stack = op.operands[0]
        ok = op.results[0].type.shape[:1] == (1,)
    elif name == "dynamic_update_slice" and hits == [2]:
        stack = op.operands[0]
        ok = op.operands[1].type.shape[:1] == (1,)
    else:
        return f"its counter is used by {name} at {op.loc}"
    if not ok or stack.type.shape[:1] != (n,):
        return f"{name} at {op.loc} does not take one layer of a stack of {n}"
    idx = op.operands[hits[0]]
    a, b, consts = affine[idx.id]
    if (a, b) == (1, 0):
        pass
    elif (a, b) == (-1, n - 1):
        # the constant that carries N: N or N - 1, added (N - 1 - i, (N - i) - 1)
        carrying = [(o, j, c) for o, j, c, sign in consts if sign == 1 and c in (n, n - 1)]
        if len(carrying) != 1:
            return f"{name} at {op.loc} reads layer N-1-i without one constant N"
        o, j, c = carrying[0]
        bound = (o, j, n - c)
        if all(x[:2] != bound[:2] for x in out.bounds):
            out.bounds.append(bound)
    else:
        return f"{name} at {op.loc} reads a layer other than i or N-1-i"
    out.starts.add(idx.id)
    out.stacks.append(stack)
    return None


def _nested(op: Op):
    for region in op.regions:
        yield from walk(region.block)


def trip_key(loop: LayerLoop) -> Key:
    """The trip count as a member of a dimension class: (the counter's body argument, -1)."""
    return (loop.loop.regions[1].block.args[loop.counter].id, -1)


def layer_units(d, factor: dict, loops: list[LayerLoop]) -> dict:
    """Layer classes read in units of their layers per stage (`affine.Affine`, remainders
    0), reduced to MIN_LAYERS layers per unit where no factor gets that low: 63 layers per
    stage (126 over 2 stages) go to 2 and 4 rather than 3 and 6, and a prime count (61, 7)
    shrinks at all. Only classes whose every size and offset is a multiple of the unit,
    that no reshape merges, and whose loops single out no layer (a marker `i == K` has no
    reading at a count the unit does not divide). Sets their factor to 1."""
    from math import gcd

    from .affine import Affine

    merged = {d.find(k) for whole, parts in d.products for k in (whole, *parts)}
    marked = {d.find(trip_key(loop)) for loop in loops if loop.singled_out}
    classes = d.classes()
    out = {}
    for root in {d.find(trip_key(loop)) for loop in loops}:
        members = classes.get(root, [])
        if not members or root in merged or root in marked or d.reason_kept(members):
            continue
        sizes = {d.real[k] for k in members}
        offsets = {o for k in members for o in d.offsets.get(k, ()) if o}
        unit = 0
        for n in sizes:
            unit = gcd(unit, n)
        if unit // factor.get(root, 1) <= MIN_LAYERS or any(o % unit for o in offsets):
            continue  # a factor gets there already, or an offset inside a unit
        if any(min(d.lower.get(k, 1), d.real[k]) > MIN_LAYERS for k in members):
            continue
        out[root] = Affine(unit, MIN_LAYERS)
        factor[root] = 1
    return out
