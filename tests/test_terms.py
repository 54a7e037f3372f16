"""Normal forms decide polynomial identities; Z3 decides what they leave open."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tv_ir.prover import smt
from tv_ir.semantics import terms as T

x, y, z = (T.symbol(n) for n in "xyz")


def test_ring_identities_have_equal_normal_forms() -> None:
    lhs = T.mul(T.add(x, y), T.add(x, y))
    rhs = T.add(T.add(T.mul(x, x), T.scale(T.mul(x, y), 2)), T.mul(y, y))
    assert lhs == rhs
    # reassociation and distributivity over a constant division
    assert T.div(T.add(T.add(x, y), z), T.const(4.0)) == T.sum_of(
        [T.div(x, T.const(4)), T.div(T.add(y, z), T.const(4))]
    )
    assert T.sub(x, x) == T.ZERO


def test_different_polynomials_differ() -> None:
    assert T.mul(x, y) != T.mul(x, x)
    assert T.add(x, T.const(1e-5)) != T.add(x, T.const(1e-6))


def test_division_by_a_monomial_cancels() -> None:
    q = T.mul(T.div(x, y), y)
    assert T.value(q) == x  # the value cancels ...
    assert q.dom is T.logical_not(T.compare("EQ", y, T.ZERO))  # ... where y != 0
    assert q != x
    assert T.value(T.div(T.mul(x, y), T.mul(y, z))) == T.value(T.div(x, z))


def test_opaque_functions_of_equal_arguments_are_equal() -> None:
    a = T.fn("exp", T.add(x, y))
    b = T.fn("exp", T.add(y, x))
    assert a == b
    assert T.fn("exp", x) != T.fn("exp", y)


def test_max_is_ac_normalised_and_absorbs_minus_infinity() -> None:
    assert T.maximum([x, T.maximum([y, z])]) == T.maximum([z, y, x])
    assert T.maximum([x, T.NEG_INF]) == x
    assert T.maximum([x, T.add(x, T.ONE)]) == T.add(x, T.ONE)


def test_comparisons_and_selects_are_canonical() -> None:
    assert T.compare("LT", x, y) is T.compare("GT", y, x)
    assert T.compare("LT", T.scale(x, 2), T.scale(y, 2)) is T.compare("LT", x, y)
    a = T.select(T.compare("GT", x, y), x, y)
    b = T.select(T.compare("LE", x, y), y, x)
    assert a == b
    assert T.select(T.TRUE, x, y) == x


def test_masking_with_minus_infinity() -> None:
    masked = T.select(T.FALSE, x, T.NEG_INF)
    assert T.fn("exp", T.sub(masked, y)) == T.ZERO


def test_substitution_renormalises() -> None:
    m = T.symbol("m")
    mean = T.div(T.add(x, y), T.const(2))
    centred = T.add(T.sub(x, m), T.sub(y, m))  # sum of deviations from m
    assert centred != T.ZERO
    assert T.substitute(centred, {T.as_atom(m).id: mean}) == T.ZERO


_leaf = st.sampled_from([x, y, z]) | st.integers(-3, 3).map(T.const)
_expr = st.recursive(
    _leaf,
    lambda sub: st.tuples(st.sampled_from(["add", "sub", "mul"]), sub, sub).map(
        lambda t: getattr(T, t[0])(t[1], t[2])
    ),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(_expr, st.floats(-2, 2), st.floats(-2, 2), st.floats(-2, 2))
def test_evaluating_a_normal_form_matches_float_arithmetic(e, vx, vy, vz) -> None:
    env = {T.as_atom(x).id: vx, T.as_atom(y).id: vy, T.as_atom(z).id: vz}
    # the same expression rebuilt by substitution of constants must evaluate identically
    value = T.evaluate(e, env)
    folded = T.substitute(e, {k: T.const(v) for k, v in env.items()})
    assert folded.is_const()
    assert math.isclose(float(folded.const_value()), value, rel_tol=1e-9, abs_tol=1e-9)


def test_z3_proves_identities_normal_forms_miss() -> None:
    r = T.fn("rsqrt", x)
    assert T.mul(T.mul(r, r), x) != T.ONE
    # equal to 1 where rsqrt is defined; at x <= 0 the left side is inf or NaN
    one_where = T.with_dom(T.ONE, T.compare("GT", x, T.ZERO))
    assert smt.check_equal([(T.mul(T.mul(r, r), x), one_where)]).status == "unsat"
    assert smt.check_equal([(T.mul(T.mul(r, r), x), T.ONE)]).status == "sat"
    # max(a, b) + min(a, b) == a + b
    lhs = T.add(T.maximum([x, y]), T.maximum([x, y], is_max=False))
    assert smt.check_equal([(lhs, T.add(x, y))]).status == "unsat"


def test_z3_refutes_with_a_model() -> None:
    res = smt.check_equal([(T.mul(x, x), x)])
    assert res.status == "sat"
    vx = res.model[T.as_atom(x).id]
    assert vx * vx != vx


def test_settle_keeps_a_condition_that_is_one_fact() -> None:
    q = T.div(x, x)
    assert T.settle(q).dom is q.dom
    both = T.mul(T.div(x, y), T.fn("log", x))
    assert T.settle(both).dom is both.dom


def _holds_exactly(b: T.Bool, env: dict) -> bool:
    """An integer comparison at integer inputs, in exact arithmetic (float evaluation of
    the normal form `1 - x/49 == 0` may round away from 0)."""
    if b.kind == "const":
        return bool(b.args[0])
    assert b.kind == "cmp" and b.args[0] == "==", b
    total = Fraction(0)
    for m, c in b.args[1].terms.items():
        term = Fraction(c)
        for aid, e in m:
            term *= Fraction(T.evaluate_int(T.atom_poly(T.ATOM_BY_ID[aid]), env)) ** e
        total += term
    return total == 0


def test_comparing_a_wrapped_index_is_the_unwrapped_comparison() -> None:
    """`wrap(q + k) == t` on a machine integer (a device's index into its vocabulary
    shard, `token - offset`) becomes `q == v` for the one v in q's range congruent to
    t - k: the spec's comparison. Checked against modular arithmetic for every 8-bit
    value, with offsets that wrap and targets outside the type."""
    t = T.symbol(T.Key("input", 0, "i32", "t"), (0,))
    tokens = T.select(T.compare("LT", t, T.const(0)), T.wrap(T.add(t, T.const(20)), 32, True), t)
    local = T.wrap(T.add(tokens, T.const(-10)), 32, True)
    assert T.compare("EQ", local, T.const(3)) is T.compare("EQ", tokens, T.const(13))
    for dtype, signed in (("i8", True), ("ui8", False)):
        x = T.symbol(T.Key("input", 1, dtype, "x"), (0,))
        lo, hi = T.int_bounds(8, signed)
        below = T.compare("LT", x, T.const(3))
        for q in (x, T.select(below, T.wrap(T.add(x, T.const(20)), 8, signed), x)):
            for k in (-300, -10, 0, 7, 128, 255):
                for target in (lo, -1, 0, 5, 10, hi, hi + 1):
                    b = T.compare("EQ", T.wrap(T.add(q, T.const(k)), 8, signed), T.const(target))
                    for xv in range(lo, hi + 1):
                        env = {T.as_atom(x).id: xv}
                        want = T.wrap_int(T.evaluate_int(q, env) + k, 8, signed) == target
                        assert _holds_exactly(b, env) == want, (dtype, k, target, xv, b)


def test_a_count_of_booleans_plus_epsilon_is_never_zero() -> None:
    """`select(c, 1, 0)` (a boolean converted to a number) is >= 0, so a count of them
    plus a positive epsilon is > 0 and dividing by it is defined everywhere (MaxText's
    `xent_sum / (total_weights + EPS)`); without the epsilon the count may be 0."""
    flags = [T.lift(T.compare("NE", T.symbol(f"seg{i}"), T.ZERO)) for i in range(3)]
    count = T.sum_of(flags)
    assert T.sign(flags[0]) == 1 and T.sign(count) == 1
    assert T.inverse(T.add(count, T.const(1e-8))).dom is T.TRUE
    assert T.inverse(count).dom is not T.TRUE
    # a branch of either sign says nothing
    mixed = T.select(T.compare("GT", x, T.ZERO), T.const(1), T.const(-1))
    assert T.sign(mixed) == 0
    assert T.sign(T.select(T.compare("GT", x, T.ZERO), T.ZERO, T.const(-2))) == -1


def _cut(name: str, definition: T.Poly) -> T.Poly:
    """A cut symbol standing for `definition`, with the facts the prover notes for it."""
    sym = T.symbol(name)
    T.note_sign(sym, T.sign(definition))
    T.note_extremum(sym, definition)
    return sym


def test_the_count_of_positions_attaining_a_max_is_positive() -> None:
    """jax differentiates `max(x)` as `sum(g * (x == max)) / sum(x == max)`; the count is at
    least 1 (a max of finitely many reals is one of them), so the division is defined
    everywhere, behind cut-points too. A count over some of the positions may be 0."""
    xs = [T.symbol(f"logit{i}") for i in range(3)]
    top = _cut("top", T.maximum(xs))
    flags = [_cut(f"at_top{i}", T.lift(T.compare("EQ", x, top))) for i, x in enumerate(xs)]
    count = _cut("count", T.sum_of(flags))
    assert T.sign(count) == 2
    assert T.inverse(count).dom is T.TRUE
    partial = T.sum_of(flags[:2])
    assert T.sign(partial) == 1 and T.inverse(partial).dom is not T.TRUE
    # a max of terms that may be non-finite: x == max may fail everywhere (NaN)
    ys = [T.div(T.ONE, T.symbol(f"den{i}")) for i in range(2)]
    top_nan = _cut("top_nan", T.maximum(ys))
    flags_nan = [
        _cut(f"at_top_nan{i}", T.lift(T.compare("EQ", y, top_nan))) for i, y in enumerate(ys)
    ]
    assert T.sign(T.sum_of(flags_nan)) != 2


def test_a_clip_by_a_norm_is_defined_wherever_its_gradient_is() -> None:
    """`where(n < 1, g, g / n)` divides only where n >= 1, so where n != 0: its condition
    is g's. A divisor that may be 0 on the dividing branch keeps its condition."""
    norm, g = T.symbol("clip_norm"), T.symbol("clip_g")
    below = T.compare("LT", norm, T.ONE)
    assert T.select(below, g, T.div(g, norm)).dom is T.TRUE
    assert T.select(below, g, T.div(g, T.add(norm, T.const(-1)))).dom is not T.TRUE
    at_or_above = T.compare("GE", norm, T.ONE)
    assert T.logical_and(at_or_above, T.logical_not(T.compare("EQ", norm, T.ZERO))) is at_or_above
    # -n >= 0 does not keep n away from 0
    nonpositive = T.compare("LE", norm, T.ZERO)
    nonzero = T.logical_not(T.compare("EQ", norm, T.ZERO))
    assert T.logical_and(nonpositive, nonzero) is not nonpositive


