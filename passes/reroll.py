"""reroll: consecutive isomorphic blocks of @main (a Python `for` over layers) as one loop.

A stack of layers written as a Python `for` arrives unrolled: layer i's ops, then layer
i+1's, the same ops on different weights. Loop induction (tv_ir.prover.loop_induction)
proves a `stablehlo.while` once, whatever its trip count; this pass gives the unrolled stack
that form, so a Python-for spec and a Python-for implementation loop alike.

Before:  h1 = layer(h0, w0); h2 = layer(h1, w1); h3 = layer(h2, w2)       (3 blocks)
After:   ws = concatenate(reshape(w0), reshape(w1), reshape(w2))           (stacked input)
         _, h3, ... = stablehlo.while(i = 0, h = h0, ws, ...) cond {i < 3} do {
           w = reshape(dynamic_slice(ws, i, 0, ..)); h' = layer(h, w)
           ys' = dynamic_update_slice(ys, reshape(v), i, 0, ..)            (stacked output)
           return i + 1, h', ws, ys' }

Blocks are found on @main's top-level ops once the ops that read only arguments and
constants are set aside (hoisted before everything else: weight slices, transposes, shared
constants): a run of k >= 3 consecutive slices of the op sequence with the same signature
(op names, attributes, result and operand types, nested regions), whose wiring is the same
in every block: each operand is, in every block, the same op of the block itself, or the
same op of the block before (a carry; the first block reads its initial value from outside),
or one value from before the run shared by every block, or a value from before the run per
block (a layer's weights: stacked). A value used after the run is the last block's carry or
a per-block (stacked) output, read back with `slice`. Anything else ends the run there. The
loop's body is a copy of the first block, so unrolling the loop gives back the blocks, each
reading what it read before (docs/equivalence.md, "Loops": why this preserves meaning).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tv_ir.ir.attrs import EnumAttr
from tv_ir.ir.program import Block, Function, Module, Op, Region, TensorType, Value, walk
from tv_ir.ir.structure import op_signature

from .inline_calls import _clone_op, clone_block

name = "reroll"
MIN_BLOCKS = 3
COUNTER_TYPE = TensorType((), "i32")


@dataclass
class Run:
    """k consecutive isomorphic blocks of `period` ops, starting at flow position `start`."""

    start: int
    period: int
    blocks: int
    carried: dict[tuple[int, int], Value] = field(default_factory=dict)  # key -> initial
    carry_slots: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    shared: list[tuple[int, int]] = field(default_factory=list)  # (op, operand) slots
    stacked_in: list[tuple[int, int]] = field(default_factory=list)
    stacked_out: list[tuple[int, int]] = field(default_factory=list)  # (op, result) keys


def run(module: Module, trips: set[int] | None = None) -> Module:
    """`module` with every run of >= 3 isomorphic blocks in @main rerolled into a loop."""
    return reroll(module, trips)[0]


def reroll(module: Module, trips: set[int] | None = None) -> tuple[Module, list[Run]]:
    """The rerolled module (the input itself when nothing repeats) and the runs it rolled.
    Runs of `trips` blocks go first (the other program's loops: an implementation whose
    per-device weight gradients have one shape rolls them one per block, not two)."""
    main = module.main
    if any(op.name == "stablehlo.while" for op in main.body.ops):
        return module, []
    body = clone_block(main.body, {})  # rewritten in place below: the input stays as it was
    hoisted, flow = _split_hoisted(body)
    flow = _post_order(flow, body.results)
    runs = _find_runs(flow, body, trips or set())
    if not runs:
        return module, []
    fn = _rebuild(main, body, hoisted, flow, runs)
    functions = {k: f for k, f in module.functions.items() if k != main.name}
    functions[fn.name] = fn
    out = Module(functions, dict(module.attrs), module.source, list(module.other_ops), fn.name)
    return out, runs


def _free_operands(op: Op) -> list[Value]:
    """The values `op` reads, from its nested regions too (those defined outside it)."""
    if not op.regions:
        return op.operands
    inner = {a.id for o in walk(Block([], [op], [])) for r in o.regions for a in r.block.args}
    inner |= {r.id for o in walk(Block([], [op], [])) if o is not op for r in o.results}
    return [v for o in walk(Block([], [op], [])) for v in o.operands if v.id not in inner]


SLICES = {"stablehlo.slice", "stablehlo.dynamic_slice"}


def _split_hoisted(body: Block) -> tuple[list[Op], list[Op]]:
    """(ops computed from constants alone, and a layer's slice of an argument, squeezed;
    the others), each in program order. Hoisted, they are values from before any run:
    shared by the blocks or stacked per block. Other reads of arguments stay in the blocks,
    so each block's stacked inputs are the arguments themselves (a spec and an
    implementation that prepare weights differently still pair up)."""
    args = {a.id for a in body.args}
    constant: set[int] = set()
    sliced: set[int] = set()
    hoisted, flow = [], []
    for op in body.ops:
        free = [v.id for v in _free_operands(op)]
        if all(v in constant for v in free):
            constant.update(r.id for r in op.results)
        elif op.name in SLICES and all(v in constant or v in args for v in free):
            sliced.update(r.id for r in op.results)
        elif op.name == "stablehlo.reshape" and free[0] in sliced:
            sliced.update(r.id for r in op.results)
        else:
            flow.append(op)
            continue
        hoisted.append(op)
    return hoisted, flow


def _post_order(flow: list[Op], results: list[Value]) -> list[Op]:
    """`flow` in depth-first post-order from the results, operands left to right (as XLA
    prints a computation; ops nothing reads keep their order, last). The blocks of a
    program and of its partitioning by XLA then come in the same order."""
    mine = {id(op) for op in flow}
    seen: set[int] = set()
    out: list[Op] = []
    roots = [v.owner for v in results if v.owner is not None] + list(flow)
    for root in roots:
        if id(root) not in mine or id(root) in seen:
            continue
        stack = [(root, iter(_free_operands(root)))]
        seen.add(id(root))
        while stack:
            op, pending = stack[-1]
            for v in pending:
                d = v.owner
                if d is not None and id(d) in mine and id(d) not in seen:
                    seen.add(id(d))
                    stack.append((d, iter(_free_operands(d))))
                    break
            else:
                stack.pop()
                out.append(op)
    return out


def _find_runs(flow: list[Op], body: Block, trips: set[int]) -> list[Run]:
    """Non-overlapping runs, the ones covering most ops first."""
    ids: dict[tuple, int] = {}
    sig = np.array([ids.setdefault(op_signature(op), len(ids)) for op in flow], dtype=np.int64)
    n = len(flow)
    candidates = []
    for period in range(1, n // MIN_BLOCKS + 1):
        same = np.concatenate(([False], sig[:-period] == sig[period:], [False]))
        edges = np.flatnonzero(np.diff(same.astype(np.int8)))
        for t, u in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
            blocks = (u - t) // period + 1  # sig[p] == sig[p + period] for p in [t, u)
            if blocks >= MIN_BLOCKS:
                candidates.append((blocks * period, period, t, u + period))
    candidates.sort(key=lambda c: (c[0] // c[1] not in trips, -c[0], c[1], c[2]))
    position = {id(op): k for k, op in enumerate(flow)}
    uses = _uses_after(body, position)
    reads = [{v.id for v in _free_operands(op)} for op in flow]
    taken = np.zeros(n, dtype=bool)
    runs: list[Run] = []
    for covered, period, start, end in candidates:
        if _longest_free(taken[start:end]) < MIN_BLOCKS * period:
            continue  # (a multiple of) a period already rolled
        # blocks start where the fewest values cross (a residual stream, not a layer's
        # intermediate values): the same place in a spec and in its implementation
        middle = start + (covered // period // 2) * period
        crossing = [_crossing(flow, middle + p, period, reads) for p in range(period)]
        fewest = min(len(c) for c in crossing)
        # ties (a pre-norm block has two residual adds) go to the boundary whose crossing
        # values come from the earliest source lines, whatever the op order around them
        phases = [p for p in range(period) if len(crossing[p]) == fewest]
        phases.sort(key=lambda p: (_lines(crossing[p]), p))
        for phase in phases:
            found = _first_run(flow, position, uses, taken, start + phase, end, period)
            if found is not None:
                runs.append(found)
                taken[found.start : found.start + found.blocks * period] = True
                break
    return sorted(runs, key=lambda r: r.start)


def _longest_free(taken: np.ndarray) -> int:
    """The length of the longest stretch of False in `taken`."""
    best = run = 0
    for t in taken.tolist():
        run = 0 if t else run + 1
        best = max(best, run)
    return best


def _crossing(flow: list[Op], b: int, period: int, reads: list[set[int]]) -> list[Value]:
    """The values defined in the period before boundary `b` that the period after it reads
    (`reads`: the value ids each op reads)."""
    read = set().union(*reads[b : b + period])
    return [r for op in flow[max(b - period, 0) : b] for r in op.results if r.id in read]


def _lines(values: list[Value]) -> tuple:
    return tuple(sorted((v.owner.loc.file or "", v.owner.loc.line or 0) for v in values))


def _first_run(flow, position, uses, taken, s: int, end: int, period: int) -> Run | None:
    """The first run of >= 3 blocks wired alike from `s` on, within [s, end) and not taken."""
    while (end - s) // period >= MIN_BLOCKS:
        k = (end - s) // period
        clash = np.flatnonzero(taken[s : s + k * period])
        if clash.size:
            k = int(clash[0]) // period
            if k < MIN_BLOCKS:
                s += (k + 1) * period
                continue
        found = _wired(flow, position, uses, s, period, k)
        while not isinstance(found, Run) and found >= MIN_BLOCKS:
            found = _wired(flow, position, uses, s, period, found)
        if isinstance(found, Run):
            return found
        s += max(found, 1) * period
    return None


def _uses_after(body: Block, position: dict[int, int]) -> dict[int, list[int]]:
    """value id -> flow positions of the ops reading it (len(flow) for @main's results)."""
    out: dict[int, list[int]] = {}
    for op in body.ops:
        where = position.get(id(op))
        if where is None:
            continue
        for v in _free_operands(op):
            out.setdefault(v.id, []).append(where)
    for v in body.results:
        out.setdefault(v.id, []).append(len(position))
    return out


def _wired(flow, position, uses, start: int, period: int, blocks: int) -> Run | int:
    """The run if blocks [start, start + blocks * period) are wired alike; else how many
    blocks from `start` are (0 when the first block itself cannot start a run)."""
    run = Run(start, period, blocks)
    end = start + blocks * period

    def where(v: Value) -> tuple[int, int, int] | None:
        """(block, op offset, result index) of a value defined in the run, else None."""
        p = position.get(id(v.owner)) if v.owner is not None else None
        if p is None or not start <= p < end:
            return None
        return ((p - start) // period, (p - start) % period, v.index)

    good = blocks
    slots: dict[tuple[int, int], str] = {}
    for q in range(period):
        for o in range(len(flow[start + q].operands)):
            first = flow[start + q].operands[o]
            second = flow[start + period + q].operands[o]
            w1, w2 = where(first), where(second)
            if w1 is not None and w2 is not None and w1[0] == 0 and w2[0] == 1:
                if w1[1:] != w2[1:]:
                    return 0
                kind = "internal"
            elif w1 is None and w2 is not None and w2[0] == 0:
                kind = "carried"
                key = w2[1:]
                if run.carried.setdefault(key, first) is not first:
                    return 0
                run.carry_slots[(q, o)] = key
            elif w1 is None and w2 is None:
                kind = "shared" if first is second else "stacked"
            else:
                return 0
            slots[(q, o)] = kind
            for b in range(2, good):
                v = flow[start + b * period + q].operands[o]
                w = where(v)
                ok = {
                    "internal": w is not None and w == (b, *w1[1:]) if w1 else False,
                    "carried": w is not None and w == (b - 1, *w2[1:]) if w2 else False,
                    "shared": v is first,
                    "stacked": w is None,
                }[kind]
                if not ok:
                    good = b
                    break
    if good < blocks:
        return good
    # regions' free values must come from before the run (their signatures are unique
    # otherwise), so only operands were checked above
    run.shared = [s for s, k in slots.items() if k == "shared"]
    run.stacked_in = [s for s, k in slots.items() if k == "stacked"]
    outs = set()
    for b in range(blocks):
        for q in range(period):
            for r, v in enumerate(flow[start + b * period + q].results):
                later = [u for u in uses.get(v.id, []) if u >= end]
                if not later:
                    continue
                if b == blocks - 1 and (q, r) in run.carried:
                    continue
                outs.add((q, r))
    run.stacked_out = sorted(outs)
    if not run.carried and not _only_results(flow, uses, start, end):
        return 0  # independent blocks are rolled only as results (a gradient per layer)
    return run


def _only_results(flow: list[Op], uses, start: int, end: int) -> bool:
    """Whether the values of flow[start:end] used after it are used only as results."""
    later = [u for op in flow[start:end] for r in op.results for u in uses.get(r.id, [])]
    return all(u < end or u == len(flow) for u in later)


def _rebuild(
    main: Function, body: Block, hoisted: list[Op], flow: list[Op], runs: list[Run]
) -> Function:
    replace: dict[int, Value] = {}
    ops = list(hoisted)
    at = {r.start: r for r in runs}
    readbacks: dict[int, tuple[int, int]] = {}  # value -> (stacked output, layer)
    p = 0
    while p < len(flow):
        r = at.get(p)
        if r is None:
            op = flow[p]
            _rename(op, replace)
            ops.append(op)
            p += 1
            continue
        ops.extend(_rolled(flow, r, replace, readbacks))
        p += r.period * r.blocks
    results = [replace.get(v.id, v) for v in body.results]
    fn = Function(main.name, Block(body.args, ops, results), list(main.result_types))
    fn.arg_attrs, fn.res_attrs = main.arg_attrs, main.res_attrs
    fn.arg_names, fn.visibility = main.arg_names, main.visibility
    return fn


def _rename(op: Op, replace: dict[int, Value]) -> None:
    for inner in walk(Block([], [op], [])):
        inner.operands = [replace.get(v.id, v) for v in inner.operands]


def _new(name: str, operands: list[Value], types: list, attrs=None, loc=None) -> Op:
    op = Op(name, list(operands), [], dict(attrs or {}))
    if loc is not None:
        op.loc = loc
    op.results = [Value(t, None, op, k) for k, t in enumerate(types)]
    return op


def _constant(value, t: TensorType) -> Op:
    return _new("stablehlo.constant", [], [t], {"value": np.array(value, t.numpy_dtype)})


def _with_layer(t: TensorType, n: int) -> TensorType:
    return TensorType((n, *t.shape), t.dtype)


def _rolled(flow: list[Op], run: Run, replace: dict[int, Value], readbacks: dict) -> list[Op]:
    """The ops standing for `run`: stacking, the loop, and reading its results back.

    A run that reads an earlier run's per-block outputs last layer first (the backward
    pass of a forward stack) walks its stacks backwards: block b is layer K-1-b of every
    stack it reads and writes, as in a reversed scan."""
    P, K, s = run.period, run.blocks, run.start
    block = [flow[s + b * P : s + (b + 1) * P] for b in range(K)]
    loc = block[0][0].loc
    out: list[Op] = []
    for b in range(K):
        for op in block[b]:
            _rename(op, replace)  # earlier runs' results
    backward = _reads_backwards(block, run, readbacks)

    def layer(b: int) -> int:
        return K - 1 - b if backward else b

    # loop positions: counter, carried, shared, stacked in, stacked out
    carried = list(run.carried)
    # shared values computed from constants alone are computed again in the body (as
    # inputs they would be any value, and their layouts guesses); the others are inputs
    shared_all = list(dict.fromkeys(block[0][q].operands[o] for q, o in run.shared))
    shared_vals = [v for v in shared_all if not _from_constants(v)]
    zero = _constant(0, COUNTER_TYPE)
    out.append(zero)
    # slots reading the same value in every block share one stack
    groups: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for q, o in run.stacked_in:
        key = tuple(block[b][q].operands[o].id for b in range(K))
        groups.setdefault(key, []).append((q, o))
    stacks = []
    for q, o in (slots[0] for slots in groups.values()):
        values = [block[b][q].operands[o] for b in sorted(range(K), key=layer)]
        stacks.append(_stacked(values, readbacks, out, loc))
    inits = []
    for q, r in run.stacked_out:
        t = block[0][q].results[r].type
        c = _constant(0, TensorType((), t.dtype))
        bc = _new(
            "stablehlo.broadcast_in_dim",
            c.results,
            [_with_layer(t, K)],
            {"broadcast_dimensions": ()},
            loc,
        )
        out += [c, bc]
        inits.append(bc.results[0])
    initial = [zero.results[0], *(run.carried[k] for k in carried), *shared_vals]
    initial += stacks + inits
    types = [v.type for v in initial]
    # condition: i < K
    cargs = [Value(t, f"c{k}") for k, t in enumerate(types)]
    limit = _constant(K, COUNTER_TYPE)
    cmp = _new(
        "stablehlo.compare",
        [cargs[0], limit.results[0]],
        [TensorType((), "i1")],
        {
            "comparison_direction": _enum("ComparisonDirectionAttr", "LT"),
            "compare_type": _enum("ComparisonTypeAttr", "SIGNED"),
        },
        loc,
    )
    cond = Block(cargs, [limit, cmp], [cmp.results[0]])
    # body: a copy of the first block
    bargs = [Value(t, f"b{k}") for k, t in enumerate(types)]
    counter = bargs[0]
    nc, ns = len(carried), len(shared_vals)
    carry_arg = {key: bargs[1 + k] for k, key in enumerate(carried)}
    shared_arg = {v.id: bargs[1 + nc + k] for k, v in enumerate(shared_vals)}
    stack_arg = bargs[1 + nc + ns : 1 + nc + ns + len(stacks)]
    out_arg = bargs[1 + nc + ns + len(stacks) :]
    body_ops: list[Op] = []
    zero_in = _constant(0, COUNTER_TYPE)
    body_ops.append(zero_in)
    index = counter
    if backward:  # K - 1 - i
        last = _constant(K - 1, COUNTER_TYPE)
        sub = _new("stablehlo.subtract", [last.results[0], counter], [COUNTER_TYPE], loc=loc)
        body_ops += [last, sub]
        index = sub.results[0]
    copies: dict[int, Value] = {}
    for v in shared_all:
        if _from_constants(v):
            shared_arg[v.id] = _recomputed(v, body_ops, copies)
    layer_of: dict[tuple[int, int], Value] = {}
    for k, slots in enumerate(groups.values()):
        q, o = slots[0]
        t = block[0][q].operands[o].type
        starts = [index] + [zero_in.results[0]] * len(t.shape)
        ds = _new(
            "stablehlo.dynamic_slice",
            [stack_arg[k], *starts],
            [_with_layer(t, 1)],
            {"slice_sizes": (1, *t.shape)},
            loc,
        )
        rs = _new("stablehlo.reshape", ds.results, [t], loc=loc)
        body_ops += [ds, rs]
        layer_of.update({slot: rs.results[0] for slot in slots})
    kinds = {slot: "shared" for slot in run.shared}
    kinds.update({slot: "stacked" for slot in run.stacked_in})
    env: dict[tuple[int, int], Value] = {}  # (op offset, result) -> the copy's value
    offset = {id(op): q for q, op in enumerate(block[0])}
    for q, op in enumerate(block[0]):
        operands = []
        for o, v in enumerate(op.operands):
            kind = kinds.get((q, o))
            if kind == "shared":
                operands.append(shared_arg[v.id])
            elif kind == "stacked":
                operands.append(layer_of[(q, o)])
            elif (q, o) in run.carry_slots:  # the block before's value (or the initial one)
                operands.append(carry_arg[run.carry_slots[(q, o)]])
            else:  # the block's own op
                operands.append(env[(offset[id(v.owner)], v.index)])
        copy = _clone(op, operands)
        body_ops.append(copy)
        for r, v in enumerate(copy.results):
            env[(q, r)] = v
    one = _constant(1, COUNTER_TYPE)
    step = _new("stablehlo.add", [counter, one.results[0]], [COUNTER_TYPE], loc=loc)
    body_ops += [one, step]
    writes = []
    for k, (q, r) in enumerate(run.stacked_out):
        v = env[(q, r)]
        rs = _new("stablehlo.reshape", [v], [_with_layer(v.type, 1)], loc=loc)
        starts = [index] + [zero_in.results[0]] * len(v.type.shape)
        dus = _new(
            "stablehlo.dynamic_update_slice",
            [out_arg[k], rs.results[0], *starts],
            [out_arg[k].type],
            loc=loc,
        )
        body_ops += [rs, dus]
        writes.append(dus.results[0])
    results = [step.results[0], *(env[k] for k in carried), *bargs[1 + nc : 1 + nc + ns]]
    results += stack_arg
    results += writes
    loop = _new("stablehlo.while", initial, types, loc=loc)
    loop.regions = [Region(cond), Region(Block(bargs, body_ops, results))]
    out.append(loop)
    # outside uses: the last block's carries are the loop's results, other values are read
    # back from the stacked outputs
    for k, key in enumerate(carried):
        q, r = key
        replace[block[K - 1][q].results[r].id] = loop.results[1 + k]
    first_out = 1 + nc + ns + len(stacks)
    for k, (q, r) in enumerate(run.stacked_out):
        stack = loop.results[first_out + k]
        for b in range(K):
            v = block[b][q].results[r]
            if v.id in replace:
                continue
            lim = (layer(b) + 1, *v.type.shape)
            sl = _new(
                "stablehlo.slice",
                [stack],
                [_with_layer(v.type, 1)],
                {
                    "start_indices": (layer(b), *([0] * len(v.type.shape))),
                    "limit_indices": lim,
                    "strides": (1,) * (len(v.type.shape) + 1),
                },
                loc,
            )
            rs = _new("stablehlo.reshape", sl.results, [v.type], loc=loc)
            out += [sl, rs]
            replace[v.id] = rs.results[0]
            readbacks[rs.results[0].id] = (stack, layer(b))
    return out


def _stacked(values: list[Value], readbacks: dict, out: list[Op], loc) -> Value:
    """`values` stacked along a new dimension 0 (ops appended to `out`): consecutive
    layers read back from one earlier stack are one slice of it, not one piece each."""
    pieces: list[Value] = []
    k = 0
    while k < len(values):
        source = readbacks.get(values[k].id)
        n = 1
        if source is not None:
            while k + n < len(values) and readbacks.get(values[k + n].id) == (
                source[0],
                source[1] + n,
            ):
                n += 1
            stack, first = source
            shape = stack.type.shape
            if n == shape[0]:
                pieces.append(stack)
            else:
                sl = _new(
                    "stablehlo.slice",
                    [stack],
                    [TensorType((n, *shape[1:]), stack.type.dtype)],
                    {
                        "start_indices": (first, *([0] * (len(shape) - 1))),
                        "limit_indices": (first + n, *shape[1:]),
                        "strides": (1,) * len(shape),
                    },
                    loc,
                )
                out.append(sl)
                pieces.append(sl.results[0])
        else:
            v = values[k]
            rs = _new("stablehlo.reshape", [v], [_with_layer(v.type, 1)], loc=loc)
            out.append(rs)
            pieces.append(rs.results[0])
        k += n
    if len(pieces) == 1:
        return pieces[0]
    t = _with_layer(values[0].type, len(values))
    cat = _new("stablehlo.concatenate", pieces, [t], {"dimension": 0}, loc)
    out.append(cat)
    return cat.results[0]


def _reads_backwards(block: list[list[Op]], run: Run, readbacks: dict) -> bool:
    """Whether some stacked input reads an earlier run's stacked output at layers that
    go down block after block."""
    for q, o in run.stacked_in:
        seen = [readbacks.get(block[b][q].operands[o].id) for b in range(run.blocks)]
        seen = [x for x in seen if x is not None]
        if len(seen) >= 2 and all(
            a[0] is b[0] and a[1] > b[1] for a, b in zip(seen, seen[1:], strict=False)
        ):
            return True
    return False


def _from_constants(v: Value) -> bool:
    """Whether `v` is computed from constants alone."""
    op = v.owner
    return op is not None and all(_from_constants(u) for u in _free_operands(op))


def _recomputed(v: Value, ops: list[Op], copies: dict[int, Value]) -> Value:
    """A copy of `v`'s computation from constants, appended to `ops`."""
    if v.id not in copies:
        op = v.owner
        operands = [_recomputed(u, ops, copies) for u in op.operands]
        copy = _clone(op, operands)
        ops.append(copy)
        for r, c in zip(op.results, copy.results, strict=True):
            copies[r.id] = c
    return copies[v.id]


def _clone(op: Op, operands: list[Value]) -> Op:
    env: dict[int, Value] = {a.id: b for a, b in zip(op.operands, operands, strict=True)}
    copy = _clone_op(op, env)
    copy.operands = list(operands)
    return copy


def _enum(kind: str, value: str) -> EnumAttr:
    return EnumAttr(kind=kind, value=value)
