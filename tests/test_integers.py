"""Integers are machine integers (issue 9): two's-complement wraparound at the type's width,
unsigned types, narrowing converts, XLA's integer power; and inputs get identities that no
name in the program can collide with."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import tv_ir
from tv_ir.prover import smt
from tv_ir.semantics import terms as T


def lower(f, *args) -> str:
    return jax.jit(f, keep_unused=True).lower(*args).as_text(debug_info=True)


I32 = np.zeros((4,), np.int32)


def refuted(spec: str, impl: str):
    r = tv_ir.check(spec, impl)
    assert r.verdict == "not_equivalent", r.reason
    return r.counterexample


def proved(spec: str, impl: str) -> None:
    r = tv_ir.check(spec, impl)
    assert r.verdict == "equivalent", r.reason


# -- wraparound ---------------------------------------------------------------------------


def test_successor_is_not_greater_at_int_max() -> None:
    ce = refuted(lower(lambda x: x + 1 > x, I32), lower(lambda x: jnp.ones(x.shape, bool), I32))
    (x,) = ce.inputs.values()
    assert np.iinfo(np.int32).max in np.asarray(x)


def test_successor_comparison_is_refuted_by_the_solver_alone() -> None:
    """No simulation involved: the solver's model (x = INT_MAX) is what refutes."""
    x = T.symbol(T.Key("input", 0, "i32", "x"))
    succ = T.wrap(T.add(x, T.ONE), 32, True)
    res = smt.check_equal([(T.compare("GT", succ, x), T.TRUE)])
    assert res.status == "sat"
    assert list(res.model.values()) == [2**31 - 1]


def test_wrapping_identities_are_proved() -> None:
    def cancel(a, b):
        return (a + b) - b

    def double(a, b):
        return a * 2 + (b * b) * b

    def twice(a, b):
        return a + a + b * (b * b)

    proved(lower(cancel, I32, I32), lower(lambda a, b: a, I32, I32))
    proved(lower(double, I32, I32), lower(twice, I32, I32))


def test_facts_about_wrapped_values_are_proved_by_the_solver() -> None:
    u8 = np.zeros((4,), np.uint8)
    i8 = np.zeros((3,), np.int8)
    int_max = np.iinfo(np.int32).max
    proved(lower(lambda x: x + 1 > x, I32), lower(lambda x: x != int_max, I32))
    proved(lower(lambda x: x - 1 < x, u8), lower(lambda x: x != 0, u8))
    proved(lower(lambda x: jnp.abs(x) >= 0, i8), lower(lambda x: x != -128, i8))


def test_wrapped_normal_forms() -> None:
    a, b = (T.symbol(T.Key("input", k, "i32", "ab"[k])) for k in range(2))

    def w(p):
        return T.wrap(p, 32, True)

    assert w(T.sub(w(T.add(a, b)), b)) == a
    assert w(T.scale(a, 2)) == w(T.add(a, a))
    assert w(T.scale(a, 2**32 + 1)) == a
    assert T.wrap(w(T.add(a, b)), 8, False) == T.wrap(T.add(a, b), 8, False)
    small = T.symbol(T.Key("input", 2, "i8", "c"))
    assert w(T.add(small, small)) == T.add(small, small)  # fits: no wrap
    assert T.wrap(T.const(200), 8, True) == T.const(-56)


def test_wraps_substitute_and_evaluate_exactly() -> None:
    a = T.symbol(T.Key("input", 0, "i64", "a"))
    b = T.symbol(T.Key("input", 1, "i64", "b"))
    w = T.wrap(T.mul(a, b), 64, True)
    env = {T.as_atom(a).id: 2**62 + 1, T.as_atom(b).id: 3}
    assert T.evaluate_int(w, env) == T.wrap_int((2**62 + 1) * 3, 64, True)
    # substituting b := a + 1 rebuilds the wrap (and its normal form)
    s = T.substitute(w, {T.as_atom(b).id: T.add(a, T.ONE)})
    assert s == T.wrap(T.add(T.mul(a, a), a), 64, True)
    assert T.evaluate_int(s, env) == T.wrap_int((2**62 + 1) * (2**62 + 2), 64, True)


