"""loop-cut: split a program at its top-level fixed-trip loops, for proof by induction.

A `jax.lax.scan` over stacked layer weights lowers to

    %r:4 = stablehlo.while(%w, %i = %c0, %h = %x, %ys = %zeros) cond {i < N} do {
      %wi = dynamic_slice %w[i]              (a stacked input: one layer read per step)
      %h2 = layer(%h, %wi)                   (the carry)
      %ys2 = dynamic_update_slice %ys[i], .. (a stacked output: one layer written per step)
      return %w, %i + 1, %h2, %ys2 }

`loop_parts` reads such a loop into its positions (counter, carried, invariant, stacked in,
stacked out). From them:

- `body_function`: one iteration as a loop-free function. Carried and invariant positions
  are its arguments; each stacked input's layer read becomes an argument (shape [1, ...]);
  each stacked output's written layer becomes a result. The counter is an argument only if
  the body still uses it once the reads and writes are gone (`jnp.where(i == 17, ...)`).
- `rest_function`: the program with its loops cut out: each loop's results become new
  arguments, each loop's initial operands new results.

Which positions correspond between two programs, and the layouts that make this sound, are
the prover's business (tv_ir.prover.loop_induction, docs/equivalence.md "Loops").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tv_ir.ir.program import Block, Function, Module, Op, TensorType, Value, walk
from tv_ir.semantics.algebra import NumpyAlgebra
from tv_ir.semantics.interpreters.interp import Interpreter

from .inline_calls import clone_block
from .unroll import MAX_TRIPS, known_operands, known_values

COUNTER, DERIVED, CARRIED, INVARIANT, STACKED_IN, STACKED_OUT = (
    "counter",
    "derived",
    "carried",
    "invariant",
    "stacked_in",
    "stacked_out",
)


@dataclass
class LoopParts:
    """One top-level loop of a program, read position by position."""

    loop: Op
    trips: int
    body: Block  # a copy of the loop body with calls inlined; args are the positions
    kinds: list[str]
    counter: int
    counter_start: int = 0
    reads: dict[int, list[Op]] = field(default_factory=dict)  # stacked in: dynamic_slices
    writes: dict[int, Op] = field(default_factory=dict)  # stacked out: dynamic_update_slice
    derived: dict[int, int] = field(default_factory=dict)  # position -> offset from counter
    # per stacked position: the layer index read or written at each iteration
    layer_order: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def positions(self, kind: str) -> list[int]:
        return [k for k, x in enumerate(self.kinds) if x == kind]


def top_level_loops(module: Module) -> list[Op]:
    return [op for op in module.main.body.ops if op.name == "stablehlo.while"]


def loop_parts(module: Module, loop: Op) -> LoopParts | str:
    """The loop's positions, or why it is not a scan this pass can cut."""
    from tv_ir.passes import run_pipeline

    starts = known_operands(module, loop)
    src = loop.regions[1].block
    copy = clone_block(src, {})
    fn = Function("main", copy, [v.type for v in copy.results])
    inlined = run_pipeline(Module({**module.functions, "main": fn}, dict(module.attrs)))
    body = inlined.main.body
    counting = _counting(body)
    tested = [k for k in counting if k in _compared(loop.regions[0].block)]
    if len(tested) != 1:
        return "it has no counter counting up by one that its condition tests"
    counter = tested[0]
    if starts[counter] is None:
        return "its counter does not start from a constant"
    trips = _trip_count(module, loop, counter, int(np.asarray(starts[counter])))
    if trips is None or trips < 1:
        return "its trip count is not fixed by its counter"
    derived = {}  # other positions counting up by one: the counter plus a fixed offset
    for k in counting:
        if k != counter and starts[k] is not None and starts[counter] is not None:
            derived[k] = int(np.asarray(starts[k])) - int(np.asarray(starts[counter]))
    kinds, reads, writes = [], {}, {}
    uses = _uses(body)
    for k, (a, r) in enumerate(zip(body.args, body.results, strict=True)):
        t = a.type
        if k == counter:
            kinds.append(COUNTER)
            continue
        if k in derived:
            kinds.append(DERIVED)
            continue
        if not isinstance(t, TensorType) or not (t.is_float or t.is_bool):
            return f"position {k} ({t}) is neither a float nor a boolean tensor"
        if r is a:
            found = _layer_reads(a, uses.get(a.id, []))
            kinds.append(STACKED_IN if found else INVARIANT)
            if found:
                reads[k] = found
        elif _layer_write(a, r, uses.get(a.id, [])):
            kinds.append(STACKED_OUT)
            writes[k] = r.owner
        else:
            kinds.append(CARRIED)
    parts = LoopParts(
        loop, trips, body, kinds, counter, reads=reads, writes=writes, derived=derived
    )
    parts.counter_start = int(np.asarray(starts[counter]))
    order = _layer_orders(inlined, parts)
    if isinstance(order, str):
        return order
    parts.layer_order = order
    return parts


