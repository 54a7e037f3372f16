"""A loop body that has run whole once is evaluated from a tape (its ops' evaluators,
contexts and batch plans looked up once), with the same results and the same error
attribution as op by op (tv_ir/semantics/interpreters/evaluator.py, spmd.py)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import tv_ir
from tv_ir.semantics.algebra import NumpyAlgebra
from tv_ir.semantics.interpreters import evaluator as evaluator_module
from tv_ir.semantics.interpreters.evaluator import BlockEvaluator, InterpreterError
from tv_ir.semantics.interpreters.interp import Interpreter
from tv_ir.semantics.interpreters.spmd import SpmdInterpreter

TRIPS = 6


def steps(x):
    def body(i, v):
        return jnp.tanh(v * 1.5 + i.astype(v.dtype)) + jnp.sum(v) / 8.0

    return jax.lax.fori_loop(0, TRIPS, body, x)


def module_of(fn, x):
    return tv_ir.load(jax.jit(fn).lower(x).as_text())


def test_a_loop_body_runs_from_its_tape_after_the_first_iteration(monkeypatch) -> None:
    x = np.linspace(-1.0, 1.0, 8, dtype=np.float32)
    module = module_of(steps, x)
    seen: list[str] = []
    real = BlockEvaluator.evaluate_op
    monkeypatch.setattr(
        BlockEvaluator, "evaluate_op", lambda self, op: seen.append(op.name) or real(self, op)
    )
    taped = [0]
    real_tape = BlockEvaluator._run_tape

    def counting(self, tape):
        taped[0] += any(entry[0].name == "stablehlo.tanh" for entry in tape)
        return real_tape(self, tape)

    monkeypatch.setattr(BlockEvaluator, "_run_tape", counting)
    (out,) = Interpreter(module, NumpyAlgebra()).run(args=[x])
    np.testing.assert_allclose(out, np.asarray(jax.jit(steps)(x)), rtol=1e-6)
    assert taped[0] == TRIPS - 1  # the body, at every iteration after the first
    # the body's tanh looked up op by op once (the first iteration), from the tape after
    assert seen.count("stablehlo.tanh") == 1


def test_a_failure_inside_a_tape_names_the_op(monkeypatch) -> None:
    x = np.ones(8, dtype=np.float32)
    module = module_of(steps, x)
    real_lookup = evaluator_module.lookup
    calls = [0]

    def failing_tanh(ctx, v):
        calls[0] += 1
        if calls[0] > 2:  # past the first iteration: inside the tape
            raise ValueError("boom")
        return np.tanh(v)

    def lookup(name, loc):
        return failing_tanh if name == "stablehlo.tanh" else real_lookup(name, loc)

    monkeypatch.setattr(evaluator_module, "lookup", lookup)
    with pytest.raises(InterpreterError, match=r"evaluating stablehlo.tanh at .* ValueError: boom"):
        Interpreter(module, NumpyAlgebra()).run(args=[x])
    assert calls[0] == 3


def test_a_device_batched_loop_runs_from_its_tape(monkeypatch) -> None:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("d",))
    fn = jax.shard_map(
        lambda v: jax.lax.psum(steps(v), "d"), mesh=mesh, in_specs=P("d"), out_specs=P("d")
    )
    x = np.linspace(-2.0, 2.0, 32, dtype=np.float32)
    module = module_of(fn, x)
    taped = [0]
    real_tape = SpmdInterpreter._run_tape

    def counting(self, tape, envs):
        taped[0] += any(entry[0].name == "stablehlo.tanh" for entry in tape)
        return real_tape(self, tape, envs)

    monkeypatch.setattr(SpmdInterpreter, "_run_tape", counting)
    (out,) = Interpreter(module, NumpyAlgebra()).run(args=[x])
    np.testing.assert_allclose(out, np.asarray(jax.jit(fn)(x)), rtol=1e-5)
    assert taped[0] == TRIPS - 1


def test_element_operations_stay_quiet_and_leave_numpys_error_state() -> None:
    alg = NumpyAlgebra()
    before = np.geterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning would fail here
        out = alg.divide(np.array([1.0, 0.0, -1.0]), np.zeros(3))
        big = alg.multiply(np.array([1e308]), np.array([10.0]))
    assert np.isinf(out[0]) and np.isnan(out[1]) and out[2] == -np.inf and np.isinf(big[0])
    assert np.geterr() == before
