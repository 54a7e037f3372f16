"""table-differences: the difference of two per-device tables read at the partition id is
one table.

Before:  %a = reshape(dynamic_slice(constant A, partition_id))
         %b = reshape(dynamic_slice(constant B, partition_id))
         %s = subtract(%a, %b)
After:   %s = reshape(dynamic_slice(constant A - B, partition_id))

XLA writes a device's start along one mesh axis this way in a partitioned `jax.jit`
pipeline's backward (the start of a "data" tile, 2 x data, as (4 x fsdp + 2 x data) - 4 x
fsdp). Each table alone is a position over several axes that is no tile's start, so mesh
reduction kept those axes (docs/equivalence.md, Mesh reduction); their difference is one
axis's tile start. It is the same value on every device (integer constants, subtracted in
their type). Only a table read nowhere else is rewritten: A's constant takes the
difference and the subtraction reads its look-up; A's old reshape goes, and B's look-up
with it as far as nothing else reads it.
"""

from __future__ import annotations

import numpy as np

from tv_ir.ir.program import Block, Module, Op, Value

from .dce import read_counts

name = "table-differences"


def run(module: Module) -> Module:
    for fn in module.functions.values():
        _block(fn.body)
    return module


def _block(block: Block) -> None:
    uses = read_counts(block)
    dead: set[int] = set()
    for op in block.ops:
        if op.name != "stablehlo.subtract" or tuple(op.results[0].type.shape) != ():
            continue
        a, b = (_look_up(v) for v in op.operands)
        if a is None or b is None or a[1] is not b[1]:
            continue  # not two tables read at one partition id
        (const_a, _, slice_a, reshape_a), (const_b, *_) = a, b
        if const_a is const_b or any(
            uses.get(x.results[0].id, 0) != 1 for x in (const_a, slice_a, reshape_a)
        ):
            continue  # A's table is read elsewhere too
        table_a, table_b = const_a.attrs["value"], const_b.attrs["value"]
        if table_a.shape != table_b.shape or table_a.dtype != table_b.dtype:
            continue
        with np.errstate(over="ignore"):  # wraps as the op does in its type
            const_a.attrs["value"] = (table_a - table_b).astype(table_a.dtype)
        read = list(op.operands)
        op.name = "stablehlo.reshape"
        op.operands = [slice_a.results[0]]
        op.attrs = {}
        dead.add(id(reshape_a))
        for v in read[1:]:  # B's look-up, once nothing else reads it
            _drop_use(v, uses, dead)
    if dead:
        block.ops = [op for op in block.ops if id(op) not in dead]


def _drop_use(v: Value, uses: dict[int, int], dead: set[int]) -> None:
    """One use of v gone: its look-up chain (reshape, dynamic_slice, constant) is dropped
    as far as nothing else reads it."""
    uses[v.id] -= 1
    op = v.owner
    if uses[v.id] or op is None or op.name not in _LOOK_UP_OPS:
        return
    dead.add(id(op))
    for u in op.operands:
        _drop_use(u, uses, dead)


_LOOK_UP_OPS = ("stablehlo.reshape", "stablehlo.dynamic_slice", "stablehlo.constant")


def _look_up(v: Value) -> tuple[Op, Value, Op, Op] | None:
    """(the integer table constant, the partition id, the dynamic_slice, the reshape) when v
    is `reshape(dynamic_slice(table, partition_id))` of a one-element slice, else None."""
    reshape = v.owner
    if reshape is None or reshape.name != "stablehlo.reshape":
        return None
    ds = reshape.operands[0].owner
    if ds is None or ds.name != "stablehlo.dynamic_slice" or len(ds.operands) != 2:
        return None
    const, pid = ds.operands[0].owner, ds.operands[1]
    if const is None or const.name != "stablehlo.constant":
        return None
    if pid.owner is None or pid.owner.name != "stablehlo.partition_id":
        return None
    table = const.attrs.get("value")
    if not isinstance(table, np.ndarray) or table.ndim != 1 or table.dtype.kind not in "iu":
        return None
    if tuple(ds.attrs.get("slice_sizes", ())) != (1,):
        return None
    return const, pid, ds, reshape
