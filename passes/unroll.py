"""Unroll `while` loops whose trip count is fixed (`jax.lax.scan`, `fori_loop`).

Before:  %r:2 = stablehlo.while(%i = %c0, %h = %x) cond {i < 4} do {body}
After:   the body's ops, four times, in the enclosing block; `%r` reads the last copy.

The prover cuts at the ops of the top-level block (and of shard_map bodies); an op inside a
loop body is evaluated afresh on every iteration, so the terms of a scan over layers grow
with every layer. Unrolled, each layer's values are cut-points like any others, and the cost
grows linearly with the number of layers. A loop is unrolled when its condition can be
decided from the values known before it runs (constants, and what the loop computes from
them alone: the counter); the trip count is found by running the condition and the body on
those known values. Loops in other nested regions, and loops whose trip count depends on
the inputs, are left to the interpreter.
"""

from __future__ import annotations

import numpy as np

from tv_ir.ir.program import Block, Module, Op, Value
from tv_ir.limits import OutOfTime, check_time
from tv_ir.semantics.algebra import NumpyAlgebra
from tv_ir.semantics.interpreters.interp import Interpreter
from tv_ir.semantics.ops.registry import COLLECTIVES, GLOBAL_VIEW, PROCESS_OPS

from .inline_calls import _rename_in_regions, clone_block

MAX_TRIPS = 4096
MAX_UNROLLED_OPS = 200_000  # body ops x trip count, per loop
MAX_FOLD_ELEMENTS = 4096  # known values larger than this are not tracked
NOT_FOLDED = set(COLLECTIVES) | set(PROCESS_OPS) | set(GLOBAL_VIEW)


def unroll_static_loops(module: Module) -> Module:
    """Unroll fixed-trip-count loops in @main and in its top-level shard_map bodies."""
    interp = Interpreter(module, NumpyAlgebra())
    known: dict[int, np.ndarray] = {}
    main = module.main
    main.body = _unroll_block(interp, main.body, known)
    for op in main.body.ops:
        if op.name == "sdy.manual_computation":
            for region in op.regions:
                region.block = _unroll_block(interp, region.block, known)
    return module


def _unroll_block(interp: Interpreter, block: Block, known: dict) -> Block:
    ops: list[Op] = []
    rename: dict[int, Value] = {}
    for op in block.ops:
        op.operands = [rename.get(v.id, v) for v in op.operands]
        _rename_in_regions(op, rename)
        if op.name == "stablehlo.while":
            copies = _unrolled(interp, op, known)
            if copies is not None:
                body_ops, results = copies
                ops.extend(body_ops)
                for r, v in zip(op.results, results, strict=True):
                    rename[r.id] = v
                continue
        _fold(interp, op, known)
        ops.append(op)
    return Block(block.args, ops, [rename.get(v.id, v) for v in block.results])


def _unrolled(interp: Interpreter, loop: Op, known: dict):
    """(the body's ops, once per iteration; the final values), or None if not static."""
    trips = _trip_count(interp, loop, known)
    body = loop.regions[1].block
    if trips is None or trips * max(1, len(body.ops)) > MAX_UNROLLED_OPS:
        return None
    current = list(loop.operands)
    ops: list[Op] = []
    for _ in range(trips):
        check_time()
        copy = clone_block(body, {a.id: v for a, v in zip(body.args, current, strict=True)})
        copy = _unroll_block(interp, copy, known)  # nested loops, and folds the counter
        ops.extend(copy.ops)
        current = list(copy.results)
    return ops, current


def _trip_count(interp: Interpreter, loop: Op, known: dict) -> int | None:
    cond, body = loop.regions[0].block, loop.regions[1].block
    state = [known.get(v.id) for v in loop.operands]
    for trips in range(MAX_TRIPS + 1):
        check_time()
        go = _evaluate(interp, cond, state, known)[0]
        if go is None:
            return None
        if not bool(np.asarray(go).reshape(())):
            return trips
        state = _evaluate(interp, body, state, known)
    return None


def _evaluate(interp: Interpreter, block: Block, args: list, known: dict) -> list:
    """The block's results where they follow from known values (None elsewhere)."""
    env = dict(known)
    for a, x in zip(block.args, args, strict=True):
        if x is not None:
            env[a.id] = x
    for op in block.ops:
        for r, x in zip(op.results, _try(interp, op, env), strict=True):
            if x is not None:
                env[r.id] = x
    return [env.get(v.id) for v in block.results]


def _fold(interp: Interpreter, op: Op, known: dict) -> None:
    for r, x in zip(op.results, _try(interp, op, known), strict=True):
        if x is not None:
            known[r.id] = x


def _try(interp: Interpreter, op: Op, env: dict) -> list:
    """The op's results if all its operands are known and it is a plain computation."""
    none = [None] * len(op.results)
    if op.name in NOT_FOLDED or op.regions or any(v.id not in env for v in op.operands):
        return none
    if any(int(np.prod(getattr(r.type, "shape", ()))) > MAX_FOLD_ELEMENTS for r in op.results):
        return none
    for v in op.operands:
        interp.env[v.id] = env[v.id]
    try:
        out = interp.evaluate_op(op)
    except (OutOfTime, RecursionError):
        raise
    except Exception:  # an op the folder cannot run: its results stay unknown
        return none
    return [x if isinstance(x, np.ndarray) else None for x in out]


def known_values(interp: Interpreter, block: Block, args: dict[int, np.ndarray]) -> dict:
    """Every value of `block` that follows from `args` (by value id) and its constants."""
    env = dict(args)
    for op in block.ops:
        for r, x in zip(op.results, _try(interp, op, env), strict=True):
            if x is not None:
                env[r.id] = x
    return env


def known_operands(module: Module, loop: Op) -> list:
    """The values `loop` (a top-level op of @main) starts from, where they fold to
    constants (None elsewhere)."""
    interp = Interpreter(module, NumpyAlgebra())
    known: dict[int, np.ndarray] = {}
    for op in module.main.body.ops:
        if op is loop:
            return [known.get(v.id) for v in loop.operands]
        _fold(interp, op, known)
    return [None for _ in loop.operands]
