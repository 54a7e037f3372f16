"""IR passes: what each one merges, inlines or leaves alone."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tv_ir.pipeline import prepare

X = np.ones((4, 8), np.float32)
W = np.ones((8, 8), np.float32)


def _ops(f, *args) -> list[str]:
    module = prepare(jax.jit(f).lower(*args).as_text(), "m")
    return [op.name for op in module.main.body.ops]


def test_cse_merges_a_repeated_forward_pass():
    def loss(w, x):
        return jnp.mean(jax.nn.relu(x @ w) ** 2)

    def step(w, x):  # the grad's forward pass and the loss compute x @ w twice
        return jax.grad(loss)(w, x), loss(w, x)

    names = _ops(step, W, X)
    # x @ w once (the forward pass), plus the two products of the backward pass
    assert names.count("stablehlo.dot_general") == 2


def test_cse_keeps_ops_that_are_not_pure():
    text = """
    func.func @main(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
      %0 = stablehlo.custom_call @kernel(%x) : (tensor<4xf32>) -> tensor<4xf32>
      %1 = stablehlo.custom_call @kernel(%x) : (tensor<4xf32>) -> tensor<4xf32>
      %2 = stablehlo.abs %x : tensor<4xf32>
      %3 = stablehlo.abs %x : tensor<4xf32>
      %4 = stablehlo.add %0, %2 : tensor<4xf32>
      %5 = stablehlo.add %1, %3 : tensor<4xf32>
      return %4, %5 : tensor<4xf32>, tensor<4xf32>
    }"""
    names = [op.name for op in prepare(text, "m").main.body.ops]
    assert names.count("stablehlo.custom_call") == 2  # a kernel call may have effects
    assert names.count("stablehlo.abs") == 1
    assert names.count("stablehlo.add") == 2  # their operands differ


def test_cse_merges_identical_constants_and_elementwise_ops():
    names = _ops(lambda x: (x * 2.0 + 1.0, x * 2.0 + 1.0), X)
    assert names.count("stablehlo.multiply") == 1 and names.count("stablehlo.add") == 1


def _scan_pair(layers: int):
    def layer(h, w):
        return jnp.tanh(h @ w), None

    def scanned(ws, x):
        return jnp.sum(jax.lax.scan(layer, x, ws)[0] ** 2)

    def unrolled(ws, x):
        for i in range(ws.shape[0]):
            x = jnp.tanh(x @ ws[i])
        return jnp.sum(x**2)

    ws, x = np.ones((layers, 8, 8), np.float32), np.ones((4, 8), np.float32)
    lower = lambda f: jax.jit(jax.grad(f)).lower(ws, x).as_text(debug_info=True)  # noqa: E731
    return lower(unrolled), lower(scanned)


def test_scan_over_layers_is_unrolled_and_proved_per_layer():
    import tv_ir

    spec, impl = _scan_pair(8)
    assert "stablehlo.while" in impl
    names = [op.name for op in prepare(impl, "impl").main.body.ops]
    assert "stablehlo.while" not in names  # fixed trip count: unrolled
    r = tv_ir.check(spec, impl, time_limit=120)
    assert r.verdict == "equivalent", str(r)
    small = tv_ir.check(*_scan_pair(2), time_limit=120)
    assert r.stats.stages >= 3 * small.stats.stages  # cut-points in every layer


def test_loops_with_input_dependent_trip_counts_stay_loops():
    def halve_until_small(x):
        return jax.lax.while_loop(lambda v: jnp.max(v) > 1.0, lambda v: v / 2, x)

    names = _ops(halve_until_small, np.ones(4, np.float32))
    assert "stablehlo.while" in names
