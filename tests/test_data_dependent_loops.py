"""Loops whose trip count depends on the inputs (`jax.lax.while_loop` on values): the same
loop in both programs is proved whatever it computes, and however many times it goes round
on each device; a different loop is refuted or left unknown, never proved
(tv_ir/semantics/ops/control.py, `opaque_loop`; docs/equivalence.md)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tv_ir.frontends.jax import verify

import tv_ir
from tv_ir.pipeline import partition_and_check
from tv_ir.semantics import terms as T
from tv_ir.semantics.algebra import NumpyAlgebra
from tv_ir.semantics.interpreters.spmd import SpmdInterpreter
from tv_ir.semantics.symbolic import SymbolicAlgebra

X = np.zeros((8, 16), np.float32)
W = np.zeros((16, 4), np.float32)


def lower(f, *args) -> str:
    return jax.jit(f).lower(*args).as_text(debug_info=True)


def halve_until_small(w, bound=1.0):
    """Halve the weights until every one is below `bound` in magnitude: how many times
    depends on their values."""
    return jax.lax.while_loop(lambda v: jnp.max(jnp.abs(v)) >= bound, lambda v: v * 0.5, w)


def test_the_same_loop_written_two_ways_is_proved() -> None:
    def spec(x, w):
        return x @ halve_until_small(w)

    def impl(x, w):  # the same loop: divide instead of multiply, the comparison turned round
        w = jax.lax.while_loop(lambda v: 1.0 <= jnp.max(jnp.abs(v)), lambda v: v / 2.0, w)
        return jnp.einsum("bd,dk->bk", x, w)

    r = tv_ir.check(lower(spec, X, W), lower(impl, X, W))
    assert r.verdict == "equivalent", r.reason


def test_jit_with_shardings_runs_the_loop_on_every_device() -> None:
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))

    def s(*spec):
        return NamedSharding(mesh, P(*spec))

    def f(x, w):
        return x @ halve_until_small(w)

    jitted = jax.jit(f, in_shardings=(s("data", None), s()), out_shardings=s("data", None))
    r = partition_and_check(jitted.lower(X, W).as_text(debug_info=True))
    assert r.verdict == "equivalent", r.reason


def test_a_loop_with_another_bound_is_refuted() -> None:
    def spec(x, w):
        return x @ halve_until_small(w)

    def impl(x, w):
        return x @ halve_until_small(w, bound=2.0)

    r = tv_ir.check(lower(spec, X, W), lower(impl, X, W))
    assert r.verdict == "not_equivalent", r.reason
    assert r.counterexample is not None


def count_to_five(n):
    return jax.lax.while_loop(lambda k: k < 5, lambda k: k + 1, n)


def count_to_five_or_stop_at_minus_seven(n):
    return jax.lax.while_loop(lambda k: (k < 5) & (k != -7), lambda k: k + 1, n)


def test_loops_that_differ_far_from_the_samples_are_not_proved() -> None:
    """The two loops agree from every start above -8 (all the simulation tries: small
    numbers, and extreme ones whose runs are too long to finish); they are different
    loops, so nothing proves them equal."""
    n = np.int32(0)
    r = tv_ir.check(lower(count_to_five, n), lower(count_to_five_or_stop_at_minus_seven, n))
    assert r.verdict != "equivalent"
    if r.verdict == "not_equivalent":
        start = int(np.asarray(next(iter(r.counterexample.inputs.values()))))
        assert start <= -8


# one device's loop per device (a per-device program), each from its own start: device 0
# goes round 5 times, device 1 not at all
PER_DEVICE = """
module @m attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%x: tensor<2xf32> {mhlo.sharding = "{manual}"})
      -> (tensor<2xf32> {mhlo.sharding = "{manual}"}) {
    %r = stablehlo.while(%v = %x) : tensor<2xf32>
    cond {
      %z = stablehlo.constant dense<0xFF800000> : tensor<f32>
      %m = stablehlo.reduce(%v init: %z) applies stablehlo.maximum across dimensions = [0]
        : (tensor<2xf32>, tensor<f32>) -> tensor<f32>
      %c = stablehlo.constant dense<1.000000e+02> : tensor<f32>
      %p = stablehlo.compare LT, %m, %c : (tensor<f32>, tensor<f32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    } do {
      %d = stablehlo.add %v, %v : tensor<2xf32>
      stablehlo.return %d : tensor<2xf32>
    }
    return %r : tensor<2xf32>
  }
}
"""


def test_devices_go_round_their_own_number_of_times() -> None:
    module = tv_ir.load(PER_DEVICE)
    starts = [np.array([3.0, 1.0]), np.array([200.0, 1.0])]
    out = SpmdInterpreter(module, NumpyAlgebra(), 1, 2).run([[x] for x in starts])
    np.testing.assert_array_equal(out[0][0], [192.0, 64.0])  # 3 * 2^6
    np.testing.assert_array_equal(out[1][0], [200.0, 1.0])


@pytest.mark.parametrize("starts", [[[3.0, 1.0], [200.0, 1.0]], [[-1.0, 0.5], [99.0, -3.0]]])
def test_the_loop_terms_evaluate_to_the_concrete_run(starts) -> None:
    """Each device's final state as terms of its own start, evaluated at the starts, is the
    concrete run (the loop's atoms run the loop on numbers)."""
    module = tv_ir.load(PER_DEVICE)
    concrete = SpmdInterpreter(module, NumpyAlgebra(), 1, 2).run([[np.array(s)] for s in starts])
    env, sym = {}, []
    for d, s in enumerate(starts):
        a = T.symbol_array(f"d{d}", (2,))
        env.update((T.as_atom(p).id, v) for p, v in zip(a.flat, s, strict=True))
        sym.append([a])
    symbolic = SpmdInterpreter(module, SymbolicAlgebra(), 1, 2).run(sym)
    for c, s in zip(concrete, symbolic, strict=True):
        assert np.asarray(s[0]).dtype == object
        np.testing.assert_array_equal(T.instantiate(s[0], env), c[0])


def double_until_large(v, bound=100.0):
    """Double a block until its largest element reaches `bound`."""
    return jax.lax.while_loop(lambda b: jnp.max(b) < bound, lambda b: b + b, v)


def test_shard_map_runs_each_block_round_its_own_number_of_times() -> None:
    """Each device's block goes round as often as its own values need (the devices
    disagree on when to stop): equal to the loop applied block by block."""
    mesh = Mesh(np.array(jax.devices()[:2]), ("d",))

    def spec(x):
        return jnp.concatenate([double_until_large(x[0:2]), double_until_large(x[2:4])])

    def per_device(bound):
        return jax.shard_map(
            lambda v: double_until_large(v, bound), mesh=mesh, in_specs=P("d"), out_specs=P("d")
        )

    x = np.array([3.0, 1.0, 200.0, 1.0], np.float32)
    r = verify(per_device(100.0), x, spec=spec)
    assert r.verdict == "equivalent", r.reason
    r = verify(per_device(1000.0), x, spec=spec)
    assert r.verdict == "not_equivalent", r.reason


def test_a_loop_that_talks_to_other_devices_is_not_run_on_its_own() -> None:
    """A loop holding a collective cannot go on on one device alone: unknown, named."""
    text = PER_DEVICE.replace(
        "%d = stablehlo.add %v, %v : tensor<2xf32>",
        '%d = "stablehlo.all_reduce"(%v) ({\n'
        "      ^bb0(%a: tensor<f32>, %b: tensor<f32>):\n"
        "        %s = stablehlo.add %a, %b : tensor<f32>\n"
        "        stablehlo.return %s : tensor<f32>\n"
        "      }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>,\n"
        "          channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,\n"
        "          use_global_device_ids} : (tensor<2xf32>) -> tensor<2xf32>",
    )
    r = tv_ir.check(text, text)
    assert r.verdict == "unknown"
    assert "all_reduce" in r.reason
