"""Evaluate a tv_ir program read as one computation, with an element algebra (concrete or
symbolic). A shard_map region in it (`sdy.manual_computation`) is what the mesh's devices
compute in lockstep (tv_ir.semantics.interpreters.spmd)."""

from __future__ import annotations

import numpy as np

from tv_ir.errors import TvError, Unsupported
from tv_ir.ir.program import Function, Module, Op
from tv_ir.semantics.closeness import close
from tv_ir.semantics.interpreters.evaluator import (  # noqa: F401 (re-exported: the interpreter's public names)
    BlockEvaluator,
    Hook,
    InterpreterError,
    checked_results,
    run_evaluator,
)
from tv_ir.semantics.interpreters.spmd import SpmdInterpreter, device_name, mesh_size
from tv_ir.semantics.ops import COLLECTIVES


class Interpreter(BlockEvaluator):
    """The one-program interpreter: a shard_map region runs on every device of its mesh."""

    @staticmethod
    def own_evaluation(op: Op) -> bool:
        return op.name == "sdy.manual_computation" or op.name in COLLECTIVES

    def evaluate_op(self, op: Op) -> list:
        if op.name == "sdy.manual_computation" and self.device is None:
            return self._manual_computation(op)
        if op.name in COLLECTIVES and self.device is None and _one_process(self.module):
            # a program of one process: its collectives are over that process alone
            operands = [self.env[v.id] for v in op.operands]
            return SpmdInterpreter(self.module, self.alg, 1, 1).run_op(op, [operands])[0]
        return super().evaluate_op(op)

    def _manual_computation(self, op: Op) -> list:
        """A shard_map region in a program read as one computation: its global value is what
        the mesh's devices compute in lockstep from their pieces of the operands.

        A box that several devices compute (a manual axis the out_sharding leaves out) has
        one value only if their copies agree: JAX hands the user device 0's copy
        (`np.asarray(result)`), the other devices keep their own. So device 0's copy is
        the value, and every other copy must equal it: numbers to float64 noise, terms in
        normal form. Otherwise the region computes no single value and the construct is
        unsupported (the verdict `unknown`, naming the device), never assumed."""
        n = mesh_size(self.module, op)
        spmd = SpmdInterpreter(self.module, self.alg, 1, n)
        operands = [self.env[v.id] for v in op.operands]
        per_device = spmd.run_op(op, [list(operands) for _ in range(n)])
        for rep in spmd.replicas:
            for d, copy in zip(rep.devices[1:], rep.values[1:], strict=True):
                if not _copies_agree(rep.values[0], copy):
                    raise Unsupported(
                        f"result {rep.result} of {op.name} is claimed replicated by its "
                        "out_sharding, but the "
                        f"copy of box {[list(b) for b in rep.box]} on "
                        f"{device_name(self.module, d, n)} "
                        f"{'differs from' if _concrete(copy) else 'is not equal in normal form to'}"
                        f" the copy on {device_name(self.module, rep.devices[0], n)}: "
                        "the region has no single global value",
                        loc=op.loc,
                    )
        return per_device[0]


def _one_process(module: Module) -> bool:
    attrs = module.attrs
    return (
        int(attrs.get("mhlo.num_replicas", 1)) == 1
        and int(attrs.get("mhlo.num_partitions", 1)) == 1
    )


def _concrete(a) -> bool:
    return np.asarray(a).dtype != object


def _copies_agree(a, b) -> bool:
    """Two copies of a replicated box agree: to float64 noise, or in normal form."""
    if _concrete(a) and _concrete(b):
        return close(a, b)
    from tv_ir.semantics import terms as T

    for x, y in zip(np.asarray(a).flat, np.asarray(b).flat, strict=True):
        try:
            if isinstance(x, T.Bool) or isinstance(y, T.Bool):
                if T.lift_bool(x) is not T.lift_bool(y):
                    return False
            elif T.lift(x) != T.lift(y):
                return False
        except TvError:
            return False
    return True


def evaluate(module: Module, args: list, alg=None, fn: Function | None = None) -> list:
    """Run `fn` (default: main) on concrete numpy inputs."""
    from tv_ir.semantics.algebra import NumpyAlgebra

    return Interpreter(module, alg or NumpyAlgebra()).run(fn, args)
