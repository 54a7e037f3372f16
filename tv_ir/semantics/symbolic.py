"""The symbolic element algebra: numpy object arrays of terms (tv_ir.semantics.terms).

It derives from the concrete algebra and overrides only element arithmetic: when every
operand is concrete, the concrete method runs (constant folding, so index computations
never become symbols); otherwise the operation is applied element by element to terms.
"""

from __future__ import annotations

import numpy as np

from tv_ir.errors import Unsupported
from tv_ir.ir.float_constants import EXACT, exact_reciprocal
from tv_ir.ir.program import TensorType
from tv_ir.semantics import terms as T
from tv_ir.semantics.algebra import NumpyAlgebra
from tv_ir.semantics.run_tables import run_table
from tv_ir.semantics.scale_symbols import SCALE_KEY, SCALE_KIND, parse_scale_key


class ComplexTerm:
    """A complex element of a symbolic tensor: its real and imaginary parts as terms.

    Only ops that know complex numbers take these apart (tv_ir.semantics.ops.complex_numbers); any
    other use of one as a real number is unsupported (`float()` raises), never a guess."""

    __slots__ = ("re", "im")

    def __init__(self, re: T.Poly, im: T.Poly):
        self.re, self.im = re, im

    def __float__(self) -> float:
        raise Unsupported("a complex value where a real number is expected")

    def __eq__(self, other) -> bool:
        return isinstance(other, ComplexTerm) and self.re == other.re and self.im == other.im

    def __hash__(self) -> int:
        return hash((self.re, self.im))

    def __repr__(self) -> str:
        return f"({self.re!r} + i*{self.im!r})"


def _complex_parts_of(e) -> tuple:
    if isinstance(e, ComplexTerm):
        return e.re, e.im
    if isinstance(e, complex):
        return float(e.real), float(e.imag)
    if isinstance(e, T.Poly):
        imag = _imaginary_companion(e)
        if imag is not None:
            return e, imag
    if isinstance(e, (T.Poly, T.Bool)):  # a term standing for a whole complex number
        raise Unsupported("a complex value given as one term (not a pair of parts)")
    return e, 0.0


def _imaginary_companion(e: T.Poly) -> T.Poly | None:
    """A complex argument's element is one symbol (the prover's inputs are one symbol per
    element): it stands for the real part, and a companion symbol of the same argument and
    index for the imaginary part, so a proof holds for every complex input."""
    a = T.as_atom(e)
    if a is None or a.kind != "sym" or not isinstance(a.args[0], T.Key):
        return None
    key, index = a.args
    if key.kind != "input" or not str(key.dtype).startswith("complex"):
        return None
    imag = T.Key("input.imag", key.number, key.dtype, f"{key.name}.imag")
    return T.symbol(imag, index)


def _exact_reciprocal(f: float):
    """The rational a float64 constant stands for: one passes/reciprocal_constants.py read
    it as, or 1/n for a float64 1/n rounded (n no power of 2, whose reciprocals are exact)."""
    r = EXACT.get(f) or exact_reciprocal(f)
    if r is None or r.denominator & (r.denominator - 1) == 0:
        return None
    return r


def _sym(*xs) -> bool:
    return any(isinstance(x, np.ndarray) and x.dtype == object for x in xs)


def _ufunc(f, nin):
    u = np.frompyfunc(f, nin, 1)

    def apply(*xs):
        with np.errstate(all="ignore"):  # constants folded as IEEE values (1/0 is inf)
            out = u(*xs)
        return out if isinstance(out, np.ndarray) else _scalar(out)

    return apply


def _scalar(x):
    a = np.empty((), dtype=object)
    a[()] = x
    return a


def _lifted2(f):
    return _ufunc(lambda a, b: f(T.lift(a), T.lift(b)), 2)


_add = _lifted2(T.add)
_sub = _lifted2(T.sub)
_mul = _lifted2(T.mul)
_div = _lifted2(T.div)
_neg = _ufunc(lambda a: T.neg(T.lift(a)), 1)
_max = _ufunc(lambda a, b: T.maximum((a, b), True), 2)
_min = _ufunc(lambda a, b: T.maximum((a, b), False), 2)
_abs = _ufunc(lambda a: T.maximum((T.lift(a), T.neg(T.lift(a))), True), 1)


def _select_one(c, a, b):
    c = T.lift_bool(c)
    if c.kind == "const":  # the other branch is never lifted (it may be a NaN fill value)
        return T.lift(a if c.args[0] else b)
    return T.select(c, T.lift(a), T.lift(b))