_poly_parts = st.lists(
    st.tuples(st.sampled_from(["nz_a", "nz_b", None]), st.integers(-2, 2)), max_size=3
)


def _poly(parts) -> T.Poly:
    out = T.ZERO
    for name, c in parts:
        term = T.const(c) if name is None else T.mul(T.const(c), T.symbol(name))
        out = T.add(out, term)
    return out


@settings(max_examples=300, deadline=None)
@given(_poly_parts, _poly_parts)
def test_the_sign_filter_keeps_every_sign_whose_sum_is_constant(qs, ps) -> None:
    """`_implied_nonzero` tries only the signs `_signs_matching` gives: none it drops may
    make `s * q - p` a constant (the filter saves arithmetic, never a conclusion)."""
    q, p = _poly(qs), _poly(ps)
    kept = T._signs_matching(q, p)
    for sgn in (1, -1):
        if T.sub(T.scale(q, sgn), p).is_const():
            assert sgn in kept, (q, p, sgn)


def test_a_divisor_guarded_against_zero_is_never_zero() -> None:
    """torch's mean cross-entropy divides by `select(n == 0, 1, n)` (n: the count of valid
    labels): 1 where n is 0, n elsewhere, so never 0 and the division adds no condition.
    Guards that leave a zero in (the wrong default, the wrong test) keep the condition, and
    equality with a value a branch can take stays a comparison."""
    n = T.symbol("valid_count")
    at_zero = T.compare("EQ", n, T.ZERO)
    guarded = T.select(at_zero, T.ONE, n)
    assert T.compare("EQ", guarded, T.ZERO) is T.FALSE
    assert T.div(T.symbol("loss_sum"), guarded).dom is T.TRUE
    assert T.compare("EQ", guarded, T.ONE).kind != "const"  # n may be 1
    assert T.compare("EQ", guarded, T.const(2)).kind != "const"
    # a zero default, or a test of another value, leaves a zero in
    assert T.div(T.ONE, T.select(at_zero, T.ZERO, n)).dom is not T.TRUE
    off_by_one = T.select(T.compare("EQ", n, T.ONE), T.ONE, n)
    assert T.div(T.ONE, off_by_one).dom is not T.TRUE
    # the same guard written as `n != 0 ? n : 1`
    assert T.div(T.ONE, T.select(T.compare("NE", n, T.ZERO), n, T.ONE)).dom is T.TRUE


