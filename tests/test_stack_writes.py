"""A stack written layer by layer by an unrolled scan holds one copy, not one per layer
(passes/stack_writes.py), and means what it meant."""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
from tv_ir.passes import stack_writes

import tv_ir
from tv_ir.ir.program import elements, walk
from tv_ir.pipeline import _unrolled, prepare
from tv_ir.semantics.interpreters.interp import evaluate


def sds(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def scan_step(w, x):
    """An SGD step of a tanh stack as a scan: the forward stacks its inputs for the
    backward, which stacks the weight gradients."""

    def loss(w, x):
        y, _ = jax.lax.scan(lambda c, wi: (jnp.tanh(c @ wi), None), x, w)
        return jnp.sum(y * y)

    value, grad = jax.value_and_grad(loss)(w, x)
    return w - 0.1 * grad, value


def unrolled_without_the_pass(text: str, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(stack_writes, "run", lambda module: module)
        return _unrolled(prepare(text, "spec", unroll=False))


def count(module, name: str) -> int:
    return sum(1 for op in walk(module.main.body) if op.name == f"stablehlo.{name}")


def test_stacks_written_by_layer_are_one_copy_and_mean_the_same(monkeypatch):
    layers = 6
    text = jax.jit(scan_step).lower(sds(layers, 4, 4), sds(2, 4)).as_text(debug_info=True)
    before = unrolled_without_the_pass(text, monkeypatch)
    after = stack_writes.run(copy.deepcopy(before))
    assert count(before, "dynamic_update_slice") >= 2 * layers  # forward and backward stacks
    assert count(after, "dynamic_update_slice") == 0  # reads forwarded, stacks concatenated
    assert count(after, "concatenate") >= 1  # the weight gradients leave as one stack
    assert elements(after) < elements(before)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((layers, 4, 4)), rng.standard_normal((2, 4))]
    for got, want in zip(evaluate(after, args), evaluate(before, args), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_partly_written_stack_is_left_whole():
    """Layers 0 and 2 of 3 written: the stack is not a concatenation of its writes, a read
    of layer 1 reads the stack's initial value, and a read of layer 2 the write."""

    def f(s, u):
        s = jax.lax.dynamic_update_index_in_dim(s, u, 0, 0)
        s = jax.lax.dynamic_update_index_in_dim(s, 2 * u, 2, 0)
        return s, jax.lax.dynamic_index_in_dim(s, 1, 0), jax.lax.dynamic_index_in_dim(s, 2, 0)

    text = jax.jit(f).lower(sds(3, 2), sds(2)).as_text(debug_info=True)
    module = prepare(text, "spec")
    after = stack_writes.run(copy.deepcopy(module))
    assert count(after, "dynamic_update_slice") == 2 and count(after, "concatenate") == 0
    assert count(after, "dynamic_slice") == count(module, "dynamic_slice") - 1
    args = [np.arange(6.0).reshape(3, 2), np.array([7.0, 8.0])]
    for got, want in zip(evaluate(after, args), evaluate(module, args), strict=True):
        np.testing.assert_array_equal(got, want)


def test_scanned_step_still_proved_and_refuted():
    args = (sds(6, 4, 4), sds(2, 4))
    spec = jax.jit(scan_step).lower(*args).as_text(debug_info=True)

    def buggy(w, x):
        new, value = scan_step(w, x)
        return new.at[3].add(1e-3), value  # one layer's update off

    impl = jax.jit(buggy).lower(*args).as_text(debug_info=True)
    assert tv_ir.check(spec, spec, time_limit=120).verdict == "equivalent"
    assert tv_ir.check(spec, impl, time_limit=120).verdict == "not_equivalent"


def test_complex_scalars_are_not_folded_as_integers():
    # XLA's partitioned FFT computes complex scalar constants (twiddle factors); the fold of
    # known scalar integers must leave them alone, not crash on int(complex)
    text = """
    func.func @main(%x: tensor<3xcomplex<f32>>) -> tensor<3xcomplex<f32>> {
      %c = stablehlo.constant dense<(0.5, 0.25)> : tensor<complex<f32>>
      %cc = stablehlo.multiply %c, %c : tensor<complex<f32>>
      %b = stablehlo.broadcast_in_dim %cc, dims = []
        : (tensor<complex<f32>>) -> tensor<3xcomplex<f32>>
      %y = stablehlo.multiply %x, %b : tensor<3xcomplex<f32>>
      return %y : tensor<3xcomplex<f32>>
    }"""
    module = stack_writes.run(tv_ir.load(text))
    x = np.array([1, 2j, -1], np.complex64)
    (out,) = evaluate(module, [x])
    np.testing.assert_allclose(np.asarray(out), x * (0.5 + 0.25j) ** 2, rtol=1e-6)