def test_uint8_arithmetic_wraps() -> None:
    u8 = np.zeros((4,), np.uint8)

    def widened(a, b):
        return (a.astype(jnp.uint16) + b.astype(jnp.uint16)).astype(jnp.uint8)

    proved(lower(lambda a, b: a + b, u8, u8), lower(widened, u8, u8))

    def sum16(a, b):
        return a.astype(jnp.uint16) + b.astype(jnp.uint16)

    refuted(lower(sum16, u8, u8), lower(lambda a, b: (a + b).astype(jnp.uint16), u8, u8))


def test_narrowing_convert_wraps() -> None:
    def narrowed(x):
        return x.astype(jnp.int8).astype(jnp.int32)

    ce = refuted(lower(lambda x: x, I32), lower(narrowed, I32))
    (x,) = ce.inputs.values()
    assert np.any((np.asarray(x) < -128) | (np.asarray(x) > 127))
    i8 = np.zeros((4,), np.int8)
    proved(lower(lambda x: x, i8), lower(lambda x: x.astype(jnp.int32).astype(jnp.int8), i8))
    u32 = np.zeros((4,), np.uint32)
    refuted(
        lower(lambda x: x.astype(jnp.int32), np.zeros((4,), np.int16)),
        lower(lambda x: x.astype(jnp.uint16).astype(jnp.int32), np.zeros((4,), np.int16)),
    )
    proved(
        lower(lambda x: x, u32),
        lower(lambda x: x.astype(jnp.int32).astype(jnp.uint32), u32),
    )


def test_int8_dot_accumulating_in_int8_is_refuted() -> None:
    a = np.zeros((2, 8), np.int8)
    b = np.zeros((8, 2), np.int8)

    def wide(a, b):
        return jnp.dot(a, b, preferred_element_type=jnp.int32)

    def narrow(a, b):
        return jnp.dot(a, b).astype(jnp.int32)

    refuted(lower(wide, a, b), lower(narrow, a, b))
    # accumulating in int32 and narrowing at the end is the int8 product
    proved(
        lower(lambda a, b: jnp.dot(a, b), a, b),
        lower(lambda a, b: wide(a, b).astype(jnp.int8), a, b),
    )


def test_int8_psum_overflows() -> None:
    mesh = Mesh(np.array(jax.devices()[:4]), ("i",))
    x = np.zeros((8, 4), np.int8)

    def spec(x):
        return x.astype(jnp.int32).sum(0, keepdims=True)

    def body(x):
        return jax.lax.psum(x.sum(0, keepdims=True, dtype=jnp.int8), "i")

    impl = jax.shard_map(body, mesh=mesh, in_specs=P("i", None), out_specs=P(None, None))
    refuted(lower(spec, x), lower(lambda x: impl(x).astype(jnp.int32), x))
    proved(lower(lambda x: x.sum(0, keepdims=True, dtype=jnp.int8), x), lower(impl, x))


POWER = """
func.func @main(%x: tensor<4xi32>) -> tensor<4xi32> {
  %e = stablehlo.constant dense<EXP> : tensor<4xi32>
  %y = stablehlo.power %x, %e : tensor<4xi32>
  return %y : tensor<4xi32>
}
"""

RECIPROCAL = """
func.func @main(%x: tensor<4xi32>) -> tensor<4xi32> {
  %one = stablehlo.constant dense<1> : tensor<4xi32>
  %m1 = stablehlo.constant dense<-1> : tensor<4xi32>
  %zero = stablehlo.constant dense<0> : tensor<4xi32>
  %is1 = stablehlo.compare EQ, %x, %one : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi1>
  %ism1 = stablehlo.compare EQ, %x, %m1 : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi1>
  %a = stablehlo.select %ism1, %m1, %zero : tensor<4xi1>, tensor<4xi32>
  %y = stablehlo.select %is1, %one, %a : tensor<4xi1>, tensor<4xi32>
  return %y : tensor<4xi32>
}
"""

CUBE = """
func.func @main(%x: tensor<4xi32>) -> tensor<4xi32> {
  %a = stablehlo.multiply %x, %x : tensor<4xi32>
  %y = stablehlo.multiply %a, %x : tensor<4xi32>
  return %y : tensor<4xi32>
}
"""