def _atom_id(p: T.Poly) -> int:
    return T.as_atom(p).id


def test_perturbations_agree_with_evaluating_whole() -> None:
    # the culprit search moves one group of symbols at a time; re-evaluating only the
    # monomials that depend on the moved symbols gives the whole evaluation's value and scale
    a, b, c, d = (T.symbol(n) for n in "abcd")
    p = T.sum_of(
        [
            T.mul(a, b),
            T.scale(T.mul(c, c), 3),
            T.fn("exp", T.add(a, d)),  # a nested atom that depends on a
            T.mul(T.maximum([b, d]), c),
            T.const(2.5),
        ]
    )
    env = {_atom_id(s): v for s, v in zip((a, b, c, d), (0.5, -1.25, 2.0, 0.75), strict=True)}
    points = T.Perturbations(p, env)
    assert not points.whole
    assert points.at({}) == pytest.approx(T.evaluate_with_scale(p, env))
    for moved in ({_atom_id(a): 3.0}, {_atom_id(d): -2.0}, {_atom_id(b): 1.5, _atom_id(c): 0.1}):
        whole = T.evaluate_with_scale(p, env | moved)
        assert points.at(moved) == pytest.approx(whole, rel=1e-12)
    # a symbol no monomial reads moves nothing
    assert points.at({_atom_id(T.symbol("unused")): 9.0}) == (points.total, points.scale)


