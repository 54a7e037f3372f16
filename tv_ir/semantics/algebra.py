"""The concrete element algebra: numpy arrays, floats widened to float64.

Every piece of element arithmetic an op evaluator does goes through one of these methods,
so the symbolic algebra (tv_ir.semantics.symbolic) only has to override them. Floats are reals: a
float-to-float `convert` is the identity; integers keep their machine dtype here (the
conformance tests compare with XLA bit for bit on integers).
"""

from __future__ import annotations

import math

import numpy as np

from tv_ir.ir.program import TensorType, storage_dtype

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _lgamma_scalar(x: float) -> float:
    try:
        return math.lgamma(x)
    except ValueError:  # the poles 0, -1, -2, ...: log|Gamma| is +inf (as XLA returns)
        return math.inf


_lgamma = np.vectorize(_lgamma_scalar, otypes=[np.float64])


def _int_min_by_minus_one(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Where a signed division overflows (INT_MIN / -1)."""
    if x.dtype.kind != "i":
        return np.zeros(x.shape, dtype=bool)
    return (x == np.iinfo(x.dtype).min) & (y == -1)


def _total_order_key(x) -> np.ndarray:
    """int64 keys ordered like IEEE-754 totalOrder of the float64 values `x`."""
    bits = np.asarray(x, dtype=np.float64).view(np.int64)
    return bits ^ ((bits >> 63) & np.int64(0x7FFFFFFFFFFFFFFF))


try:  # numpy's own error state, set without rebuilding it per call (numpy is pinned)
    from numpy._core._ufunc_config import _extobj_contextvar, _make_extobj

    _IGNORE_ALL = _make_extobj(all="ignore")
except ImportError:  # another numpy: its public context manager (slower per call)
    _extobj_contextvar = None


class _Quiet:
    """`np.errstate(all="ignore")` for one element operation: overflow, division by zero and
    invalid values give IEEE results (inf, nan) without warnings. The error state is made
    once, not at every call (a multiply of two small arrays: 1.4 -> 0.9 microseconds)."""

    __slots__ = ("token",)

    def __enter__(self) -> None:
        self.token = _extobj_contextvar.set(_IGNORE_ALL)

    def __exit__(self, *exc) -> None:
        _extobj_contextvar.reset(self.token)


def _numpy_errstate() -> np.errstate:
    return np.errstate(all="ignore")


# `with quiet_floats():` around numpy arithmetic that may overflow or divide by zero
quiet_floats = _Quiet if _extobj_contextvar is not None else _numpy_errstate


class NumpyAlgebra:
    """Concrete semantics of element operations over numpy arrays."""

    symbolic = False

    # -- constants and conversion ------------------------------------------------------
    def constant(self, value: np.ndarray, t: TensorType) -> np.ndarray:
        return np.asarray(value, dtype=t.numpy_dtype)

    def table(self, value: np.ndarray, t: TensorType, key: str) -> np.ndarray:
        """A constant that stands for any table of its shape (ops.shape.TABLE_ATTR): run
        concretely, its own values."""
        return self.constant(value, t)

    def convert(self, x, src: TensorType, dst: TensorType):
        with quiet_floats():
            if dst.is_bool:
                return np.asarray(x) != 0
            if dst.is_float:
                return np.asarray(x, dtype=np.float64)
            if src.is_float:
                # float -> int: round toward zero, saturating at the integer range, NaN -> 0
                # (XLA's CPU rule). Compare in float64 before casting: float(int64 max) is 2**63.
                info = np.iinfo(dst.numpy_dtype)
                y = np.trunc(np.asarray(x, dtype=np.float64))
                hi, lo = y >= float(info.max), y <= float(info.min)
                mid = np.where(hi | lo | np.isnan(y), 0, y).astype(dst.numpy_dtype)
                return np.where(hi, info.max, np.where(lo, info.min, mid)).astype(dst.numpy_dtype)
            return np.asarray(x).astype(dst.numpy_dtype)

    def bitcast(self, x, src: TensorType, dst: TensorType):
        """bitcast_convert of concrete values: floats are first rounded to their own width
        (exact for values of that type), the bits reinterpreted little-endian (XLA:CPU);
        a narrower result gets a trailing dimension, a wider one consumes it. Leading
        dimensions beyond `src`'s (a region run on arrays: a sort's comparator on whole
        lanes) are kept, element by element."""
        x = np.asarray(x)
        lead = x.shape[: x.ndim - len(src.shape)]
        with np.errstate(over="ignore", invalid="ignore"):  # past the type's range: inf
            bits = np.ascontiguousarray(x.astype(storage_dtype(src)))
        if lead and not src.shape and storage_dtype(src).itemsize != storage_dtype(dst).itemsize:
            bits = bits[..., None]  # a scalar's bits widened or split along a dimension of its own
        out = bits.view(storage_dtype(dst)).reshape(lead + tuple(dst.shape))
        return out.astype(np.float64) if dst.is_float else out

    def is_symbolic(self, x) -> bool:
        return False

    # -- complex numbers: a complex tensor is its real and imaginary parts ----------------
    def complex_parts(self, x) -> tuple:
        """(real part, imaginary part) of a complex tensor, as float64 arrays."""
        x = np.asarray(x)
        return np.real(x).astype(np.float64), np.imag(x).astype(np.float64)

    def make_complex(self, re, im):
        """The complex tensor re + i*im (built part by part: 1j * inf would make a NaN)."""
        re, im = np.broadcast_arrays(np.asarray(re, np.float64), np.asarray(im, np.float64))
        out = np.empty(re.shape, dtype=np.complex128)
        out.real, out.imag = re, im
        return out

    # -- arithmetic ----------------------------------------------------------------------
    def add(self, x, y):
        with quiet_floats():
            return np.add(x, y)

    def subtract(self, x, y):
        with quiet_floats():
            return np.subtract(x, y)

    def multiply(self, x, y):
        with quiet_floats():
            return np.multiply(x, y)

    def divide(self, x, y):
        with quiet_floats():
            return np.divide(x, y)

    def int_divide(self, x, y):
        """Integer division rounding toward zero; x / 0 = -1, INT_MIN / -1 = INT_MIN (XLA)."""
        x, y = np.broadcast_arrays(np.asarray(x), np.asarray(y))
        overflow = _int_min_by_minus_one(x, y)
        safe = np.where((y == 0) | overflow, 1, y).astype(y.dtype)
        with quiet_floats():
            q = x // safe  # floor: step toward zero when the division is inexact
            q = np.where((x - q * safe != 0) & ((x < 0) != (safe < 0)), q + 1, q).astype(x.dtype)
        return np.where(y == 0, np.array(-1).astype(x.dtype), np.where(overflow, x, q))

    def remainder(self, x, y):
        """fmod for floats; for integers the sign of x, x % 0 = x, INT_MIN % -1 = 0 (XLA)."""
        with quiet_floats():
            if np.asarray(x).dtype.kind == "f":
                return np.fmod(x, y)
            x, y = np.broadcast_arrays(np.asarray(x), np.asarray(y))
            safe = np.where((y == 0) | _int_min_by_minus_one(x, y), 1, y).astype(y.dtype)
            return np.where(y == 0, x, np.fmod(x, safe)).astype(x.dtype)

    def negate(self, x):
        with quiet_floats():
            return np.negative(x)

    def abs(self, x):
        return np.abs(x)

    def sign(self, x):
        return np.sign(x)

    def maximum(self, x, y):
        return np.maximum(x, y)

    def minimum(self, x, y):
        return np.minimum(x, y)

    def power(self, x, y):
        with quiet_floats():
            if np.asarray(x).dtype.kind in "iu":
                return self._int_power(np.asarray(x), np.asarray(y))
            return np.power(x, y)

    def _int_power(self, x, y):
        """XLA's integer power: x ** (y mod 64) by six squarings when y >= 0 (as a signed
        integer); for y < 0: 1 if x == 1, +-1 if x == -1, else 0. Wraps like multiply."""
        x, y = np.broadcast_arrays(x, y)
        signed = f"int{x.dtype.itemsize * 8}"
        xs, ys = x.view(signed), y.view(f"int{y.dtype.itemsize * 8}")
        out = np.ones_like(x)
        base = x.copy()
        e = ys.astype(np.int64)
        for _ in range(6):
            out = np.where(e & 1, out * base, out).astype(x.dtype)
            base = base * base
            e = e >> 1
        odd = (ys % 2) != 0
        negres = np.where(xs == 1, 1, np.where(xs == -1, np.where(odd, -1, 1), 0))
        return np.where(ys < 0, negres.astype(signed).view(x.dtype), out)

    # -- transcendental -----------------------------------------------------------------
    def unary(self, fn: str, x):
        """A named math function: exp, log, tanh, rsqrt, ... (see UNARY)."""
        with quiet_floats():
            return UNARY[fn](np.asarray(x, dtype=np.float64))

    def atan2(self, x, y):
        with quiet_floats():
            return np.arctan2(x, y)

    # -- comparison and logic ---------------------------------------------------------
    def compare(self, direction: str, x, y):
        with quiet_floats():
            return {
                "EQ": np.equal,
                "NE": np.not_equal,
                "LT": np.less,
                "LE": np.less_equal,
                "GT": np.greater,
                "GE": np.greater_equal,
            }[direction](x, y)

    def compare_total(self, direction: str, x, y):
        """`compare` under IEEE-754 totalOrder (compare_type TOTALORDER, as XLA does it):
        -NaN < -inf < ... < -0 < +0 < ... < inf < +NaN, and EQ is equality of bit patterns.
        Symbolic values are reals (no NaN, no signed zero): that is plain `compare`."""
        if self.is_symbolic(x) or self.is_symbolic(y):
            return self.compare(direction, x, y)
        return self.compare(direction, _total_order_key(x), _total_order_key(y))

    def select(self, pred, on_true, on_false):
        return np.where(pred, on_true, on_false)

    def logical_and(self, x, y):
        return np.bitwise_and(x, y)

    def logical_or(self, x, y):
        return np.bitwise_or(x, y)

    def logical_xor(self, x, y):
        return np.bitwise_xor(x, y)

    def logical_not(self, x):
        x = np.asarray(x)
        return np.logical_not(x) if x.dtype == bool else np.invert(x)

    def shift(self, kind: str, x, y):
        """Shifts of the bit pattern; amounts outside [0, bits) shift everything out (XLA).
        The arithmetic right shift copies the top bit, for unsigned types too."""
        x = np.asarray(x)
        bits = x.dtype.itemsize * 8
        y = np.asarray(y).astype(np.int64)
        over = (y < 0) | (y >= bits)
        ys = np.where(over, 0, y).astype(x.dtype)
        if kind == "left":
            return np.where(over, 0, np.left_shift(x, ys)).astype(x.dtype)
        if kind == "right_logical":
            ux = x.view(f"uint{bits}")
            r = np.right_shift(ux, ys.astype(ux.dtype)).view(x.dtype)
            return np.where(over, 0, r).astype(x.dtype)
        sx = x.view(f"int{bits}")
        fill = np.where(sx < 0, -1, 0).astype(sx.dtype)
        r = np.where(over, fill, np.right_shift(sx, ys.astype(sx.dtype)))
        return r.astype(sx.dtype).view(x.dtype)

    def popcnt(self, x):
        x = np.asarray(x)
        ux = x.view(f"uint{x.dtype.itemsize * 8}").astype(np.uint64)
        return np.vectorize(lambda v: bin(int(v)).count("1"))(ux).astype(x.dtype)

    def count_leading_zeros(self, x):
        x = np.asarray(x)
        bits = x.dtype.itemsize * 8
        ux = x.view(f"uint{bits}").astype(np.uint64)
        return np.vectorize(lambda v: bits - int(v).bit_length())(ux).astype(x.dtype)

    # -- values that must be concrete (indices, control flow) --------------------------
    def index(self, x) -> int:
        """A scalar used as an index; must be concrete."""
        return int(np.asarray(x).reshape(()))

    def known_index(self, x) -> int | None:
        """The integer a scalar index holds, or None when it depends on the inputs."""
        if type(x) is np.ndarray and x.ndim == 0:
            return int(x)  # the common case (a 0-d index operand), at a fifth of the cost
        return int(np.asarray(x).reshape(()))

    def truth(self, x) -> bool:
        """A scalar predicate deciding control flow; must be concrete."""
        return bool(np.asarray(x).reshape(()))

    def indices(self, x) -> np.ndarray:
        """An index array (gather/scatter); must be concrete."""
        return np.asarray(x).astype(np.int64)

    # -- reductions and contractions ----------------------------------------------------
    def reduce_sum(self, x, axes: tuple[int, ...]):
        with quiet_floats():
            return np.sum(x, axis=axes, dtype=np.asarray(x).dtype)

    def reduce_prod(self, x, axes):
        with quiet_floats():
            return np.prod(x, axis=axes, dtype=np.asarray(x).dtype)

    def reduce_max(self, x, axes):
        return np.max(x, axis=axes) if np.asarray(x).size else x.sum(axis=axes)

    def reduce_min(self, x, axes):
        return np.min(x, axis=axes) if np.asarray(x).size else x.sum(axis=axes)

    def reduce_and(self, x, axes):
        x = np.asarray(x)
        if x.dtype == bool:
            return np.all(x, axis=axes)
        return np.bitwise_and.reduce(x, axis=axes)

    def reduce_or(self, x, axes):
        x = np.asarray(x)
        if x.dtype == bool:
            return np.any(x, axis=axes)
        return np.bitwise_or.reduce(x, axis=axes)

    def matmul(self, a, b):
        """Batched matrix product: (B, M, K) x (B, K, N) -> (B, M, N)."""
        with quiet_floats():
            return np.matmul(a, b)


def _erf_inv(x):
    from scipy.special import erfinv

    return erfinv(x)


def _digamma(x):
    from scipy.special import digamma

    pole = (x <= 0) & (x == np.floor(x))  # 0, -1, -2, ...: NaN (as XLA), not +-inf
    return np.where(pole, np.nan, digamma(x))


def _rsqrt(x):
    return 1.0 / np.sqrt(x)


def _round_half_away(x):
    # not floor(|x| + 0.5): that sum rounds (0.49999999999999994 -> 1, 2**52 + 1 -> 2**52 + 2)
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


UNARY = {
    "exp": np.exp,
    "expm1": np.expm1,
    "log": np.log,
    "log1p": np.log1p,
    "logistic": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
    "sqrt": np.sqrt,
    "rsqrt": _rsqrt,
    "cbrt": np.cbrt,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "erf": _erf,
    "lgamma": _lgamma,
    "erf_inv": _erf_inv,
    "digamma": _digamma,
    "floor": np.floor,
    "ceil": np.ceil,
    "round_nearest_afz": _round_half_away,
    "round_nearest_even": np.rint,
    "is_finite": np.isfinite,
    "sign": np.sign,
}