def _counting(body: Block) -> list[int]:
    """The positions whose next value is itself plus the constant 1."""
    found = []
    for k, (a, r) in enumerate(zip(body.args, body.results, strict=True)):
        t = a.type
        if not (isinstance(t, TensorType) and t.is_integer and t.shape == ()):
            continue
        op = r.owner
        if op is None or op.name != "stablehlo.add":
            continue
        others = [v for v in op.operands if v is not a]
        if len(others) == 1 and _constant(others[0]) == 1:
            found.append(k)
    return found


def _trip_count(module: Module, loop: Op, counter: int, start: int) -> int | None:
    """How many times the condition holds as the counter counts up from `start` (None if
    it depends on anything else)."""
    interp = Interpreter(module, NumpyAlgebra())
    cond = loop.regions[0].block
    arg = cond.args[counter]
    for trips in range(MAX_TRIPS + 1):
        value = np.asarray(start + trips, dtype=arg.type.numpy_dtype)
        go = known_values(interp, cond, {arg.id: value}).get(cond.results[0].id)
        if go is None:
            return None
        if not bool(np.asarray(go).reshape(())):
            return trips
    return None


def _compared(cond: Block) -> set[int]:
    """The positions the loop condition compares."""
    out = set()
    for op in cond.ops:
        if op.name == "stablehlo.compare":
            out.update(k for k, a in enumerate(cond.args) if a in op.operands)
    return out


def _constant(v: Value):
    op = v.owner
    if op is None or op.name != "stablehlo.constant":
        return None
    x = np.asarray(op.attrs.get("value"))
    return x.item() if x.size == 1 else None


def _uses(block: Block) -> dict[int, list[Op]]:
    out: dict[int, list[Op]] = {}
    for op in walk(block):
        for v in op.operands:
            out.setdefault(v.id, []).append(op)
    return out


def _full_below(shape: tuple, sizes: tuple) -> bool:
    return len(sizes) == len(shape) and sizes[0] == 1 and tuple(sizes[1:]) == tuple(shape[1:])


def _layer_reads(a: Value, users: list[Op]) -> list[Op]:
    """Every use of `a` is a dynamic_slice of one whole layer (along dimension 0)."""
    if not users or len(a.type.shape) == 0:
        return []
    for op in users:
        if op.name != "stablehlo.dynamic_slice" or op.operands[0] is not a:
            return []
        if op.operands[0] in op.operands[1:]:
            return []
        if not _full_below(a.type.shape, tuple(op.results[0].type.shape)):
            return []
    return users


def _layer_write(a: Value, r: Value, users: list[Op]) -> bool:
    """The next value is `a` with one whole layer written, and `a` has no other use."""
    op = r.owner
    if op is None or op.name != "stablehlo.dynamic_update_slice" or op.operands[0] is not a:
        return False
    if len(users) != 1 or users[0] is not op or len(a.type.shape) == 0:
        return False
    return _full_below(a.type.shape, tuple(op.operands[1].type.shape))