def test_perturbations_of_a_partial_polynomial_are_evaluated_whole() -> None:
    a, b = T.symbol("a"), T.symbol("b")
    p = T.div(a, b)  # defined where b != 0
    env = {_atom_id(a): 1.0, _atom_id(b): 2.0}
    points = T.Perturbations(p, env)
    assert points.whole
    val, scale = points.at({_atom_id(b): 0.0})
    assert math.isnan(val) and scale == math.inf


def test_symbols_of_a_large_polynomial() -> None:
    xs = [T.symbol(f"s{i}") for i in range(300)]
    p = T.sum_of([T.mul(u, v) for u, v in zip(xs, xs[1:], strict=False)])
    assert p.syms == frozenset(_atom_id(s) for s in xs)


def test_perturbations_evaluate_quietly(recwarn) -> None:
    # a square root of a negative value is nan, as in the whole evaluation: no warning
    a = T.symbol("a")
    p = T.add(T.fn("sqrt", a), T.const(1.0))
    env = {_atom_id(a): -4.0}
    val, _ = T.Perturbations(p, env).at({_atom_id(a): -1.0})
    assert math.isnan(val)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_perturbations_with_high_powers() -> None:
    # powers above 4 are raised with np.power, smaller ones multiplied out: both as whole
    a, b = T.symbol("a"), T.symbol("b")
    for p in (T.add(T.power_int(a, 6), T.mul(a, b)), T.add(T.power_int(a, 3), T.mul(a, b))):
        env = {_atom_id(a): 1.1, _atom_id(b): -0.7}
        points = T.Perturbations(p, env)
        moved = {_atom_id(a): 0.3}
        assert points.at(moved) == pytest.approx(T.evaluate_with_scale(p, env | moved))
    assert T.Perturbations(T.power_int(a, 6), {_atom_id(a): 1.0}).factors is None
    assert T.Perturbations(T.power_int(a, 3), {_atom_id(a): 1.0}).factors is not None


