"""`bitcast_convert` of values that depend on the inputs: an opaque function of the bits.

A term has no bit pattern, so the cast of one is an opaque function of it (an `fn` atom, as
`sin` is), one per source type, result type and piece: programs that cast the same values
the same way have equal terms, which is what a partitioned bit cast needs (each device casts
its piece). What the bits are is known only concretely: each function is registered with
its value on numbers (`UNARY`, little-endian as XLA:CPU), which evaluating a term and every
replay use. A cast to floats may give an infinity or NaN (an exponent of all ones): the
result is defined where that function is finite (`finite_at`), as for `lgamma`'s poles.

- same width: one function per element;
- to a narrower type (`s64` -> `f32[..., 2]`): one function per piece of the new trailing
  dimension;
- to a wider type from integers (`s32[..., 2]` -> `f64`): one function of `sum_j a_j 2^(w j)`
  (w the source width), which determines the pieces `a_j` (|a_j| < 2^w); from floats it is
  unsupported (a sum of reals determines no pieces).
"""

from __future__ import annotations

import numpy as np

from tv_ir.errors import Unsupported
from tv_ir.ir.program import TensorType, storage_dtype
from tv_ir.semantics import terms as T
from tv_ir.semantics.algebra import UNARY

PREFIX = "bitcast_"


def bitcast_terms(x, src: TensorType, dst: TensorType) -> np.ndarray:
    """The cast of an object array of terms (`src`'s shape) to `dst`."""
    if src.is_complex or dst.is_complex or src.is_bool or dst.is_bool:
        raise Unsupported(
            f"bitcast_convert of {src.dtype} to {dst.dtype} values that depend on the inputs"
        )
    x = np.asarray(x, dtype=object)
    ws, wd = _width(src), _width(dst)
    if ws == wd:
        return _map(_function(src, dst, None), x)
    if ws > wd:
        k = ws // wd
        out = np.empty((*x.shape, k), dtype=object)
        for j in range(k):
            out[..., j] = _map(_function(src, dst, j), x)
        return out
    if not src.is_integer:
        raise Unsupported(
            f"bitcast_convert of {src.dtype} values that depend on the inputs to the wider "
            f"{dst.dtype}"
        )
    k = wd // ws
    packed = np.empty(x.shape[:-1], dtype=object)
    for idx in np.ndindex(*packed.shape):
        total = T.ZERO
        for j in range(k):
            total = T.add(total, T.mul(T.const(float(2 ** (ws * j))), T.lift(x[(*idx, j)])))
        packed[idx] = total
    return _map(_function(src, dst, None, packed=k), packed)


def _map(name: str, x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape, dtype=object)
    for idx in np.ndindex(*x.shape):
        out[idx] = T.fn(name, T.lift(x[idx]))
    return out


def _width(t: TensorType) -> int:
    return int(storage_dtype(t).itemsize) * 8


def _function(src: TensorType, dst: TensorType, piece: int | None, packed: int = 1) -> str:
    """The name of the function (registered in UNARY on first use): `bitcast_SRC_DST[_j]`
    (terms.py reads DST: a float result may be non-finite)."""
    name = f"{PREFIX}{src.dtype}_{dst.dtype}" + ("" if piece is None else f"_{piece}")
    if name in UNARY:
        return name
    s_np, d_np = storage_dtype(src), storage_dtype(dst)
    ws = _width(src)
    signed = src.is_integer and np.issubdtype(s_np, np.signedinteger)

    def value(v):
        if isinstance(v, int):  # an integer's exact value (64-bit ones exceed a float's)
            return _one(v)
        if isinstance(v, float) and d_np.kind in "iu":  # a float's bits: exact as well
            return _one(v)
        v = np.asarray(v, dtype=np.float64)
        out = np.empty(v.shape, dtype=np.float64)
        for idx in np.ndindex(*v.shape):
            out[idx] = _one(float(v[idx]))
        return out if out.shape else np.float64(out[()])

    def _one(v):
        if not isinstance(v, int) and not np.isfinite(v):
            return float("nan")
        if packed > 1:  # the pieces of sum_j a_j 2^(ws j)
            n, pieces = int(v), []
            for _ in range(packed):
                a = n % (1 << ws)
                if signed and a >= 1 << (ws - 1):
                    a -= 1 << ws
                pieces.append(a)
                n = (n - a) >> ws
            bits = np.array(pieces, dtype=s_np)
        else:
            with np.errstate(all="ignore"):
                bits = np.array([v]).astype(s_np)
        cast = bits.view(d_np).reshape(-1)
        out = cast[piece or 0]
        return int(out) if out.dtype.kind in "iu" else float(out)

    UNARY[name] = value
    return name
