"""Evaluate the ops of a block with an element algebra (concrete or symbolic): the machinery
shared by the one-program interpreter (`interp`) and the per-device ones (`spmd`).

Like JAX's `eval_jaxpr`: an environment from values to arrays, one table lookup per op.
A `hook` may observe (and replace) the results of each op of the top-level block; the prover
uses it to record simulations and to cut symbolic evaluation at proved values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

import numpy as np

from tv_ir.errors import TvError, Unsupported
from tv_ir.ir.program import Block, Function, Module, Op, TensorType
from tv_ir.limits import CHECK_EVERY, check_time
from tv_ir.semantics.algebra import NumpyAlgebra
from tv_ir.semantics.interpreters.invariant_ops import InvariantValues
from tv_ir.semantics.ops import OpContext, lookup
from tv_ir.semantics.ops.complex_numbers import COMPLEX_AWARE
from tv_ir.semantics.ops.registry import REGION_ON_ARRAYS

Hook = Callable[[Op, list], list]


class InterpreterError(TvError):
    """An evaluator failed on an op: a bug in tv (an internal error, exit 4)."""

    exit_code = 4


class BlockEvaluator:
    """Runs blocks op by op through the op table (one device, or one program)."""

    def __init__(self, module: Module, alg, hook: Hook | None = None, device=None):
        self.module = module
        self.alg = alg
        self.hook = hook
        self.device = device
        self.env: dict[int, object] = {}
        # a region's constant-derived values, made once (concrete runs only)
        self.invariants = InvariantValues() if type(alg) is NumpyAlgebra else None
        # id(op) -> (op, its evaluator, its context or None) for the ops of regions (a loop
        # body's: looked up once, not at every iteration); a top-level op runs once per run
        self._prepared: dict[int, tuple] = {}
        self._regions = 0  # how many regions are running (nested)
        # id(block) -> (block, its ops to run, their tape) for regions run whole before
        self._tapes: dict[int, tuple] = {}

    def run(self, fn: Function | None = None, args: list | None = None) -> list:
        fn = fn or self.module.main
        return self._block(fn.body, list(args or []), top=True)

    def call(self, name: str, args: list) -> list:
        fn = self.module.functions.get(name)
        if fn is None:
            raise Unsupported(f"call to unknown function @{name}", op="func.call")
        return self._block(fn.body, args, top=False)

    def _block(self, block: Block, args: list, top: bool) -> list:
        env = self.env
        if len(args) != len(block.args):
            raise InterpreterError(f"block takes {len(block.args)} arguments, got {len(args)}")
        for v, a in zip(block.args, args, strict=True):
            env[v.id] = a
        fixed = self.invariants.of(block, top) if self.invariants is not None else None
        ops = self.invariants.to_run(block) if fixed else block.ops
        if not top:
            self._regions += 1
        try:
            # a region run whole before: its tape (unless evaluate_op is observed: the prover)
            if fixed and ops is not block.ops and "evaluate_op" not in self.__dict__:
                self._run_tape(self._tape(block, ops))
                return [env[v.id] for v in block.results]
            for k, op in enumerate(ops):
                if not k & CHECK_EVERY:  # the limits, polled every few ops
                    check_time()
                if fixed and id(op) in fixed:
                    results = self.invariants.results(op, self.evaluate_op)
                else:
                    results = self.evaluate_op(op)
                if top and self.hook is not None:
                    results = self.hook(op, results)
                for v, r in zip(op.results, results, strict=True):
                    env[v.id] = r
        finally:
            if not top:
                self._regions -= 1
        if fixed:
            self.invariants.ran(block, fixed)
        return [env[v.id] for v in block.results]

    def _tape(self, block: Block, ops: list[Op]) -> list[tuple]:
        """`ops` (a region's ops still to evaluate at each run) as a tape: per op, what
        `evaluate_op` looks up (`_prepared_op`; None for an op a subclass evaluates its own
        way) and its operand and result ids, looked up once (a loop body runs once per
        iteration)."""
        known = self._tapes.get(id(block))
        if known is not None and known[0] is block and known[1] is ops:
            return known[2]
        own = type(self).own_evaluation
        tape = [
            (
                op,
                None if own(op) else self._prepared_op(op),
                tuple(v.id for v in op.operands),
                tuple(v.id for v in op.results),
            )
            for op in ops
        ]
        self._tapes[id(block)] = (block, ops, tape)
        return tape

    def _run_tape(self, tape: list[tuple]) -> None:
        """Evaluate a region's tape on the environment: `evaluate_op` op by op, with what
        it looks up already looked up (the same evaluators, contexts and result checks)."""
        env = self.env
        for k, (op, prepared, ins, outs) in enumerate(tape):
            if not k & CHECK_EVERY:  # the limits, polled every few ops
                check_time()
            if prepared is None:
                results = self.evaluate_op(op)
            else:
                _, fn, ctx = prepared
                operands = [env[i] for i in ins]
                if ctx is None:  # an op that runs regions or calls
                    ctx = self.context(op)
                try:
                    out = fn(ctx, *operands)
                except Exception as e:
                    raise_attributed(op, e)
                results = checked_results(op, out)
            for vid, r in zip(outs, results, strict=True):
                env[vid] = r

    @staticmethod
    def own_evaluation(op: Op) -> bool:
        """Whether this evaluator evaluates `op` other than through the op table (a
        subclass's `evaluate_op` special cases; none here)."""
        return False

    def evaluate_op(self, op: Op) -> list:
        """The results of `op` on the current environment."""
        _, fn, ctx = self._prepared_op(op)
        operands = [self.env[v.id] for v in op.operands]
        if ctx is None:  # an op that runs regions or calls: a context bound to this evaluator
            ctx = self.context(op)
        return checked_results(op, run_evaluator(op, lambda: fn(ctx, *operands)))

    def _prepared_op(self, op: Op) -> tuple:
        """(op, its evaluator, its fixed context or None), kept for the ops of regions (a
        loop body's: looked up once, not at every iteration)."""
        known = self._prepared.get(id(op)) if self._regions else None
        if known is None or known[0] is not op:
            fn = lookup(op.name, op.loc)
            refuse_complex(op)
            known = (op, fn, self._fixed_context(op))
            if self._regions:
                self._prepared[id(op)] = known
        return known

    def _fixed_context(self, op: Op) -> OpContext | None:
        """The context of an op that runs no region and calls nothing, made once; None for
        the others (their context refers back to this evaluator, so it is made per call:
        kept, it would hold the evaluator and its values in a reference cycle)."""
        if op.regions or op.name in _CALLS:
            return None
        return _op_context(op, self.alg, self.device, run_region=_no_region)

    def context(self, op: Op) -> OpContext:
        """What an evaluator of `op` sees; its regions run in this interpreter."""
        return _op_context(
            op,
            self.alg,
            self.device,
            run_region=lambda i, args, op=op: self._block(op.regions[i].block, args, top=False),
            call=self.call,
            run_numeric=lambda i, args, op=op: self._numeric()._block(
                op.regions[i].block, args, top=False
            ),
        )

    def _numeric(self) -> BlockEvaluator:
        """This evaluator's twin on numbers (the same module and device)."""
        return BlockEvaluator(self.module, NumpyAlgebra(), device=self.device)


# ops whose evaluators call a module function (OpContext.call)
_CALLS = frozenset(("func.call", "stablehlo.composite", "stablehlo.custom_call"))


def _op_context(op: Op, alg, device, **bound) -> OpContext:
    """`op`'s context with `bound` (how its regions run, how it calls a function)."""
    return OpContext(
        name=op.name,
        attrs=op.attrs,
        operand_types=[v.type for v in op.operands],
        result_types=[v.type for v in op.results],
        alg=alg,
        regions=op.regions,
        device=device,
        loc=op.loc,
        **bound,
    )


def _no_region(i: int, args: list) -> list:
    raise InterpreterError("an op without regions ran a region")


def refuse_complex(op: Op) -> None:
    """Ops that do not know complex numbers never see one: numpy would quietly drop
    imaginary parts, terms have none (tv_ir.semantics.ops.complex_numbers)."""
    if op.name in COMPLEX_AWARE:
        return
    for v in (*op.operands, *op.results):
        if getattr(v.type, "is_complex", False):
            raise Unsupported(f"{op.name} on complex values ({v.type})", op=op.name, loc=op.loc)


def run_evaluator(op: Op, evaluate: Callable[[], object]) -> object:
    """Run an evaluator of `op`, attributing failures to the op (name, location)."""
    try:
        return evaluate()
    except Exception as e:
        raise_attributed(op, e)


def raise_attributed(op: Op, e: Exception) -> NoReturn:
    """Raise an evaluator's failure on `op` (call it from the handler): tv's own errors as
    they are (an `Unsupported` given the op's name and location if it has none), any other
    as an `InterpreterError` naming the op (an evaluator bug or a violated precondition)."""
    if isinstance(e, Unsupported):
        if e.loc is None:
            e.loc = op.loc
        if e.op is None:
            e.op = op.name
        raise e
    if isinstance(e, TvError | MemoryError | RecursionError):
        raise e
    raise InterpreterError(
        f"evaluating {op.name} at {op.loc} failed: {type(e).__name__}: {e}"
    ) from e


def checked_results(op: Op, out) -> list:
    """An evaluator's output as a list of results checked against the op's result types."""
    if not isinstance(out, list):
        out = [out]
    return [_shaped(r, v.type) for r, v in zip(out, op.results, strict=True)]


def _shaped(r, t):
    """Check an evaluator's result against the op's declared type."""
    if type(r) is np.ndarray and type(t) is TensorType and r.shape == t.shape:
        if r.dtype == t.numpy_dtype:
            return r  # the common case, checked first: as declared
    if isinstance(r, tuple) or not hasattr(t, "shape"):
        return r
    r = np.asarray(r)
    if r.shape != tuple(t.shape) and not (t.shape == () and REGION_ON_ARRAYS.get()):
        raise InterpreterError(f"result shape {r.shape} does not match declared {t}")
    if r.dtype != object and r.dtype != np.dtype(t.numpy_dtype):
        r = r.astype(t.numpy_dtype)
    elif r.dtype == object and t.is_integer:  # terms: reduce to the type's machine range
        from tv_ir.semantics.symbolic import machine_integers

        r = machine_integers(r, t)
    return r
