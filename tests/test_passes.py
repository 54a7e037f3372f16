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