def _layer_orders(module: Module, parts: LoopParts) -> dict[int, tuple[int, ...]] | str:
    """The layer each stacked read/write touches at each iteration: the start indices folded
    with the counter at 0, 1, ..., N-1 (the other start indices must fold to 0). All reads
    of one position must touch the same layer, inside the stack (no clamping)."""
    interp = Interpreter(module, NumpyAlgebra())
    ops = {k: list(v) for k, v in parts.reads.items()}
    ops.update({k: [w] for k, w in parts.writes.items()})
    first_index = {k: (1 if parts.kinds[k] == STACKED_IN else 2) for k in ops}
    order: dict[int, list[int]] = {k: [] for k in ops}
    counter = parts.body.args[parts.counter]
    start = parts.counter_start
    indices = [v for k, found in ops.items() for op in found for v in op.operands[first_index[k] :]]
    index_ops = Block(parts.body.args, _live(parts.body.ops, indices), [])
    for step in range(parts.trips):
        value = np.asarray(start + step, dtype=counter.type.numpy_dtype)
        env = known_values(interp, index_ops, {counter.id: value})
        for k, found in ops.items():
            layers = set()
            for op in found:
                idx = [env.get(v.id) for v in op.operands[first_index[k] :]]
                if any(x is None for x in idx) or any(int(x) != 0 for x in idx[1:]):
                    return f"the layer read or written at position {k} does not follow the counter"
                layers.add(int(idx[0]))
            if len(layers) != 1:
                return f"position {k} is read at several layers in one step"
            layer = layers.pop()
            if not 0 <= layer < parts.body.args[k].type.shape[0]:
                return f"position {k} is indexed outside its stack (layer {layer})"
            order[k].append(layer)
    return {k: tuple(v) for k, v in order.items()}


def body_function(
    parts: LoopParts, inputs: list[int], outputs: list[int], counter: bool | None = None
) -> Function | str:
    """One iteration as a function: arguments for `inputs` (carried, invariant, stacked-in
    positions), then the counter if the body still reads it (always, with `counter` True);
    results for `outputs` (carried and stacked-out positions). Returns why not when the body
    cannot be cut."""
    block = clone_block(parts.body, {})
    fresh = block.args  # position k's argument in the copy
    # map the original body's read/write ops to their clones by program position
    index_of = {id(op): n for n, op in enumerate(parts.body.ops)}
    replace: dict[int, Value] = {}
    args: list[Value] = []
    for k in inputs:
        kind = parts.kinds[k]
        if kind == STACKED_IN:
            layer_t = parts.reads[k][0].results[0].type
            layer = Value(layer_t, f"layer_of_{k}")
            for op in parts.reads[k]:
                replace[block.ops[index_of[id(op)]].results[0].id] = layer
            args.append(layer)
        elif kind in (CARRIED, INVARIANT):
            args.append(fresh[k])
        else:
            return f"position {k} ({kind}) is no body input"
    results: list[Value] = []
    for k in outputs:
        kind = parts.kinds[k]
        if kind == CARRIED:
            results.append(block.results[k])
        elif kind == STACKED_OUT:
            write = block.ops[index_of[id(parts.writes[k])]]
            results.append(write.operands[1])
        else:
            return f"position {k} ({kind}) is no body output"
    count = fresh[parts.counter]
    prologue = []
    for k, offset in parts.derived.items():
        t = count.type
        cst = Op("stablehlo.constant", [], [], {"value": np.array(offset, t.numpy_dtype)})
        cst.results = [Value(t, None, cst, 0)]
        add = Op("stablehlo.add", [count, cst.results[0]], [], {}, [], parts.loop.loc)
        add.results = [Value(t, None, add, 0)]
        prologue += [cst, add]
        replace[fresh[k].id] = add.results[0]
    block.ops = prologue + block.ops
    results = [replace.get(v.id, v) for v in results]
    for op in block.ops:
        op.operands = [replace.get(v.id, v) for v in op.operands]
        for inner in walk(Block([], [op], [])):
            inner.operands = [replace.get(v.id, v) for v in inner.operands]
    ops = _live(block.ops, results)
    if counter or any(count in op.operands for op in _walk_ops(ops)):
        args.append(count)
    if _undefined(args, ops, results):
        return "the body reads a stacked output beyond the layer it writes"
    names = [a.name for a in args]
    fn = Function("main", Block(args, ops, results), [v.type for v in results])
    fn.arg_attrs = [{} for _ in args]
    fn.res_attrs = [{} for _ in results]
    fn.arg_names = names
    return fn