def test_a_cut_symbols_facts_are_worked_out_when_first_asked_for() -> None:
    """The prover notes a cut symbol's sign and levels for later (`note_later`): most are
    never asked about, and the sign one op deeper costs a substitution. Asked for, they
    are what its definition says, one op deeper included; forgotten after the run."""
    y = T.symbol("later_y")
    calls = []

    def deeper(d):  # `d` one op deeper: a square
        calls.append(d)
        return T.mul(y, y)

    sym = T.symbol("later_var")
    T.note_later(sym, T.sub(T.symbol("later_v"), T.const(1e-5)), deeper)
    assert calls == []  # nothing worked out yet
    assert T.sign(sym) == 1 and len(calls) == 1  # >= 0: seen one op deeper
    assert T.sign(T.add(sym, T.const(1e-5))) == 2 and len(calls) == 1  # once
    c = T.symbol("later_c")  # c = 1 - b**t is 0 where t is
    t = T.symbol("later_t")
    T.note_later(c, T.sub(T.ONE, T.power(T.const(0.9), t)))
    # 1 / c is defined where t != 0 (its level 0), not merely where c != 0
    assert T.as_atom(t).id in T.inverse(c).dom.syms
    T.note_later(T.symbol("later_unasked"), T.symbol("later_v"), deeper)
    T.forget_later()
    assert T.sign(T.symbol("later_unasked")) == 0 and len(calls) == 1


def test_an_update_guarded_into_an_extremum_is_one_more_flat_item() -> None:
    x, u, v = T.symbol("x"), T.symbol("u"), T.symbol("v")
    c, d = T.compare("GT", u, x), T.compare("GT", v, x)
    # c ? min(x, u) : x  ==  min(x, c ? u : +inf), in any order of the updates
    one = T.select(c, T.maximum([x, u], False), x)
    assert one == T.maximum([x, T.select(c, u, T.POS_INF)], False)
    a = T.select(d, T.maximum([one, v], False), one)
    b0 = T.select(d, T.maximum([x, v], False), x)
    b = T.select(c, T.maximum([b0, u], False), b0)
    assert a == b
    # the same for max, with -inf
    m = T.select(c, T.maximum([x, u]), x)
    assert m == T.maximum([x, T.select(c, u, T.NEG_INF)])