def test_integer_power_follows_xla() -> None:
    """x ** -1 is 1 at 1, -1 at -1 and 0 elsewhere (not the real reciprocal)."""
    proved(POWER.replace("EXP", "-1"), RECIPROCAL)
    proved(POWER.replace("EXP", "3"), CUBE)
    # six squarings: the exponent is taken modulo 64
    proved(POWER.replace("EXP", "67"), CUBE)
    refuted(POWER.replace("EXP", "-1"), POWER.replace("EXP", "0"))


# -- identity of inputs --------------------------------------------------------------------


class _Key:
    """A dict key whose every instance prints the same (so pytree paths repeat)."""

    def __init__(self, i):
        self.i = i

    def __repr__(self) -> str:
        return "'k'"

    def __lt__(self, other) -> bool:
        return self.i < other.i

    def __hash__(self) -> int:
        return hash(self.i)

    def __eq__(self, other) -> bool:
        return isinstance(other, _Key) and other.i == self.i


def test_pytree_leaves_with_the_same_path_are_different_inputs() -> None:
    d = {_Key(0): np.float32(1.0), _Key(1): np.float32(1.0)}

    def spec(d):
        return jnp.where(d[_Key(0)] + d[_Key(1)] == 0, 1.0, 0.0)

    def impl(d):
        return jnp.where(d[_Key(0)] == 0, 1.0, 0.0)

    text = lower(spec, d)
    assert text.count("loc(\"d['k']\")") >= 2
    ce = refuted(text, lower(impl, d))
    assert len(ce.inputs) == 2  # both arguments are reported, under distinct names


SAME_NAME = """
func.func @main(%a: tensor<f32> loc("x"), %b: tensor<f32> loc("x")) -> tensor<f32> {
  %d = stablehlo.subtract %a, %b : tensor<f32>
  return %d : tensor<f32>
}
"""

ZERO = """
func.func @main(%a: tensor<f32>, %b: tensor<f32>) -> tensor<f32> {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  return %z : tensor<f32>
}
"""

SAME_NAME_EQ = """
func.func @main(%a: tensor<f32> loc("x"), %b: tensor<f32> loc("x")) -> tensor<i1> {
  %s = stablehlo.add %a, %b : tensor<f32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %c = stablehlo.compare EQ, %s, %z : (tensor<f32>, tensor<f32>) -> tensor<i1>
  return %c : tensor<i1>
}
"""

FIRST_IS_ZERO = """
func.func @main(%a: tensor<f32>, %b: tensor<f32>) -> tensor<i1> {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %c = stablehlo.compare EQ, %a, %z : (tensor<f32>, tensor<f32>) -> tensor<i1>
  return %c : tensor<i1>
}
"""


def test_arguments_with_the_same_name_are_different_inputs() -> None:
    refuted(SAME_NAME, ZERO)
    refuted(SAME_NAME_EQ, FIRST_IS_ZERO)  # equal a.e.: only the solver tells them apart


HALF = """
func.func @main(%x: tensor<f32> loc("NAME")) -> tensor<i1> {
  %two = stablehlo.constant dense<2.0> : tensor<f32>
  %one = stablehlo.constant dense<1.0> : tensor<f32>
  %d = stablehlo.multiply %x, %two : tensor<f32>
  %c = stablehlo.compare EQ, %d, %one : (tensor<f32>, tensor<f32>) -> tensor<i1>
  return %c : tensor<i1>
}
"""

NEVER = """
func.func @main(%x: tensor<f32>) -> tensor<i1> {
  %f = stablehlo.constant dense<false> : tensor<i1>
  return %f : tensor<i1>
}
"""


@pytest.mark.parametrize("name", ["x", "x:int"])
def test_a_float_argument_named_like_an_integer_is_real(name) -> None:
    ce = refuted(HALF.replace("NAME", name), NEVER)
    assert float(np.asarray(ce.inputs[name])) == 0.5


CUT_ALIAS_SPEC = """
func.func @main(%p: tensor<f32> loc("NAME"), %q: tensor<f32> loc("q")) -> tensor<i1> {
  %t = stablehlo.add %p, %q : tensor<f32>
  %d = stablehlo.subtract %t, %p : tensor<f32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %c = stablehlo.compare EQ, %d, %z : (tensor<f32>, tensor<f32>) -> tensor<i1>
  return %c : tensor<i1>
}
"""

