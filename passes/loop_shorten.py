"""loop-shorten: the same programs with their loops run fewer iterations.

Never a verdict by itself (reducing a trip count is not sound: `x = x` against `x = -x` is
equal after 2 steps, not after 3). Two uses in tv_ir.prover.loop_induction: a cheap concrete
run that pairs loop positions up (`shortened`, undone afterwards), and a place to look for a
counterexample of the whole programs when a loop body was refuted at some iteration
(`shortened_copy`; the counterexample is then replayed on the programs as they are).

Before:  stablehlo.while(%i = %c0, ...) cond {i < 126} ...
After:   stablehlo.while(%i = %c0, ...) cond {i < 18} ...   (first 18 iterations)
         stablehlo.while(%i = %c108, ...) cond {i < 126}   (last 18: a reversed scan)
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import numpy as np

from tv_ir.ir.program import Block, Function, Module, Op, Region, TensorType, Value

from .inline_calls import clone_block
from .loop_cut import LoopParts, with_main


@contextmanager
def shortened(module: Module, loops: list[LoopParts], trips: int):
    """Within the block, each of `module`'s `loops` runs at most `trips` iterations
    (`shorten`), for a concrete run that only pairs positions up (loop_induction) at a cost
    independent of the trip count."""
    block = module.main.body
    saved = [(p.loop.regions[0], list(p.loop.operands)) for p in loops]
    saved_ops = list(block.ops)
    try:
        shorten(block, loops, trips)
        yield
    finally:
        block.ops[:] = saved_ops
        for p, (region, operands) in zip(loops, saved, strict=True):
            p.loop.regions[0] = region
            p.loop.operands = operands


def shortened_copy(module: Module, loops: list[LoopParts], trips: int) -> Module:
    """A copy of `module` whose `loops` run at most `trips` iterations (`shorten`): where to
    look for a counterexample of the real programs, never a verdict by itself."""
    main = module.main
    block = clone_block(main.body, {})
    index = {id(op): n for n, op in enumerate(main.body.ops)}
    copies = [dataclasses.replace(p, loop=block.ops[index[id(p.loop)]]) for p in loops]
    shorten(block, copies, trips)
    fn = Function(
        main.name,
        block,
        list(main.result_types),
        [dict(a) for a in main.arg_attrs],
        [dict(a) for a in main.res_attrs],
        list(main.arg_names),
    )
    return with_main(module, fn, f"{module.source}, loops cut to {trips} iterations")


def shorten(block: Block, loops: list[LoopParts], trips: int) -> None:
    """Make each loop (a top-level op of `block`) run at most `trips` iterations: the first
    ones, or the last ones for a loop that walks its stacks backwards (a reversed scan
    reads the layers a forward scan wrote first)."""
    for p in loops:
        k = min(trips, p.trips)
        first = p.counter_start + (p.trips - k if backwards(p) else 0)
        t = p.loop.operands[p.counter].type
        start = _constant_op(first, t)
        block.ops.insert(block.ops.index(p.loop), start)
        p.loop.operands[p.counter] = start.results[0]
        args = [Value(v.type, v.name) for v in p.loop.operands]
        end = _constant_op(first + k, t)
        attrs = {"comparison_direction": "LT", "compare_type": "SIGNED"}
        lt = Op("stablehlo.compare", [args[p.counter], end.results[0]], [], attrs)
        lt.results = [Value(TensorType((), "i1"), None, lt, 0)]
        p.loop.regions[0] = Region(Block(args, [end, lt], lt.results))


def backwards(parts: LoopParts) -> bool:
    """Whether the loop walks its stacks from the last layer to the first."""
    orders = list(parts.layer_order.values())
    return bool(orders) and all(o[0] > o[-1] for o in orders)


def _constant_op(value: int, t: TensorType) -> Op:
    op = Op("stablehlo.constant", [], [], {"value": np.array(value, t.numpy_dtype)})
    op.results = [Value(t, None, op, 0)]
    return op
