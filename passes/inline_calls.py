"""inline-calls: replace each top-level `func.call` in @main by the callee's body.

Before:  %r = func.call @relu(%x)          After:  %0 = stablehlo.maximum %x, %zero
                                                   (the callee's ops, renamed)
So every value the prover may cut at lives in one block. Calls inside `sdy.manual_computation`
bodies (shard_map: the prover cuts there too) are inlined as well; calls inside other nested
regions (loop bodies) stay: the interpreter evaluates them by name. The callee's ops keep
their own source locations.
"""

from __future__ import annotations

from tv_ir.errors import BadInput
from tv_ir.ir.program import Block, Module, Op, Region, Value

name = "inline-calls"
MAX_DEPTH = 64
INLINE_INSIDE = ("sdy.manual_computation",)  # regions whose ops the prover also cuts at


def run(module: Module) -> Module:
    main = module.main
    main.body = _inline_block(module, main.body, depth=0)
    return module


def run_in_loops(module: Module) -> Module:
    """`run`, and calls in the bodies of top-level loops (and of loops in shard_map bodies)
    inlined too: shape reduction reads a layer loop's body op by op (layer_stacks.py)."""
    main = module.main
    main.body = _inline_block(module, main.body, 0, INLINE_INSIDE + ("stablehlo.while",))
    return module


def _inline_block(
    module: Module, block: Block, depth: int, inside: tuple[str, ...] = INLINE_INSIDE
) -> Block:
    if depth > MAX_DEPTH:
        raise BadInput("recursive function calls are not supported")
    ops: list[Op] = []
    rename: dict[int, Value] = {}

    def get(v: Value) -> Value:
        return rename.get(v.id, v)

    for op in block.ops:
        op.operands = [get(v) for v in op.operands]
        if (
            op.name in ("func.call", "stablehlo.call")
            and op.attrs.get("callee") in module.functions
        ):
            callee = module.functions[op.attrs["callee"]]
            body = clone_block(
                callee.body, {a.id: v for a, v in zip(callee.body.args, op.operands, strict=True)}
            )
            body = _inline_block(module, body, depth + 1, inside)
            ops.extend(body.ops)
            for r, v in zip(op.results, body.results, strict=True):
                rename[r.id] = v
        else:
            _rename_in_regions(op, rename)
            if op.name in inside:
                for region in op.regions:
                    region.block = _inline_block(module, region.block, depth + 1, inside)
            ops.append(op)
    return Block(block.args, ops, [get(v) for v in block.results])


def _rename_in_regions(op: Op, rename: dict[int, Value]) -> None:
    """Nested regions may use outer values that were renamed."""
    if not rename:
        return
    for region in op.regions:
        for inner in region.block.ops:
            inner.operands = [rename.get(v.id, v) for v in inner.operands]
            _rename_in_regions(inner, rename)
        region.block.results = [rename.get(v.id, v) for v in region.block.results]


def clone_block(block: Block, mapping: dict[int, Value]) -> Block:
    """A copy of `block` with fresh values; `mapping` gives replacements for its arguments."""
    env: dict[int, Value] = dict(mapping)
    args = []
    for a in block.args:
        if a.id in env:
            continue
        na = Value(a.type, a.name)
        env[a.id] = na
        args.append(na)
    ops = [_clone_op(op, env) for op in block.ops]
    return Block(args if not mapping else [], ops, [env.get(v.id, v) for v in block.results])


def _clone_op(op: Op, env: dict[int, Value]) -> Op:
    regions = []
    for r in op.regions:
        inner_env = env  # regions may refer to outer values
        new_args = []
        for a in r.block.args:
            na = Value(a.type, a.name)
            inner_env[a.id] = na
            new_args.append(na)
        inner_ops = [_clone_op(o, inner_env) for o in r.block.ops]
        regions.append(
            Region(Block(new_args, inner_ops, [inner_env.get(v.id, v) for v in r.block.results]))
        )
    new = Op(op.name, [env.get(v.id, v) for v in op.operands], [], dict(op.attrs), regions, op.loc)
    for i, r in enumerate(op.results):
        nv = Value(r.type, r.name, new, i)
        env[r.id] = nv
        new.results.append(nv)
    return new
