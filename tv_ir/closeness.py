"""When two simulated arrays count as equal: up to float64 noise, non-finite values in the
same places (the claim of docs/equivalence.md). Outputs are compared at the scale of the
whole array (`close`); a value and a candidate cut-point element by element
(`close_elementwise`), so one huge masked element cannot hide the others."""

from __future__ import annotations

import numpy as np

RTOL = 1e-9


def close(a, b, rtol: float = RTOL) -> bool:
    """Equal up to float64 noise. Non-finite values must be in the same places; which
    non-finite value each side holds (+inf, -inf, NaN) is not compared (the claim of
    docs/equivalence.md: reals have no signed zero, so 1/x at x = 0 has no one sign)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype.kind not in "fc" and b.dtype.kind not in "fc":
        return bool(np.array_equal(a, b))
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not np.array_equal(fa, fb):
        return False
    if not np.any(fa):
        return True
    scale = max(1.0, float(np.max(np.abs(a[fa]))), float(np.max(np.abs(b[fb]))))
    return bool(np.max(np.abs(a[fa] - b[fb])) <= rtol * scale)


def close_elementwise(a, b, rtol: float = RTOL) -> bool:
    """Equal element by element up to float64 noise at that element's own magnitude:
    |a - b| <= rtol * max(1, |a|, |b|) at every finite place, non-finite values in the same
    places. For matching values to candidates: one huge element (an attention mask of
    -0.7 * finfo(float32).max) must not make every other element "close", as the whole
    array's scale in `close` would."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype.kind not in "fc" and b.dtype.kind not in "fc":
        return bool(np.array_equal(a, b))
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not np.array_equal(fa, fb):
        return False
    x, y = a[fa], b[fb]
    scale = np.maximum(1.0, np.maximum(np.abs(x), np.abs(y)))
    return bool(np.all(np.abs(x - y) <= rtol * scale))