CUT_ALIAS_IMPL = """
func.func @main(%p: tensor<f32>, %q: tensor<f32>) -> tensor<i1> {
  %t = stablehlo.add %p, %q : tensor<f32>
  %d = stablehlo.subtract %t, %p : tensor<f32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %c = stablehlo.compare EQ, %d, %z : (tensor<f32>, tensor<f32>) -> tensor<i1>
  %one = stablehlo.constant dense<1.0> : tensor<f32>
  %c2 = stablehlo.compare EQ, %p, %one : (tensor<f32>, tensor<f32>) -> tensor<i1>
  %o = stablehlo.or %c, %c2 : tensor<i1>
  return %o : tensor<i1>
}
"""


@pytest.mark.parametrize("name", ["p", "%add1"])
def test_an_argument_named_like_a_cut_point_is_an_input(name) -> None:
    """The spec's first cut-point was once the symbol `%add1`: an argument of that name was
    the same symbol. Here the programs differ only where p = 1 (and q != 0)."""
    ce = refuted(CUT_ALIAS_SPEC.replace("NAME", name), CUT_ALIAS_IMPL)
    assert float(np.asarray(ce.inputs[name])) == 1.0


def test_solver_variables_are_named_by_identity() -> None:
    a = T.symbol(T.Key("input", 0, "f32", "x"))
    b = T.symbol(T.Key("input", 1, "f32", "x"))
    assert a != b and repr(a) == repr(b) == "x"
    assert smt.check_equal([(a, b)]).status == "sat"


UPOWER = """
func.func @main(%x: tensor<4xui8>) -> tensor<4xui8> {
  %e = stablehlo.constant dense<255> : tensor<4xui8>
  %y = stablehlo.power %x, %e : tensor<4xui8>
  return %y : tensor<4xui8>
}
"""

UFLIP = """
func.func @main(%x: tensor<4xui8>) -> tensor<4xui8> {
  %one = stablehlo.constant dense<1> : tensor<4xui8>
  %max = stablehlo.constant dense<255> : tensor<4xui8>
  %zero = stablehlo.constant dense<0> : tensor<4xui8>
  %is1 = stablehlo.compare EQ, %x, %one : (tensor<4xui8>, tensor<4xui8>) -> tensor<4xi1>
  %ismax = stablehlo.compare EQ, %x, %max : (tensor<4xui8>, tensor<4xui8>) -> tensor<4xi1>
  %a = stablehlo.select %ismax, %max, %zero : tensor<4xi1>, tensor<4xui8>
  %y = stablehlo.select %is1, %one, %a : tensor<4xi1>, tensor<4xui8>
  return %y : tensor<4xui8>
}
"""


def test_unsigned_power_reads_the_exponent_and_base_as_signed() -> None:
    """ui8: x ** 255 is x ** -1: 1 at 1, 255 (-1) at 255 (-1), else 0."""
    proved(UPOWER, UFLIP)


# -- terms agree with XLA's integers on random programs ----------------------------------

_TYPES = ["i8", "ui8", "i16", "i32", "ui32"]


def _random_program(rng) -> tuple[str, list[str]]:
    """A straight-line program of integer ring ops, converts, max and selects."""
    arg_types = [str(rng.choice(_TYPES)) for _ in range(3)]
    vals = [(f"%a{k}", t) for k, t in enumerate(arg_types)]
    lines, n = [], [0]

    def fresh():
        n[0] += 1
        return f"%v{n[0]}"

    def as_type(v, t):
        if v[1] == t:
            return v
        r = fresh()
        lines.append(f"{r} = stablehlo.convert {v[0]} : (tensor<{v[1]}>) -> tensor<{t}>")
        return (r, t)

    for _ in range(int(rng.integers(2, 9))):
        kind = str(rng.choice(["add", "subtract", "multiply", "negate", "convert", "maximum"]))
        x = vals[int(rng.integers(len(vals)))]
        if kind == "convert":
            vals.append(as_type(x, str(rng.choice(_TYPES))))
            continue
        r = fresh()
        if kind == "negate":
            lines.append(f"{r} = stablehlo.negate {x[0]} : tensor<{x[1]}>")
        else:
            y = as_type(vals[int(rng.integers(len(vals)))], x[1])
            lines.append(f"{r} = stablehlo.{kind} {x[0]}, {y[0]} : tensor<{x[1]}>")
        vals.append((r, x[1]))
        if rng.random() < 0.3:  # a comparison of wrapped values choosing between two
            y = as_type(vals[int(rng.integers(len(vals)))], x[1])
            c, s = fresh(), fresh()
            lines.append(
                f"{c} = stablehlo.compare GT, {r}, {y[0]} : "
                f"(tensor<{x[1]}>, tensor<{x[1]}>) -> tensor<i1>"
            )
            lines.append(f"{s} = stablehlo.select {c}, {y[0]}, {r} : tensor<i1>, tensor<{x[1]}>")
            vals.append((s, x[1]))
    out = vals[-1]
    args = ", ".join(f"{v}: tensor<{t}>" for v, t in vals[:3])
    body = "\n  ".join(lines)
    text = f"""
func.func @main({args}) -> tensor<{out[1]}> {{
  {body}
  return {out[0]} : tensor<{out[1]}>
}}
"""
    return text, arg_types


