"""A loop body's constant-derived ops are evaluated once per concrete run, not once per
iteration, with the same results (tv_ir/semantics/interpreters/invariant_ops.py)."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import tv_ir
from tv_ir.ir.program import walk
from tv_ir.semantics.algebra import NumpyAlgebra
from tv_ir.semantics.interpreters import invariant_ops
from tv_ir.semantics.interpreters.evaluator import BlockEvaluator
from tv_ir.semantics.interpreters.interp import Interpreter

TRIPS = 7


def scaled_steps(x):
    """A loop whose body broadcasts constants (what a layer loop's body is full of)."""

    def body(i, v):
        bias = jnp.arange(4.0) * 0.5  # iota, constant, multiply: the same every iteration
        return v * 1.5 + bias + i.astype(v.dtype)  # reads the counter: not constant-derived

    return jax.lax.fori_loop(0, TRIPS, body, x)


def constants(module) -> int:
    return sum(
        op.name == "stablehlo.constant" for fn in module.functions.values() for op in walk(fn.body)
    )


def counted_runs(module, args, monkeypatch) -> tuple[list, int]:
    """The run's outputs and how many times a constant op was evaluated."""
    count = [0]
    real = BlockEvaluator.evaluate_op

    def counting(self, op):
        if op.name == "stablehlo.constant":
            count[0] += 1
        return real(self, op)

    monkeypatch.setattr(BlockEvaluator, "evaluate_op", counting)
    return Interpreter(module, NumpyAlgebra()).run(args=args), count[0]


def test_constants_in_a_loop_body_are_evaluated_once(monkeypatch) -> None:
    x = np.arange(4.0, dtype=np.float32)
    module = tv_ir.load(jax.jit(scaled_steps).lower(x).as_text())
    once, n_once = counted_runs(module, [x], monkeypatch)
    monkeypatch.setattr(invariant_ops, "constant_derived", lambda block: frozenset())
    again, n_each = counted_runs(module, [x], monkeypatch)
    np.testing.assert_array_equal(once[0], again[0])
    np.testing.assert_allclose(once[0], np.asarray(scaled_steps(x)), rtol=1e-6)
    assert n_once == constants(module)  # each constant op once, in or out of the loop
    assert n_each >= constants(module) + TRIPS  # without it, again at every iteration


def test_what_reads_the_loop_state_is_not_kept() -> None:
    x = np.arange(4.0, dtype=np.float32)
    module = tv_ir.load(jax.jit(scaled_steps).lower(x).as_text())
    loop = next(op for op in walk(module.main.body) if op.name == "stablehlo.while")
    body = loop.regions[1].block
    kept = invariant_ops.constant_derived(body)
    reads_state = {id(op) for op in body.ops if any(v in body.args for v in op.operands)}
    assert kept and not kept & reads_state
    assert all(op.name in invariant_ops.PURE for op in body.ops if id(op) in kept)


def test_kept_values_are_read_only() -> None:
    values = invariant_ops.InvariantValues()

    class FakeOp:
        pass

    op = FakeOp()
    out = values.results(op, lambda _: [np.zeros(3)])
    assert values.results(op, lambda _: pytest.fail("evaluated twice")) is out
    with pytest.raises(ValueError):
        out[0][0] = 1.0  # an evaluator writing into a kept value fails loudly


def test_a_shard_map_loop_keeps_its_constants_on_every_device(monkeypatch) -> None:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("d",))

    @partial(jax.shard_map, mesh=mesh, in_specs=P("d"), out_specs=P("d"))
    def per_device(x):
        return jax.lax.psum(scaled_steps(x), "d")

    x = np.arange(16.0, dtype=np.float32)
    module = tv_ir.load(jax.jit(per_device).lower(x).as_text())
    (once,), n_once = counted_runs(module, [x], monkeypatch)
    monkeypatch.setattr(invariant_ops, "constant_derived", lambda block: frozenset())
    (again,), n_each = counted_runs(module, [x], monkeypatch)
    np.testing.assert_array_equal(once, again)
    np.testing.assert_allclose(once, np.asarray(jax.jit(per_device)(x)), rtol=1e-6)
    assert n_once == constants(module)  # once, for all devices
    assert n_each >= constants(module) + TRIPS


@pytest.mark.parametrize("devices", [1, 4])
def test_after_the_first_iteration_kept_ops_are_not_visited(monkeypatch, devices) -> None:
    """Their values stay in the environment (each value is written by its op alone), so
    later iterations go over the body's other ops only: each kept op is looked at once."""
    x = np.arange(4.0 * devices, dtype=np.float32)
    fn = scaled_steps
    if devices > 1:
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("d",))
        fn = jax.shard_map(
            lambda v: jax.lax.psum(scaled_steps(v), "d"),
            mesh=mesh,
            in_specs=P("d"),
            out_specs=P("d"),
        )
    module = tv_ir.load(jax.jit(fn).lower(x).as_text())
    looked_at: list[int] = []
    real = invariant_ops.InvariantValues.results

    def counting(self, op, evaluate):
        looked_at.append(id(op))
        return real(self, op, evaluate)

    monkeypatch.setattr(invariant_ops.InvariantValues, "results", counting)
    (out,) = Interpreter(module, NumpyAlgebra()).run(args=[x])
    np.testing.assert_allclose(out, np.asarray(jax.jit(fn)(x)), rtol=1e-6)
    loop = next(op for op in walk(module.main.body) if op.name == "stablehlo.while")
    kept = invariant_ops.constant_derived(loop.regions[1].block)
    assert kept and set(looked_at) >= kept
    assert len(looked_at) == len(set(looked_at))  # each once, not once per iteration