_select = _ufunc(_select_one, 3)
_and = _ufunc(lambda a, b: T.logical_and(T.lift_bool(a), T.lift_bool(b)), 2)
_or = _ufunc(lambda a, b: T.logical_or(T.lift_bool(a), T.lift_bool(b)), 2)
_xor = _ufunc(lambda a, b: T.logical_xor(T.lift_bool(a), T.lift_bool(b)), 2)
_not = _ufunc(lambda a: T.logical_not(T.lift_bool(a)), 1)
_to_poly = _ufunc(T.lift, 1)
_nonzero = _ufunc(lambda a: T.logical_not(T.compare("EQ", T.lift(a), T.ZERO)), 1)


def _pow(a, b):
    a, b = T.lift(a), T.lift(b)
    if b.is_const():
        e = b.const_value()
        if e == int(e):
            return T.power_int(a, int(e))
        if e == T.Fraction(1, 2):
            return T.fn("sqrt", a)
        if e == T.Fraction(-1, 2):
            return T.fn("rsqrt", a)
    return T.power(a, b)


_power = _ufunc(_pow, 2)
_atan2 = _ufunc(lambda a, b: T.atan2(T.lift(a), T.lift(b)), 2)
_is_finite = _ufunc(T.is_finite, 1)


def _int_pow(a, e: int, minus_one: int):
    """XLA's integer power with a known exponent (read as a signed integer): x ** (e mod 64)
    for e >= 0 (six squarings; the result wraps), else 1 if x == 1, +-1 if x == -1 (as a
    signed integer: `minus_one` is its value in x's type), else 0."""
    a = T.lift(a)
    if e >= 0:
        return T.power_int(a, e % 64)
    sign = T.const(-1 if e % 2 else 1)
    rest = T.select(T.compare("EQ", a, T.const(minus_one)), sign, T.ZERO)
    return T.select(T.compare("EQ", a, T.ONE), T.ONE, rest)


def machine_integers(x, t: TensorType):
    """Symbolic elements of an integer tensor of type t as machine integers (wrapped)."""
    r = T.dtype_range(t.dtype)
    if t.is_float or t.is_bool or r is None:
        return x
    bits = int(np.dtype(t.numpy_dtype).itemsize * 8)
    signed = r[0] < 0

    def one(e):
        if isinstance(e, T.Poly):
            return T.wrap(e, bits, signed)
        if isinstance(e, T.Bool):
            return T.wrap(T.lift(e), bits, signed)
        return T.wrap_int(int(e), bits, signed)

    return _ufunc(one, 1)(x)


# unary math functions are opaque atoms of canonical arguments
def _unary_term(name):
    def f(a):
        return T.fn(name, T.lift(a))

    return _ufunc(f, 1)


_UNARY = {}


def _folding(unit, binary, lift):
    """An n-ary reduction from a binary term operation and its unit."""

    def fold(items):
        out = unit
        for e in items:
            out = binary(out, lift(e))
        return out

    return fold


_product = _folding(T.ONE, T.mul, T.lift)
_conjunction = _folding(T.TRUE, T.logical_and, T.lift_bool)
_disjunction = _folding(T.FALSE, T.logical_or, T.lift_bool)


# the value each table symbol has in simulation (atom id -> its element of the table): the
# table's own values, as concrete runs read them
TABLE_VALUES: dict[int, float] = run_table({})


