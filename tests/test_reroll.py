"""Layers written as a Python `for` (unrolled when traced) rerolled into one loop
(passes/reroll.py), so loop induction proves the stack once, and a planted bug in one layer
still refuted at its line (the bug's layer is not merged into a loop)."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from programs import transformer as T
from tv_ir.passes.loop_cut import loop_parts, top_level_loops
from tv_ir.passes.reroll import reroll

import tv_ir
from tv_ir.pipeline import prepare
from tv_ir.prover.simulate import random_inputs, run_traced

LIMITS = dict(time_limit=300, memory_limit=3500)
BUG_LAYER = 4


@pytest.fixture(scope="module")
def mesh():
    return Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"))


def mlp_stack(layers: int, bug_layer: int | None = None):
    """Residual MLP layers, each with its own weights `(w1, w2)`, in a Python for."""

    def f(x, *ws):
        for i in range(layers):
            y = jax.nn.relu(x @ ws[2 * i]) @ ws[2 * i + 1] + x
            if i == bug_layer:
                y = y * 2.0  # BUG: one layer doubled
            x = y
        return x

    return f


def mlp_args(layers: int):
    shapes = [(8, 16)] + [s for _ in range(layers) for s in ((16, 32), (32, 16))]
    return [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]


def mlp_shardings(mesh, layers: int):
    specs = [P("data", None)] + [s for _ in range(layers) for s in (P(None, "model"), P("model"))]
    return tuple(NamedSharding(mesh, s) for s in specs)


def grad_of(f, nargs: int):
    return jax.grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=tuple(range(1, nargs)))


def lower(f, args, **shardings) -> str:
    return jax.jit(f, **shardings).lower(*args).as_text(debug_info=True)


def by_induction(report, loops: int) -> None:
    assert report.verdict == "equivalent", (report.reason, report.notes)
    assert report.stats.loops_by_induction == loops, report.notes


def bug_line() -> int:
    source, first = inspect.getsourcelines(mlp_stack)
    return first + next(k for k, line in enumerate(source) if "# BUG" in line)


# -- the pass ------------------------------------------------------------------------------


def test_reroll_gives_one_loop_over_the_layers_with_the_same_meaning():
    layers = 6
    module = prepare(lower(mlp_stack(layers), mlp_args(layers)), "spec", unroll=False)
    rolled, runs = reroll(module)
    assert [r.blocks for r in runs] == [layers]
    (loop,) = top_level_loops(rolled)
    parts = loop_parts(rolled, loop)
    assert parts.trips == layers
    assert parts.kinds.count("stacked_in") == 2  # w1 and w2, stacked from 6 arguments each
    assert not any(op.name == "stablehlo.while" for op in module.main.body.ops)  # untouched
    inputs = random_inputs(module.main, np.random.default_rng(0))
    before, after = run_traced(module, inputs), run_traced(rolled, inputs)
    np.testing.assert_allclose(
        after.values[rolled.main.body.results[0].id],
        before.values[module.main.body.results[0].id],
        rtol=1e-12,
    )
    # validated as a rewrite: the rerolled module proved equal to the one it came from
    report = tv_ir.check(module, rolled, **LIMITS)
    assert report.verdict == "equivalent", report.reason


def test_reroll_of_the_gradient_stacks_per_layer_outputs_and_walks_backwards():
    layers = 5
    grad = grad_of(mlp_stack(layers), 1 + 2 * layers)
    module = prepare(lower(grad, mlp_args(layers)), "spec", unroll=False)
    rolled, runs = reroll(module)
    loops = [loop_parts(rolled, op) for op in top_level_loops(rolled)]
    assert len(loops) == 3
    forward, backward, weights = loops
    assert "stacked_out" in forward.kinds  # activations the backward pass reads
    assert "stacked_out" in backward.kinds  # cotangents the weight gradients read
    assert all(o[0] > o[-1] for o in backward.layer_order.values())  # a reversed scan
    # the weight gradients (results, one per layer): independent blocks, no carry
    assert "carried" not in weights.kinds and "stacked_out" in weights.kinds
    report = tv_ir.check(module, rolled, **LIMITS)
    assert report.verdict == "equivalent", report.reason


def test_a_layer_that_differs_is_not_merged():
    """Layer 4 of 9 doubles its output: two runs around the doubling, which stays outside
    both loops (layer 4's other ops are alike, so they may close the first run)."""
    layers = 9
    module = prepare(lower(mlp_stack(layers, BUG_LAYER), mlp_args(layers)), "impl", unroll=False)
    rolled, runs = reroll(module)
    assert len(runs) == 2
    assert runs[0].blocks >= BUG_LAYER and runs[1].blocks == layers - BUG_LAYER - 1
    doubled = [op.name for op in rolled.main.body.ops if op.loc.line == bug_line()]
    assert "stablehlo.multiply" in doubled
    for loop in top_level_loops(rolled):
        assert all(op.loc.line != bug_line() for op in loop.regions[1].block.ops)


def test_fewer_than_three_alike_blocks_stay_as_they_are():
    module = prepare(lower(mlp_stack(2), mlp_args(2)), "spec", unroll=False)
    rolled, runs = reroll(module)
    assert runs == [] and rolled is module


# -- proved by induction -------------------------------------------------------------------


def test_python_for_mlp_jit_is_proved_by_induction():
    layers = 5

    def impl(x, *ws):  # the same stack, residual added first
        for i in range(layers):
            x = x + jnp.maximum(x @ ws[2 * i], 0.0) @ ws[2 * i + 1]
        return x

    args = mlp_args(layers)
    report = tv_ir.check(lower(mlp_stack(layers), args), lower(impl, args), **LIMITS)
    by_induction(report, loops=1)


def test_python_for_mlp_named_shardings_is_proved_by_induction(mesh):
    layers = 6
    args, sh = mlp_args(layers), mlp_shardings(mesh, layers)
    impl = lower(mlp_stack(layers), args, in_shardings=sh, out_shardings=sh[0])
    report = tv_ir.check(lower(mlp_stack(layers), args), impl, **LIMITS)
    by_induction(report, loops=1)


def test_python_for_mlp_gradient_named_shardings_is_proved_by_induction(mesh):
    """The forward layers, the backward layers (a reversed stack) and the weight gradients
    (results, one pair per layer; XLA computes them after the backward layers) are three
    loops, each body proved once."""
    layers = 6
    args, sh = mlp_args(layers), mlp_shardings(mesh, layers)
    grad = grad_of(mlp_stack(layers), len(args))
    impl = lower(grad, args, in_shardings=sh, out_shardings=sh[1:])
    report = tv_ir.check(lower(grad, args), impl, **LIMITS)
    by_induction(report, loops=3)


def transformer_shardings(mesh, layers: int):
    def spec(name, shape):
        dims = [None] * len(shape)
        if name in ("w1", "b1"):
            dims[-1] = "model"
        elif name == "w2":
            dims[0] = "model"
        return NamedSharding(mesh, P(*dims))

    per_layer = [spec(n, s) for _ in range(layers) for n, s in T.PARAM_SHAPES]
    return (NamedSharding(mesh, P()), *per_layer)


def test_python_for_transformer_fused_qkv_named_shardings_is_proved_by_induction(mesh):
    layers = 4
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in T.arg_shapes(layers)]
    sh = transformer_shardings(mesh, layers)
    impl = lower(T.stacked(layers, variant="fused_qkv"), args, in_shardings=sh, out_shardings=sh[0])
    report = tv_ir.check(T.lower(depth=layers), impl, **LIMITS)
    by_induction(report, loops=1)