def test_infinities_are_weighed_in_smt_but_never_computed_with() -> None:
    x, u = T.symbol("x"), T.symbol("u")
    c = T.compare("GT", u, T.const(0))
    padded = T.maximum([x, T.select(c, u, T.POS_INF)], False)
    # min(x, c ? u : +inf) against c ? min(x, u) : x, written out by hand as an atom
    by_cases = T.atom_poly(T.Atom("select", (c, T.maximum([x, u], False), x)))
    assert smt.check_equal([(padded, by_cases)]).status == "unsat"
    # c ? u : +inf is not u: where c fails it is the infinity, above every finite u
    assert smt.check_equal([(T.select(c, u, T.POS_INF), u)]).status == "sat"
    assert smt.check_equal([(T.select(c, u, T.POS_INF), T.POS_INF)]).status == "sat"
    # an infinity inside arithmetic is not encoded: no large number stands for it there
    r = smt.check_equal([(T.atom_poly(T.Atom("pow", (T.POS_INF, x))), x)])
    assert r.status == "unknown" and "infinite" in r.reason


def test_a_math_function_of_an_infinity_folds_as_in_ieee() -> None:
    assert T.fn("sin", T.POS_INF) == T.NAN
    assert T.fn("sqrt", T.POS_INF) == T.POS_INF
    assert T.fn("exp", T.NEG_INF) == T.ZERO


_QUERY_TEXT = """
from functools import reduce
from tv_ir.prover import smt
from tv_ir.semantics import terms as T
xs = [T.symbol(T.Key("input", i, name=f"arg{i}"), (i,)) for i in range(8)]
guard = reduce(T.logical_and, [T.compare("GT", a, b) for a, b in zip(xs, xs[1:])])
either = reduce(T.logical_or, [T.compare("EQ", a, T.const(k)) for k, a in enumerate(xs)])
top = T.maximum([T.add(a, T.const(k)) for k, a in enumerate(xs)])
enc = smt._Encoder()
print(enc.boolean(guard).sexpr(), enc.boolean(either).sexpr(), enc.poly(top, True).sexpr())
"""


def test_terms_and_queries_are_the_same_in_every_process() -> None:
    """The items of an `and` or `or` and the operands of a `max` are held in sets ordered
    by their hashes; Python salts string hashes per process (PYTHONHASHSEED), so terms
    hashed by their kind's name were met in another order in every run, and z3, given the
    same query in another order, proved XLA's GatherMerged...PartialGrouping in some runs
    and ran out of its budget in others. The same terms give the same query text in every
    process."""
    import os
    import subprocess
    import sys

    texts = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", _QUERY_TEXT], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        texts.add(out.stdout)
    assert len(texts) == 1


def test_a_dot_skips_zero_times_a_finite_value_and_keeps_what_may_be_undefined(
    monkeypatch,
) -> None:
    """A convolution's padding makes most of its products 0 * term: they add nothing and
    are not built (XLA's ConvWithParallelDim... spent half its time lifting those zeros);
    0 times a term that may be undefined (1/x) or infinite keeps its condition."""
    undefined = T.inverse(x)  # defined where x != 0
    cases = [
        ([0.0, 0, y, np.float32(0)], [x, y, z, T.add(x, y)]),
        ([0.0, 2.0], [undefined, y]),
        ([0.0, x], [T.POS_INF, y]),
        ([np.float64(0.0), 0.0], [np.float64(np.nan), z]),
    ]
    for xs, ys in cases:
        got = T.dot(xs, ys)
        with monkeypatch.context() as m:
            m.setattr(T, "_zero_number", lambda v: False)  # every product built
            assert got == T.dot(xs, ys)
    assert T.dot([0.0, 2.0], [undefined, y]).dom is undefined.dom

    lifted = []
    real_lift = T.lift
    monkeypatch.setattr(T, "lift", lambda v: lifted.append(v) or real_lift(v))
    assert T.dot([0.0] * 100 + [1.0], [x] * 100 + [y]) == y
    assert len(lifted) == 2  # the one product that counts