class SymbolicAlgebra(NumpyAlgebra):
    """Element arithmetic on terms; falls back to numpy when all operands are concrete."""

    symbolic = True

    def is_symbolic(self, x) -> bool:
        return _sym(x)

    def complex_parts(self, x) -> tuple:
        if not _sym(x):
            return super().complex_parts(x)
        x = np.asarray(x)
        re, im = np.empty(x.shape, dtype=object), np.empty(x.shape, dtype=object)
        for idx in np.ndindex(*x.shape):
            re[idx], im[idx] = _complex_parts_of(x[idx])
        return re, im

    def make_complex(self, re, im):
        if not _sym(re, im):
            return super().make_complex(re, im)
        re, im = np.broadcast_arrays(np.asarray(re), np.asarray(im))
        out = np.empty(re.shape, dtype=object)
        for idx in np.ndindex(*re.shape):
            out[idx] = ComplexTerm(T.lift(re[idx]), T.lift(im[idx]))
        return out

    def constant(self, value: np.ndarray, t: TensorType) -> np.ndarray:
        """As numpy holds it, except that a read reciprocal 1/n (tv_ir/ir/float_constants.py)
        is the exact rational: arithmetic on it with other constants is then exact, as it is
        where it meets a term (in float64, `72 * (1/72)` need not be 1)."""
        out = super().constant(value, t)
        if out.dtype.kind != "f" or not out.size:
            return out
        first = out.reshape(-1)[0]
        if np.all(out == first):  # one number (a splat): looked up once
            exact = _exact_reciprocal(float(first))
            if exact is None:
                return out
            arr = np.empty(out.shape, dtype=object)
            arr.fill(exact)
            return arr
        return out

    def table(self, value: np.ndarray, t: TensorType, key: str) -> np.ndarray:
        """One symbol per element, named by the real table and the element's index: both
        programs read the same symbols, and a proof holds for every value of the table."""
        if key.startswith(SCALE_KEY):
            return self._scale(value, key)
        content, _, real = key.partition(":")
        name = T.Key("table", content, t.dtype, f"table.{content[:8]}")
        real_shape = tuple(int(n) for n in real.split("x")) if real else value.shape
        arr = np.empty(value.shape, dtype=object)
        for idx in np.ndindex(*value.shape):
            # element idx of the reduced table is element idx of the real one (its leading
            # block), named by its row-major position there: a reshaped copy of the table
            # names it alike
            flat = int(np.ravel_multi_index(idx, real_shape)) if real_shape else 0
            arr[idx] = T.symbol(name, (flat,))
            TABLE_VALUES[T.as_atom(arr[idx]).id] = float(value[idx])
        return arr

    def _scale(self, value: np.ndarray, key: str) -> np.ndarray:
        """A splat scale standing for any positive number (scale_symbols.py): every element
        is sign * s**e of one symbol s > 0, the same in both programs."""
        base, e, sign = parse_scale_key(key)
        s = T.symbol(T.Key(SCALE_KIND, float(base).hex(), "f64", f"scale.{base:g}"), ())
        T.note_sign(s, 2)
        TABLE_VALUES[T.as_atom(s).id] = base
        term = s if e == 1 else T.inverse(s)
        term = term if sign > 0 else T.neg(term)
        arr = np.empty(value.shape, dtype=object)
        arr.fill(term)
        return arr

    def convert(self, x, src: TensorType, dst: TensorType):
        if not _sym(x):
            return super().convert(x, src, dst)
        if dst.is_bool:
            return x if src.is_bool else _nonzero(x)
        if src.is_bool:
            return _to_poly(x)
        if src.is_float and not dst.is_float:
            raise Unsupported("float-to-integer conversion of a value that depends on the inputs")
        return _to_poly(x)  # float<->float and int->float: the same real number

    def add(self, x, y):
        return _add(x, y) if _sym(x, y) else super().add(x, y)

    def subtract(self, x, y):
        return _sub(x, y) if _sym(x, y) else super().subtract(x, y)

    def multiply(self, x, y):
        return _mul(x, y) if _sym(x, y) else super().multiply(x, y)

    def divide(self, x, y):
        return _div(x, y) if _sym(x, y) else super().divide(x, y)

    def int_divide(self, x, y):
        if _sym(x, y):
            raise Unsupported("integer division of values that depend on the inputs")
        return super().int_divide(x, y)

    def remainder(self, x, y):
        if _sym(x, y):
            raise Unsupported("remainder of values that depend on the inputs")
        return super().remainder(x, y)

    def negate(self, x):
        return _neg(x) if _sym(x) else super().negate(x)

    def abs(self, x):
        return _abs(x) if _sym(x) else super().abs(x)

    def sign(self, x):
        return self.unary("sign", x) if _sym(x) else super().sign(x)

    def maximum(self, x, y):
        return _max(x, y) if _sym(x, y) else super().maximum(x, y)

    def minimum(self, x, y):
        return _min(x, y) if _sym(x, y) else super().minimum(x, y)

    def power(self, x, y):
        return _power(x, y) if _sym(x, y) else super().power(x, y)

    def int_power(self, x, y, base: TensorType, exponent: TensorType):
        """Integer power (XLA's rule; see NumpyAlgebra._int_power) of a symbolic base: the
        exponent must be known."""
        if not _sym(x, y):
            return super().power(x, y)
        e = self._concrete(y, "an integer exponent").astype(object)
        bits = int(np.dtype(exponent.numpy_dtype).itemsize * 8)
        e = _ufunc(lambda v: T.wrap_int(int(v), bits, True), 1)(e)
        r = T.dtype_range(base.dtype)
        minus_one = -1 if r is None or r[0] < 0 else r[1]
        return _ufunc(lambda a, v: _int_pow(a, v, minus_one), 2)(x, e)

    def bitcast(self, x, src: TensorType, dst: TensorType):
        if not _sym(x):
            return super().bitcast(x, src, dst)
        from tv_ir.semantics.bit_casts import bitcast_terms

        return bitcast_terms(x, src, dst)

    def unary(self, fn: str, x):
        if not _sym(x):
            return super().unary(fn, x)
        if fn == "is_finite":  # where it is defined (a guard of a partial op is not folded)
            return _is_finite(x)
        f = _UNARY.get(fn)
        if f is None:
            f = _UNARY[fn] = _unary_term(fn)
        return f(x)

    def atan2(self, x, y):
        return _atan2(x, y) if _sym(x, y) else super().atan2(x, y)

    def compare(self, direction: str, x, y):
        if not _sym(x, y):
            return super().compare(direction, x, y)
        return _ufunc(lambda a, b: T.compare(direction, a, b), 2)(x, y)

    def compare_total(self, direction: str, x, y):
        if not _sym(x, y):
            return super().compare_total(direction, x, y)
        return _ufunc(lambda a, b: T.compare(direction, a, b, total_order=True), 2)(x, y)

    def select(self, pred, on_true, on_false):
        if not _sym(pred, on_true, on_false):
            return super().select(pred, on_true, on_false)
        if not _sym(pred):
            return np.where(pred, on_true, on_false)  # the choice is known per element
        return _select(pred, on_true, on_false)

    def logical_and(self, x, y):
        return _and(x, y) if _sym(x, y) else super().logical_and(x, y)

    def logical_or(self, x, y):
        return _or(x, y) if _sym(x, y) else super().logical_or(x, y)

    def logical_xor(self, x, y):
        return _xor(x, y) if _sym(x, y) else super().logical_xor(x, y)

    def logical_not(self, x):
        return _not(x) if _sym(x) else super().logical_not(x)

    def shift(self, kind, x, y):
        if _sym(x, y):
            raise Unsupported("bit shifts of values that depend on the inputs")
        return super().shift(kind, x, y)

    def popcnt(self, x):
        if _sym(x):
            raise Unsupported("popcnt of a value that depends on the inputs")
        return super().popcnt(x)

    def count_leading_zeros(self, x):
        if _sym(x):
            raise Unsupported("count_leading_zeros of a value that depends on the inputs")
        return super().count_leading_zeros(x)

    # -- values that must be concrete -------------------------------------------------
    def _concrete(self, x, what: str):
        if not _sym(x):
            return np.asarray(x)
        flat = []
        for e in np.asarray(x).reshape(-1):
            if isinstance(e, T.Poly) and e.is_const():
                flat.append(e.const_value())
            elif isinstance(e, T.Bool) and e.kind == "const":
                flat.append(e.args[0])
            elif isinstance(e, (T.Poly, T.Bool)):
                raise Unsupported(f"{what} depends on the inputs (data-dependent control/indexing)")
            else:
                flat.append(e)
        return np.array(flat).reshape(np.shape(x))

    def index(self, x) -> int:
        return int(self._concrete(x, "an index").reshape(()))

    def known_index(self, x) -> int | None:
        try:
            return self.index(np.asarray(x, dtype=object))
        except Unsupported:
            return None

    def truth(self, x) -> bool:
        return bool(self._concrete(x, "a control-flow predicate").reshape(()))

    def indices(self, x) -> np.ndarray:
        return self._concrete(x, "a gather/scatter index").astype(np.int64)

    # -- reductions ----------------------------------------------------------------------
    def _rows(self, x, axes):
        x = np.asarray(x)
        rest = [d for d in range(x.ndim) if d not in axes]
        moved = np.transpose(x, rest + list(axes))
        keep = moved.shape[: len(rest)]
        n = int(np.prod(moved.shape[len(rest) :], dtype=np.int64))  # -1 fails on empty arrays
        return moved.reshape(keep + (n,)), keep

    def _reduce(self, x, axes, f):
        rows, keep = self._rows(x, axes)
        out = np.empty(keep, dtype=object)
        for i in np.ndindex(*keep):
            out[i] = f(list(rows[i]))
        return out

    def reduce_sum(self, x, axes):
        if not _sym(x):
            return super().reduce_sum(x, axes)
        return self._reduce(x, axes, T.sum_of)

    def reduce_prod(self, x, axes):
        if not _sym(x):
            return super().reduce_prod(x, axes)
        return self._reduce(x, axes, _product)

    def reduce_max(self, x, axes):
        if not _sym(x):
            return super().reduce_max(x, axes)
        return self._reduce(x, axes, lambda items: T.maximum(items, True))

    def reduce_min(self, x, axes):
        if not _sym(x):
            return super().reduce_min(x, axes)
        return self._reduce(x, axes, lambda items: T.maximum(items, False))

    def reduce_and(self, x, axes):
        if not _sym(x):
            return super().reduce_and(x, axes)
        return self._reduce(x, axes, _conjunction)

    def reduce_or(self, x, axes):
        if not _sym(x):
            return super().reduce_or(x, axes)
        return self._reduce(x, axes, _disjunction)

    def matmul(self, a, b):
        if not _sym(a, b):
            return super().matmul(a, b)
        a, b = np.asarray(a), np.asarray(b)
        B, M, K = a.shape
        N = b.shape[2]
        out = np.empty((B, M, N), dtype=object)
        for i in range(B):
            bt = [list(b[i, :, n]) for n in range(N)]
            for m in range(M):
                row = list(a[i, m, :])
                for n in range(N):
                    out[i, m, n] = T.dot(row, bt[n])
        return out