def test_python_for_transformer_gradient_named_shardings_is_proved_by_induction(mesh):
    layers = 4
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in T.arg_shapes(layers)]
    sh = transformer_shardings(mesh, layers)
    impl = lower(T.stacked(layers, grad=True), args, in_shardings=sh, out_shardings=sh)
    report = tv_ir.check(T.lower(grad=True, depth=layers), impl, **LIMITS)
    by_induction(report, loops=3)  # forward, backward, the weight gradients XLA computes last


# -- bugs ----------------------------------------------------------------------------------


def test_bug_in_one_layer_is_refuted_at_its_line():
    layers = 9
    args = mlp_args(layers)
    report = tv_ir.check(
        lower(mlp_stack(layers), args), lower(mlp_stack(layers, BUG_LAYER), args), **LIMITS
    )
    assert report.verdict == "not_equivalent", report.reason
    assert report.location.impl.line == bug_line()


def test_bug_in_one_layer_named_shardings_is_refuted(mesh):
    layers = 9
    args, sh = mlp_args(layers), mlp_shardings(mesh, layers)
    impl = lower(mlp_stack(layers, BUG_LAYER), args, in_shardings=sh, out_shardings=sh[0])
    report = tv_ir.check(lower(mlp_stack(layers), args), impl, **LIMITS)
    assert report.verdict == "not_equivalent", report.reason
    assert report.counterexample is not None


def test_bug_in_every_layer_is_refuted():
    """The attention residual subtracted in every layer: the rerolled bodies differ."""
    layers = 4
    report = tv_ir.check(T.lower(depth=layers), T.lower("residual_sign", depth=layers), **LIMITS)
    assert report.verdict == "not_equivalent", report.reason
    assert report.location.impl.line == T.bug_line("residual_sign")
