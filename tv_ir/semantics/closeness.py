"""When two simulated arrays count as equal: up to float64 noise, non-finite values in the
same places (the claim of docs/equivalence.md). Outputs are compared at the scale of the
whole array (`close`); a value and a candidate cut-point element by element
(`close_elementwise`), so one huge masked element cannot hide the others."""

from __future__ import annotations

import numpy as np

from tv_ir.semantics.algebra import quiet_floats

RTOL = 1e-9


def close(a, b, rtol: float = RTOL) -> bool:
    """Equal up to float64 noise. Non-finite values must be in the same places; which
    non-finite value each side holds (+inf, -inf, NaN) is not compared (the claim of
    docs/equivalence.md: reals have no signed zero, so 1/x at x = 0 has no one sign)."""
    decided, x, y = _finite_values(a, b)
    if decided is not None:
        return decided
    scale = max(1.0, float(np.max(np.abs(x))), float(np.max(np.abs(y))))
    with quiet_floats():  # finite values whose difference overflows: inf, not close
        return bool(np.max(np.abs(x - y)) <= rtol * scale)


def close_elementwise(a, b, rtol: float = RTOL) -> bool:
    """Equal element by element up to float64 noise at that element's own magnitude:
    |a - b| <= rtol * max(1, |a|, |b|) at every finite place, non-finite values in the same
    places. For matching values to candidates: one huge element (an attention mask of
    -0.7 * finfo(float32).max) must not make every other element "close", as the whole
    array's scale in `close` would."""
    if (
        type(a) is np.ndarray
        and type(b) is np.ndarray
        and a.dtype == np.float64
        and b.dtype == np.float64
        and a.shape == b.shape
    ):  # the common case, at once: a finite difference everywhere means finite values
        with quiet_floats():
            diff = np.abs(a - b)
        if (diff <= rtol).all():  # within rtol of each other (at any scale >= 1): finite
            return True
        if np.isfinite(diff).all():
            return bool((diff <= rtol * np.maximum(1.0, np.maximum(np.abs(a), np.abs(b)))).all())
    decided, x, y = _finite_values(a, b)
    if decided is not None:
        return decided
    scale = np.maximum(1.0, np.maximum(np.abs(x), np.abs(y)))
    with quiet_floats():  # finite values whose difference overflows: inf, not close
        return bool(np.all(np.abs(x - y) <= rtol * scale))


def _finite_values(a, b):
    """(verdict, x, y): a verdict when shapes, non-float values or the places of non-finite
    values decide; otherwise None and the finite values of both, side by side."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False, None, None
    if a.dtype.kind not in "fc" and b.dtype.kind not in "fc":
        return bool(np.array_equal(a, b)), None, None
    if a.dtype.kind == "c" or b.dtype.kind == "c":  # complex: both parts compared
        a, b = (np.stack([np.real(v), np.imag(v)], axis=-1) for v in (a, b))
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not np.array_equal(fa, fb):
        return False, None, None
    if not np.any(fa):
        return True, None, None
    return None, a[fa], b[fb]
