"""Guarded partial operations: a division, sqrt, rsqrt or log is defined only where its
operand is in the function's domain, and only where its value can reach an output.

Each pair below differs only on a guard set (x == 0, |v| == 0, an empty mask, a threshold);
random inputs never land there. Each `not_equivalent` is replayed on the programs; each
`equivalent` pair agrees everywhere, including where the guarded value is non-finite.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from tv_ir.frontends.jax import verify

V = np.linspace(-1, 1, 4, dtype=np.float32)
S = np.float32(0.5)


def _verdict(fn, spec, *args):
    r = verify(fn, *args, spec=spec, timeout=20)
    return r


# -- pairs that differ only on a guard set: must be refuted ------------------------------
def guarded_div_0(x, y):
    return jnp.where(x == 0, 0.0, y / x)


def guarded_div_1(x, y):
    return jnp.where(x == 0, 1.0, y / x)


def safe_normalise(c):
    def f(v):
        n2 = jnp.sum(v * v)
        return jnp.where(n2 == 0, c, v * jax_rsqrt(n2))

    return f


def jax_rsqrt(x):
    import jax.lax as lax

    return lax.rsqrt(x)


def masked_mean(default):
    def f(x, m):
        count = jnp.sum(m.astype(jnp.float32))
        total = jnp.sum(jnp.where(m, x, 0.0))
        return jnp.where(count == 0, default, total / count)

    return f


def sqrt_guard(past):
    def f(x):
        return jnp.where(x > 10, past, jnp.sqrt(10 - x))

    return f


def skip_nonfinite_step(p, x):
    g = 1.0 / x
    return jnp.where(jnp.isfinite(g), p - g, p)


def unguarded_step(p, x):
    return p - 1.0 / x


def x_times_inverse(x):
    return x * (1.0 / x)


def one(x):
    return x - x + 1.0  # uses x, so jit keeps the argument


def log_guard(default):
    def f(x):
        return jnp.where(x <= 0, default, jnp.log(jnp.where(x <= 0, 1.0, x)))

    return f


REFUTED = [
    ("div fallback 0 vs 1", guarded_div_0, guarded_div_1, (V, V)),
    ("safe normalise 0 vs 1", safe_normalise(0.0), safe_normalise(1.0), (V,)),
    ("masked mean default 0 vs 1", masked_mean(0.0), masked_mean(1.0), (V, V > 0)),
    ("sqrt guard past threshold", sqrt_guard(0.0), sqrt_guard(1.0), (V,)),
    ("is_finite skip vs none", skip_nonfinite_step, unguarded_step, (V, V)),
    ("x * (1/x) vs 1", x_times_inverse, one, (V,)),
    ("log guard default", log_guard(0.0), log_guard(-1.0), (V,)),
]


@pytest.mark.parametrize("name,spec,fn,args", REFUTED, ids=[r[0] for r in REFUTED])
def test_difference_on_a_guard_set_is_refuted(name, spec, fn, args) -> None:
    r = _verdict(fn, spec, *args)
    assert r.verdict == "not_equivalent", (name, r.verdict, r.reason)
    assert r.counterexample is not None


# -- pairs equal everywhere (where defined, and undefined in the same places) ------------
def double_where(x, y):
    safe = jnp.where(x == 0, 1.0, x)
    return jnp.where(x == 0, 0.0, y / safe)


def guarded_div_flipped(x, y):
    return jnp.where(x != 0, y / x, 0.0)


def skip_step_rewritten(p, x):
    g = 1.0 / x
    ok = jnp.isfinite(g)
    return p - jnp.where(ok, g, 0.0)


def div_plain(x, y):
    return y / x


def div_times_inverse(x, y):
    return y * (1.0 / x)


def log_clip(x):
    return jnp.log(jnp.maximum(x, 1e-6))


def log_clip_rewritten(x):
    return jnp.log(jnp.clip(x, 1e-6, None))


PROVED = [
    ("double where", guarded_div_0, double_where, (V, V)),
    ("where flipped", guarded_div_0, guarded_div_flipped, (V, V)),
    ("is_finite skip rewritten", skip_nonfinite_step, skip_step_rewritten, (V, V)),
    ("y/x as y*(1/x)", div_plain, div_times_inverse, (V, V)),
    ("log of a clipped value", log_clip, log_clip_rewritten, (V,)),
]


@pytest.mark.parametrize("name,spec,fn,args", PROVED, ids=[p[0] for p in PROVED])
def test_equal_guarded_programs_are_proved(name, spec, fn, args) -> None:
    r = _verdict(fn, spec, *args)
    assert r.verdict == "equivalent", (name, r.verdict, r.reason)


def test_undefined_on_one_side_only_is_refuted() -> None:
    # y / x is non-finite at x == 0; the guarded version is 0 there
    r = _verdict(guarded_div_0, div_plain, V, V)
    assert r.verdict == "not_equivalent"
    ce = r.counterexample
    assert ce is not None


def test_both_undefined_at_the_same_inputs_is_equivalent() -> None:
    # 1/x and x/x**2: both non-finite exactly at x == 0, equal elsewhere
    r = _verdict(lambda x: x / (x * x), lambda x: 1.0 / x, V)
    assert r.verdict == "equivalent", r.reason


# -- constants: exact rationals; math functions of constants fold in float64 (IEEE) ------
def sqrt_of_minus_one_past(x):
    return jnp.where(x > 100, jnp.sqrt(0.0 * x - 1.0), x)  # sqrt(-1) is NaN


def log_of_minus_one_past(x):
    return jnp.where(x > 100, jnp.log(0.0 * x - 1.0), x)  # log(-1) is NaN too


def test_folded_sqrt_of_a_negative_constant_is_undefined_not_a_crash() -> None:
    # the branch past x > 100 is NaN on both sides: equivalent
    r = _verdict(log_of_minus_one_past, sqrt_of_minus_one_past, V)
    assert r.verdict == "equivalent", r.reason
    # against the identity, the guard set x > 100 shows the NaN
    r = _verdict(lambda x: x + 0.0, sqrt_of_minus_one_past, V)
    assert r.verdict == "not_equivalent", r.reason


def test_a_cut_point_keeps_a_one_fact_condition() -> None:
    # x / x is 1 where x != 0: the cut-point standing for it must stay undefined at 0, so
    # isfinite(x / x) is not folded to true (the soundness fuzzer found this)
    r = _verdict(lambda x, y: x + 0 * y, lambda x, y: jnp.where(jnp.isfinite(x / x), x, y), V, V)
    assert r.verdict == "not_equivalent", r.reason


# -- AdamW's bias corrections: 1 - b**t is zero exactly where t is ------------------------
B1, B2 = 0.9, 0.95


def _adamw(second_moment_base):
    def step(p, g, m, v, count):
        t = (count + 1).astype(jnp.float32)
        c1, c2 = 1 - B1**t, 1 - second_moment_base**t
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * g * g
        return p - 3e-4 * ((m / c1) / (jnp.sqrt(v / c2) + 1e-8) + 0.1 * p)

    return step


def _sharded_adamw(second_moment_base):
    import jax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:2]), ("d",))
    update = _adamw(second_moment_base)

    def body(p, x, m, v, count):
        return update(p, jax.lax.psum(x.sum(0), "d"), m, v, count)

    rep = P()
    return jax.shard_map(
        body, mesh=mesh, in_specs=(rep, P("d"), rep, rep, rep), out_specs=rep, check_vma=False
    )


def test_adamw_bias_corrections_are_one_condition() -> None:
    """At step count -1 both corrections are zero and both programs non-finite; as opaque
    `pow` atoms the two conditions were unrelated and the step was never proved."""
    import jax

    def spec(p, x, m, v, count):
        return _adamw(B2)(p, x.sum(0), m, v, count)

    f32 = jax.ShapeDtypeStruct((4,), jnp.float32)
    args = (
        f32,
        jax.ShapeDtypeStruct((6, 4), jnp.float32),
        f32,
        f32,
        jax.ShapeDtypeStruct((), jnp.int32),
    )
    assert verify(_sharded_adamw(B2), *args, spec=spec).verdict == "equivalent"
    wrong = verify(_sharded_adamw(B1), *args, spec=spec)  # beta1 in the second correction
    assert wrong.verdict == "not_equivalent" and wrong.counterexample is not None


def test_power_of_a_constant_base_equals_one_only_at_exponent_zero() -> None:
    from tv_ir.semantics import terms as T

    t = T.symbol("t")
    pow_t = T.power(T.const(0.9), t)
    one_minus = T.sub(T.ONE, pow_t)
    assert T.compare("EQ", one_minus, T.ZERO) is T.compare("EQ", t, T.ZERO)
    assert T.compare("EQ", T.add(pow_t, T.ONE), T.ZERO) is T.FALSE  # b**t > 0
    # 1 - 2 * b**t == 0 holds at t = log_b(1/2): not simplified
    half = T.sub(T.ONE, T.mul(T.const(2), pow_t))
    assert T.compare("EQ", half, T.ZERO) is not T.compare("EQ", t, T.ZERO)
    # a base of 1, or a negative one, says nothing
    assert T.compare("EQ", T.sub(T.ONE, T.power(T.const(1), t)), T.ZERO) is not T.compare(
        "EQ", t, T.ZERO
    )


def test_a_cut_point_keeps_where_its_definition_is_zero_or_one() -> None:
    """Behind cut-points (`b**t`, then `1 - b**t`), the two bias corrections still vanish
    under one condition, `t == 0`: a symbol equals its definition wherever it is defined."""
    from tv_ir.semantics import terms as T

    t = T.symbol("t_levels")
    corrections = []
    for base in (0.9, 0.95):
        pow_sym = T.symbol(f"pow_levels_{base}")
        definition = T.power(T.const(base), t)
        T.note_sign(pow_sym, T.sign(definition))
        T.note_levels(pow_sym, definition)
        c_sym = T.symbol(f"c_levels_{base}")
        T.note_levels(c_sym, T.sub(T.ONE, pow_sym))
        corrections.append(c_sym)
    at_zero = T.compare("EQ", t, T.ZERO)
    assert all(T.compare("EQ", c, T.ZERO) is at_zero for c in corrections)
    # 1/c is undefined exactly where t == 0, for either correction
    assert T.inverse(corrections[0]).dom is T.inverse(corrections[1]).dom
    # a symbol whose definition says nothing structural keeps its own comparison
    other = T.symbol("other_levels")
    T.note_levels(other, T.sub(T.ONE, T.mul(T.const(2), T.power(T.const(0.9), t))))
    assert T.compare("EQ", other, T.ZERO) is not at_zero


def _inverse_root_correction(v, count):
    t = count.astype(jnp.float32)
    return 1 / (jnp.sqrt(v / (1 - B2**t)) + 1e-8)


def _inverse_root_negated_correction(v, count):
    t = count.astype(jnp.float32)
    return 1 / (jnp.sqrt(v / -(B2**t - 1)) + 1e-8)  # the same real, -0 at t = 0


def test_which_infinity_a_zero_correction_gives_is_not_assumed() -> None:
    """`1 - b**t` and `-(b**t - 1)` are one term over the reals, but at t = 0 XLA computes
    +0 for one and -0 for the other: v / c is +inf in one program and -inf in the other,
    sqrt(-inf) is NaN, and 1 / (sqrt(+inf) + eps) is 0. So knowing that sqrt's infinities are
    +inf does not make `1 / (sqrt(v / c) + eps)` the same value in two programs (0 in one,
    NaN in the other): each application there stays its own, and the pair is refuted."""
    import jax

    v = np.array([0.0, 1.0, -1.0, 0.5], np.float32)
    spec_out = np.asarray(jax.jit(_inverse_root_correction)(v, np.int32(0)))
    impl_out = np.asarray(jax.jit(_inverse_root_negated_correction)(v, np.int32(0)))
    assert np.isfinite(spec_out[1]) and np.isnan(impl_out[1])  # 0 vs NaN on XLA's CPU
    assert np.isnan(spec_out[2]) and np.isfinite(impl_out[2])
    args = (jax.ShapeDtypeStruct((4,), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32))
    r = verify(_inverse_root_negated_correction, *args, spec=_inverse_root_correction, timeout=20)
    assert r.verdict == "not_equivalent" and r.counterexample is not None, str(r)


def test_a_cut_symbol_takes_a_sign_shown_one_op_below_it() -> None:
    """torch_xla hands batch_norm_grad the variance as `(1 / rsqrt(var + eps))**2 - eps`;
    the gradient's `variance + eps` is then positive, but only once the `- eps` under the
    variance's cut symbol is seen. Without that sign every gradient behind a LayerNorm
    carried `variance + eps != 0` per token (Hugging Face GPT-2's training step ran out
    of memory building those conditions into its embedding gradient)."""
    from tv_ir.prover.engine import _carry_definedness
    from tv_ir.semantics import terms as T

    r = T.symbol("rsqrt_of_var_eps")
    T.note_sign(r, 2)  # a cut rsqrt: positive
    t = T.div(T.ONE, r)
    handed_back = T.sub(T.mul(t, t), T.const(1e-5))  # the variance's definition
    variance = T.symbol("handed_back_variance")
    plus_eps = np.array([T.add(variance, T.const(1e-5))], dtype=object)

    blind = np.array([T.symbol("variance_eps_blind")], dtype=object)
    _carry_definedness(blind, plus_eps)
    assert T.sign(blind[0]) == 0  # one op deep, nothing shows

    seen = np.array([T.symbol("variance_eps_seen")], dtype=object)
    below = {T.as_atom(variance).id: handed_back}
    _carry_definedness(seen, plus_eps, lambda d: T.substitute(d, below))
    assert T.sign(seen[0]) == 2
    assert T.compare("EQ", seen[0], T.ZERO) is T.FALSE  # a division by it needs no guard


def test_a_function_of_a_padded_infinity_is_its_ieee_value():
    # XLA pads a tile with zeros; rsqrt(0) is inf there, and sin(inf) NaN, in elements no
    # output keeps: the padded form is proved, not unknown
    import jax

    def padded(x):
        return jnp.sin(jax.lax.rsqrt(jnp.pad(x, (1, 1))))[1:-1]

    def plain(x):
        return jnp.sin(jax.lax.rsqrt(x))

    x = np.ones(4, np.float32)
    r = _verdict(padded, plain, x)
    assert r.verdict == "equivalent", str(r)
    r = _verdict(
        lambda x: jnp.sqrt(jax.lax.rsqrt(jnp.pad(x, (1, 1))))[1:-1],
        lambda x: jnp.sqrt(jax.lax.rsqrt(x)),
        x,
    )
    assert r.verdict == "equivalent", str(r)
