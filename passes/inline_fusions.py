"""inline-fusions: replace each `mhlo.fusion` (XLA's fused computations, in per-pass dumps and
optimised HLO) by the ops of its body, at every nesting level.

Before:  %f = "mhlo.fusion"(%a, %b) ({ ^bb0(%x, %y): %d = stablehlo.dot %x, %y ... mhlo.return %d })
After:   %d = stablehlo.dot %a, %b ...

A fusion is an execution-grouping decision (which ops one kernel runs); its meaning is its body
applied to its operands, so it is not an op of its own to give semantics to.
"""

from __future__ import annotations

from tv_ir.ir.program import Block, Module, Value

from .inline_calls import clone_block

name = "inline-fusions"
FUSION = "mhlo.fusion"


def run(module: Module) -> Module:
    for fn in module.functions.values():
        fn.body = _inline(fn.body)
    return module


def _inline(block: Block) -> Block:
    if not _has_fusion(block):
        return block
    ops = []
    rename: dict[int, Value] = {}

    def get(v: Value) -> Value:
        return rename.get(v.id, v)

    for op in block.ops:
        op.operands = [get(v) for v in op.operands]
        _rename_in_regions(op, rename)
        for region in op.regions:
            region.block = _inline(region.block)
        if op.name != FUSION:
            ops.append(op)
            continue
        body = op.regions[0].block
        inlined = clone_block(body, {a.id: v for a, v in zip(body.args, op.operands, strict=True)})
        ops.extend(inlined.ops)
        for r, v in zip(op.results, inlined.results, strict=True):
            rename[r.id] = v
    return Block(block.args, ops, [get(v) for v in block.results])


def _has_fusion(block: Block) -> bool:
    return any(
        op.name == FUSION or any(_has_fusion(r.block) for r in op.regions) for op in block.ops
    )


def _rename_in_regions(op, rename: dict[int, Value]) -> None:
    """Nested regions may use outer values that were renamed."""
    for region in op.regions:
        for inner in region.block.ops:
            inner.operands = [rename.get(v.id, v) for v in inner.operands]
            _rename_in_regions(inner, rename)
        region.block.results = [rename.get(v.id, v) for v in region.block.results]
