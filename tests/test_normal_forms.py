"""Normal forms that real programs need: exp of a sum is a product of exps, a factor shared
by every term of a denominator leaves the inverse, log of exp factors splits. So a softmax
with and without its max subtracted (jax.nn.softmax vs the textbook form), and a
log-softmax written either way, have one normal form."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from tv_ir.frontends.jax import verify

from tv_ir.semantics import terms as T

S = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)

x, y = T.symbol("x"), T.symbol("y")


def test_exp_of_a_sum_is_a_product() -> None:
    assert T.fn("exp", T.add(x, y)) == T.mul(T.fn("exp", x), T.fn("exp", y))
    assert T.fn("exp", T.sub(x, y)) == T.div(T.fn("exp", x), T.fn("exp", y))  # exp > 0


def test_shared_factor_leaves_the_inverse() -> None:
    e = T.fn("exp", x)
    assert T.value(T.inverse(T.mul(e, T.add(y, T.ONE)))) == T.value(
        T.mul(T.inverse(e), T.inverse(T.add(y, T.ONE)))
    )


def test_log_of_exp_factors() -> None:
    assert T.fn("log", T.fn("exp", x)) == x
    q = T.add(T.fn("exp", y), T.ONE)
    lhs = T.fn("log", T.mul(T.fn("exp", x), q))
    assert T.value(lhs) == T.value(T.add(x, T.fn("log", q)))


def textbook_softmax(s):
    e = jnp.exp(s)
    return e / jnp.sum(e, axis=-1, keepdims=True)


def test_jax_softmax_is_the_textbook_softmax() -> None:
    r = verify(lambda s: jax.nn.softmax(s, axis=-1), S, spec=textbook_softmax)
    assert r.verdict == "equivalent", r.reason


def test_jax_log_softmax_is_log_sum_exp() -> None:
    r = verify(
        lambda s: jax.nn.log_softmax(s, axis=-1),
        S,
        spec=lambda s: s - jnp.log(jnp.sum(jnp.exp(s), axis=-1, keepdims=True)),
    )
    assert r.verdict == "equivalent", r.reason


def test_softmax_over_the_wrong_axis_is_refuted() -> None:
    r = verify(lambda s: jax.nn.softmax(s, axis=0), S, spec=textbook_softmax)
    assert r.verdict == "not_equivalent"


def test_a_maximum_of_terms_whose_difference_has_a_sign_is_the_larger() -> None:
    s = T.add(T.fn("exp", x), T.fn("exp", y))
    assert T.maximum([s, T.neg(s)]) == s  # |s| of a positive s
    assert T.maximum([s, T.neg(s)], is_max=False) == T.neg(s)
    assert T.maximum([T.fn("exp", x), T.ZERO]) == T.fn("exp", x)  # relu of a positive
    assert T.as_atom(T.maximum([x, T.neg(x)])).kind == "max"  # |x|: no sign known


def hand_written_logsumexp(s):
    m = jnp.max(s, axis=-1, keepdims=True)
    return (m + jnp.log(jnp.sum(jnp.exp(s - m), axis=-1, keepdims=True)))[..., 0]


def test_a_hand_written_logsumexp_is_jax_nn_logsumexp() -> None:
    """jax.nn.logsumexp takes log(|sum(exp(s - m))|): the sum is positive, so its absolute
    value is itself (once unknown: "the solver found a difference", no counterexample)."""
    report = verify(
        hand_written_logsumexp, S, spec=lambda s: jax.nn.logsumexp(s, axis=-1), reduce_shapes=False
    )
    assert report.verdict == "equivalent", str(report)


def test_exp_of_a_sum_keeps_a_constant_float64_cannot_hold() -> None:
    """exp(x - 1e9) = exp(x) exp(-1e9), and exp(-1e9) is 0.0 in float64: folded, the term was
    0 for every x, and `exp(x - 1e9)` was proved equal to `0 * x` (at x = 1e9 it is 1).
    The constant stays an exp atom: positive, never 0."""
    assert T.fn("exp", T.sub(x, T.const(1e9))) != T.ZERO
    assert T.sign(T.fn("exp", T.sub(x, T.const(1e9)))) == 2
    assert T.fn("exp", T.sub(x, T.const(2.0))) == T.mul(T.fn("exp", x), T.const(np.exp(-2.0)))


def causal_softmax(s, masked_by):
    mask = jnp.tril(jnp.ones((s.shape[-1], s.shape[-1]), bool))
    return jax.nn.softmax(jnp.where(mask, s, masked_by), axis=-1)


def test_a_mask_of_minus_1e9_is_not_proved_a_mask_of_minus_infinity() -> None:
    """Over the reals (and in float32 at a score of -2e9) they differ: never `equivalent`."""
    s = np.zeros((2, 4, 4), np.float32)
    for big in (-1e9, float(np.finfo(np.float32).min)):
        report = verify(
            lambda s, big=big: causal_softmax(s, big),
            s,
            spec=lambda s: causal_softmax(s, -jnp.inf),
            reduce_shapes=False,
        )
        assert report.verdict != "equivalent", str(report)


def test_piecewise_functions_z3_states_exactly() -> None:
    """sign, floor, ceil and rounding go to z3 as themselves (they were uninterpreted: equal
    pairs ended `unknown`, "the solver found a difference", and a tie never replayed)."""
    xs = np.linspace(-3, 3, 8, dtype=np.float32)
    same = [
        (lambda x: jnp.sign(x) * jnp.abs(x), lambda x: x),
        (jnp.floor, lambda x: -jnp.ceil(-x)),
        (lambda x: jnp.round(x + 2.0), lambda x: jnp.round(x) + 2.0),  # ties to even
    ]
    for impl, spec in same:
        report = verify(impl, xs, spec=spec, reduce_shapes=False)
        assert report.verdict == "equivalent", str(report)
    report = verify(jnp.round, xs, spec=lambda x: jnp.floor(x + 0.5), reduce_shapes=False)
    assert report.verdict == "not_equivalent", str(report)  # at a tie: round(0.5) = 0
    x = float(report.counterexample.inputs["x"].flat[report.counterexample.index[0]])
    assert x % 1 == 0.5, x


def test_a_model_past_a_large_threshold_is_taken_far_enough_to_replay() -> None:
    """`max(x, -1e9)` differs from `x` below -1e9: z3's first model (x just below it) rounds
    back to -1e9 in float32, and nothing replayed ("the solver found a difference")."""
    xs = np.linspace(-3, 3, 8, dtype=np.float32)
    report = verify(lambda x: jnp.maximum(x, -1e9), xs, spec=lambda x: x, reduce_shapes=False)
    assert report.verdict == "not_equivalent", str(report)
    assert report.counterexample.inputs["x"].min() < -1e9