def _undefined(args: list[Value], ops: list[Op], results: list[Value]) -> bool:
    """Whether some value used is neither an argument nor defined by an op (nested region
    arguments included)."""
    defined = {a.id for a in args}
    for op in _walk_ops(ops):
        defined.update(r.id for r in op.results)
        for region in op.regions:
            defined.update(a.id for a in region.block.args)
    used = [v for op in _walk_ops(ops) for v in op.operands] + list(results)
    return any(v.id not in defined for v in used)


def _walk_ops(ops: list[Op]):
    yield from walk(Block([], ops, []))


def _live(ops: list[Op], results: list[Value]) -> list[Op]:
    """The ops `results` depend on (through nested regions too), in program order."""
    need = {v.id for v in results}
    keep = []
    for op in reversed(ops):
        if any(r.id in need for r in op.results):
            keep.append(op)
            for inner in walk(Block([], [op], [])):
                need.update(v.id for v in inner.operands)
    return keep[::-1]


def rest_function(module: Module, loops: list[LoopParts], positions: list[list[int]]):
    """@main with `loops` cut out: per loop, the results at `positions` become arguments
    after the original ones and the initial operands at `positions` results after the
    original ones. Returns (function, why-not)."""
    main = module.main
    block = clone_block(main.body, {})
    index_of = {id(op): n for n, op in enumerate(main.body.ops)}
    cut = {index_of[id(p.loop)] for p in loops}
    replace: dict[int, Value] = {}
    new_args: list[Value] = []
    new_results: list[Value] = []
    for parts, keep in zip(loops, positions, strict=True):
        loop = block.ops[index_of[id(parts.loop)]]
        for k in keep:
            v = Value(loop.results[k].type, f"loop_result_{k}")
            replace[loop.results[k].id] = v
            new_args.append(v)
        new_results.extend(loop.operands[k] for k in keep)
        for k in (parts.counter, *parts.derived):
            final = loop.results[k]
            if final in block.results or any(final in o.operands for o in _walk_ops(block.ops)):
                return None, "a loop's final counter is used after it"
    ops = [op for n, op in enumerate(block.ops) if n not in cut]
    for op in _walk_ops(ops):
        op.operands = [replace.get(v.id, v) for v in op.operands]
    new_results = [replace.get(v.id, v) for v in new_results]
    results = [replace.get(v.id, v) for v in block.results] + new_results
    args = list(block.args) + new_args
    fn = Function(main.name, Block(args, _live(ops, results), results), [v.type for v in results])
    fn.arg_attrs = [dict(a) for a in main.arg_attrs] + [{} for _ in new_args]
    fn.res_attrs = [dict(a) for a in main.res_attrs] + [{} for _ in new_results]
    fn.arg_names = list(main.arg_names) + [a.name for a in new_args]
    return fn, ""


def with_main(module: Module, fn: Function, source: str) -> Module:
    """A module holding `fn` as @main, with `module`'s other functions and attributes."""
    functions = {k: f for k, f in module.functions.items() if k != module.main.name}
    functions[fn.name] = fn
    return Module(functions, dict(module.attrs), source, list(module.other_ops), fn.name)
