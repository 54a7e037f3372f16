"""stack-writes: a stack written one layer at a time, and read back by layer, after unrolling.

Before (an unrolled scan stacking its per-layer outputs, and a later one reading them back):
    %s1 = dynamic_update_slice %zeros, %u0, 0, 0, 0
    ...
    %sN = dynamic_update_slice %s(N-1), %u(N-1), N-1, 0, 0
    %r  = dynamic_slice %sN, k, 0, 0 {slice_sizes = [1, ...]}
After:
    %r reads %uk; %sN, where anything else reads it and every layer was written, is
    concatenate(%u0, ..., %u(N-1)) along dimension 0; the partial stacks are gone.

Why: unrolled, each of a scan's N writes makes a new value holding the whole stack, N^2
layer-sized values where N suffice, and the prover holds every value of every device. A
scanned training step's residuals (forward) and stacked weight gradients (backward) are such
stacks: at 6 layers most of the reduced 405B-shaped spec's elements. The rewrite is exact:
a write of one layer at a known start in [0, N) overwrites that layer and nothing else (no
clamping), and a read of one layer at a known start reads the last write there. Only starts
that fold to constants through the op table (the counter of an unrolled loop, and the
compare-and-select of a negative index's wrap-around), one layer along dimension 0, whole in
every other dimension.
"""

from __future__ import annotations

import numpy as np

from tv_ir.ir.program import Block, Module, Op, TensorType, Value, walk
from tv_ir.semantics.algebra import NumpyAlgebra
from tv_ir.semantics.interpreters.evaluator import BlockEvaluator

from .inline_calls import _rename_in_regions

name = "stack-writes"


def run(module: Module) -> Module:
    """Forward layer reads of layer-by-layer written stacks in @main and its top-level
    shard_map bodies (where unrolling puts the loops' bodies)."""
    main = module.main
    scalars = BlockEvaluator(module, NumpyAlgebra())  # folds the starts: the shared op table
    main.body = _block(main.body, scalars)
    for op in main.body.ops:
        if op.name == "sdy.manual_computation":
            for region in op.regions:
                region.block = _block(region.block, scalars)
    return module


def _block(block: Block, scalars: BlockEvaluator) -> Block:
    known: dict[int, int] = {}  # value id -> a scalar integer folded from constants
    stacks: dict[int, dict[int, Value]] = {}  # stack value id -> layer -> what was written
    written_by: dict[int, Op] = {}
    rename: dict[int, Value] = {}
    ops: list[Op] = []
    for op in block.ops:
        op.operands = [rename.get(v.id, v) for v in op.operands]
        _rename_in_regions(op, rename)
        _fold(op, known, scalars)
        if op.name == "stablehlo.dynamic_update_slice":
            k = _one_layer(op.operands[0], op.operands[1].type.shape, op.operands[2:], known)
            if k is not None:
                stacks[op.results[0].id] = {**stacks.get(op.operands[0].id, {}), k: op.operands[1]}
                written_by[op.results[0].id] = op
        elif op.name == "stablehlo.dynamic_slice" and op.operands[0].id in stacks:
            sizes = tuple(op.attrs.get("slice_sizes", ()))
            k = _one_layer(op.operands[0], sizes, op.operands[1:], known)
            written = stacks[op.operands[0].id].get(k) if k is not None else None
            if written is not None and written.type == op.results[0].type:
                rename[op.results[0].id] = written
                continue
        ops.append(op)
    block.results = [rename.get(v.id, v) for v in block.results]
    ops = _whole_stacks(ops, block, stacks, written_by)
    block.ops = _without_dead_writes(ops, block, set(written_by))
    return block


def _whole_stacks(ops: list[Op], block: Block, stacks: dict, written_by: dict) -> list[Op]:
    """A stack with every layer written and read other than by the next write: the
    concatenation of its layers (the partial stacks before it then go dead)."""
    links = {op.operands[0].id for op in written_by.values()}
    users = _uses(ops, block)
    swap: dict[int, Op] = {}
    for vid, writes in stacks.items():
        op = written_by[vid]
        n = op.results[0].type.shape[0]
        if sorted(writes) != list(range(n)) or users.get(vid, 0) <= (vid in links):
            continue
        cat = Op("stablehlo.concatenate", [writes[k] for k in range(n)], [], {}, [], op.loc)
        cat.attrs["dimension"] = 0
        cat.results = [Value(op.results[0].type, None, cat, 0)]
        swap[id(op)] = cat
    if not swap:
        return ops
    rename = {op.results[0].id: cat.results[0] for op in ops if (cat := swap.get(id(op)))}
    out: list[Op] = []
    for op in ops:
        if op.name != "stablehlo.dynamic_update_slice":  # the chain itself reads the stack
            op.operands = [rename.get(v.id, v) for v in op.operands]
            _rename_in_regions(op, rename)
        out.append(op)
        if id(op) in swap:
            out.append(swap[id(op)])
    block.results = [rename.get(v.id, v) for v in block.results]
    return out


def _without_dead_writes(ops: list[Op], block: Block, writes: set[int]) -> list[Op]:
    """`ops` without the stack writes nothing reads any more (last to first)."""
    users = _uses(ops, block)
    kept: list[Op] = []
    for op in reversed(ops):
        if op.results and op.results[0].id in writes and not users.get(op.results[0].id):
            for v in op.operands:
                users[v.id] -= 1
            continue
        kept.append(op)
    return kept[::-1]


def _uses(ops: list[Op], block: Block) -> dict[int, int]:
    count: dict[int, int] = {}
    for op in ops:
        for inner in [op, *(o for r in op.regions for o in walk(r.block))]:
            for v in inner.operands:
                count[v.id] = count.get(v.id, 0) + 1
        for r in op.regions:
            for v in r.block.results:
                count[v.id] = count.get(v.id, 0) + 1
    for v in block.results:
        count[v.id] = count.get(v.id, 0) + 1
    return count


def _one_layer(stack: Value, sizes, starts: list[Value], known: dict) -> int | None:
    """The layer a read or write of `sizes` at `starts` covers: one layer along dimension 0
    of `stack`, whole in the others, at a known start in range; else None."""
    t = stack.type
    if not isinstance(t, TensorType) or not t.shape or len(starts) != len(t.shape):
        return None
    if tuple(sizes) != (1, *t.shape[1:]):
        return None
    at = [known.get(s.id) for s in starts]
    if any(a is None for a in at) or any(a != 0 for a in at[1:]):
        return None
    return at[0] if 0 <= at[0] < t.shape[0] else None


def _fold(op: Op, known: dict, scalars: BlockEvaluator) -> None:
    """Record op's result when it is a scalar integer or boolean computed from constants and
    known ones, evaluated by the shared op table (its wrap-around included)."""
    if op.regions or len(op.results) != 1:
        return
    t = op.results[0].type
    if not isinstance(t, TensorType) or t.shape != () or t.is_float or t.is_complex:
        return  # integers and booleans only
    if not op.operands and op.name != "stablehlo.constant":
        return  # partition_id, replica_id: not a constant of the program
    if not all(v.id in known for v in op.operands):
        return
    scalars.env = {
        v.id: np.asarray(known[v.id], dtype=np.dtype(v.type.numpy_dtype)) for v in op.operands
    }
    try:
        (value,) = scalars.evaluate_op(op)
    except Exception:  # not foldable here: the value is simply not known
        return
    known[op.results[0].id] = int(np.asarray(value).reshape(()))
