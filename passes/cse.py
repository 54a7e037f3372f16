"""cse: one op for each computation a block repeats.

Before:  %1 = stablehlo.dot_general %x, %w ...      After:  %1 = stablehlo.dot_general %x, %w
         %5 = stablehlo.dot_general %x, %w ...              (uses of %5 read %1)

`jax.grad` and a separately computed loss repeat the forward pass; without merging, the
prover gives each copy its own cut symbols and must prove the copies equal by expanding
them. Only pure ops without regions are merged (not collectives, RNG, custom calls or
anything that reads the process: those are left alone), and only within one block, in
program order. The kept op is the first one, with its source location.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tv_ir.ir.program import Block, Module, Op, Value

name = "cse"

# ops that are not pure functions of their operands and attributes
KEEP = (
    "stablehlo.rng",
    "stablehlo.rng_bit_generator",
    "stablehlo.custom_call",
    "stablehlo.partition_id",
    "stablehlo.replica_id",
    "stablehlo.infeed",
    "stablehlo.outfeed",
    "stablehlo.send",
    "stablehlo.recv",
    "stablehlo.optimization_barrier",
    "func.call",
    "stablehlo.call",
    # collectives: each is its own communication
    "stablehlo.all_reduce",
    "stablehlo.all_gather",
    "stablehlo.reduce_scatter",
    "stablehlo.all_to_all",
    "stablehlo.collective_permute",
    "stablehlo.collective_broadcast",
    "stablehlo.cross-replica-sum",
)


def run(module: Module) -> Module:
    for fn in module.functions.values():
        fn.body = _cse_block(fn.body)
    return module


def _cse_block(block: Block) -> Block:
    seen: dict[tuple, Op] = {}
    rename: dict[int, Value] = {}
    ops: list[Op] = []
    for op in block.ops:
        op.operands = [rename.get(v.id, v) for v in op.operands]
        if op.regions:
            for region in op.regions:
                _rename_inside(region.block, rename)
                region.block = _cse_block(region.block)
            ops.append(op)
            continue
        key = _key(op)
        first = seen.get(key) if key is not None else None
        if first is None:
            if key is not None:
                seen[key] = op
            ops.append(op)
            continue
        for r, kept in zip(op.results, first.results, strict=True):
            rename[r.id] = kept
    return Block(block.args, ops, [rename.get(v.id, v) for v in block.results])


def _rename_inside(block: Block, rename: dict[int, Value]) -> None:
    """Ops in nested regions may use outer values that were merged away."""
    if not rename:
        return
    for op in block.ops:
        op.operands = [rename.get(v.id, v) for v in op.operands]
        for region in op.regions:
            _rename_inside(region.block, rename)
    block.results = [rename.get(v.id, v) for v in block.results]


def _key(op: Op) -> tuple | None:
    if op.name in KEEP or op.name.startswith(("sdy.", "mhlo.")):
        return None
    try:
        attrs = tuple(sorted((k, _frozen(v)) for k, v in op.attrs.items()))
    except TypeError:
        return None
    types = tuple(repr(r.type) for r in op.results)
    return (op.name, tuple(v.id for v in op.operands), attrs, types)


def _frozen(v: Any) -> Any:
    """A hashable stand-in for an attribute value."""
    if isinstance(v, np.ndarray):
        return ("array", str(v.dtype), v.shape, v.tobytes())
    if isinstance(v, dict):
        return tuple(sorted((k, _frozen(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_frozen(x) for x in v)
    hash(v)
    return v