def test_wrapped_terms_evaluate_like_the_machine() -> None:
    from tv_ir.ir.program import NUMPY_DTYPE
    from tv_ir.semantics.interpreters.interp import Interpreter, evaluate
    from tv_ir.semantics.symbolic import SymbolicAlgebra

    rng = np.random.default_rng(0)
    for _ in range(60):
        text, arg_types = _random_program(rng)
        module = tv_ir.load(text)
        syms = [T.symbol(T.Key("input", k, t, f"a{k}")) for k, t in enumerate(arg_types)]
        inputs = [np.array(s, dtype=object).reshape(()) for s in syms]
        (term,) = Interpreter(module, SymbolicAlgebra()).run(module.main, inputs)
        term = np.asarray(term).reshape(())[()]
        for _ in range(20):
            vals = []
            for t in arg_types:
                info = np.iinfo(NUMPY_DTYPE[t])
                edges = [info.min, info.min + 1, 0, 1, info.max - 1, info.max]
                v = rng.choice(edges) if rng.random() < 0.5 else rng.integers(info.min, info.max)
                vals.append(np.array(v, dtype=NUMPY_DTYPE[t]))
            (want,) = evaluate(module, vals)
            env = {T.as_atom(s).id: int(v) for s, v in zip(syms, vals, strict=True)}
            assert T.evaluate_int(term, env) == int(want), (text, vals, term)


def test_extreme_integers_overflowing_floats_are_no_counterexample() -> None:
    """Integers near their extremes, converted to floats, overflow exp in float64 (NaN in one
    program, a number in the other): over the reals the programs agree, so neither the
    extreme simulation run nor a solver model on such integers may refute."""
    x = np.zeros((4,), np.int32)

    def spec(x):
        e = jnp.exp(x.astype(jnp.float32))
        return e / e.sum()

    def impl(x):
        f = x.astype(jnp.float32)
        e = jnp.exp(f - f.max())
        return e / e.sum()

    r = tv_ir.check(lower(spec, x), lower(impl, x))
    assert r.verdict != "not_equivalent", r.counterexample


def test_an_integer_output_differs_where_a_float_output_overflows() -> None:
    """Adam's bias correction with a step counter: `count + 1` wraps at INT_MAX where the
    spec saturates (optax's `safe_increment`). At that count `0.9 ** count` overflows
    floats, so the float output is no evidence, but the counter output is: refuted there
    (once `unknown`: "the solver found a difference", every replay discarded)."""
    p = np.zeros((4,), np.float32)
    c = np.int32(0)

    def spec(p, g, c):
        c2 = jnp.where(c < jnp.iinfo(jnp.int32).max, c + 1, c)
        return p - 0.1 * g / (1 - 0.9**c2), c2

    def impl(p, g, c):
        c2 = c + 1
        return p - 0.1 * g / (1 - 0.9**c2), c2

    r = tv_ir.check(lower(spec, p, p, c), lower(impl, p, p, c))
    assert r.verdict == "not_equivalent", str(r)
    assert r.counterexample.output == 1
    assert int(r.counterexample.inputs["c"]) == np.iinfo(np.int32).max
