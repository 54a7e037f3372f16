"""Rounded reciprocals of integers: which float is 1/n rounded to its type, for one n only.

passes/reciprocal_constants.py reads such a constant as 1/n where the pair divides by n (a
compiler's `x * (1/n)` for `x / n`); the symbolic interpreter reads a float64 1/n as the
exact rational (docs/equivalence.md, "Constants").
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

MAX_RECIPROCAL = 1 << 24  # the largest n whose rounded reciprocal 1/n is read as exact

# float64 values that passes/reciprocal_constants.py wrote for a rational it read a constant
# as (k/n): the symbolic interpreter reads them as that rational
EXACT: dict[float, Fraction] = {}


def integer_reciprocals(arr: np.ndarray, dtype=None) -> np.ndarray:
    """`arr` (values of float type `dtype`, default its own) widened to float64, each that
    is 1/n rounded to that type, for one integer n only, replaced by 1/n."""
    arr = np.asarray(arr)
    dt = np.dtype(dtype) if dtype is not None else arr.dtype
    out = arr.astype(np.float64)
    if dt.kind not in "fV" or out.size == 0:
        return out
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        n = np.rint(1.0 / out)
        ok = np.isfinite(n) & (np.abs(n) >= 2) & (np.abs(n) <= MAX_RECIPROCAL)
        if not ok.any():
            return out
        n = np.where(ok, n, 2.0)
        mine = out.astype(dt)
        rounded = (1.0 / n).astype(dt) == mine
        step = np.sign(n)
        unique = ((1.0 / (n + step)).astype(dt) != mine) & ((1.0 / (n - step)).astype(dt) != mine)
        hit = ok & rounded & unique & (mine != 0)
        out[hit] = 1.0 / n[hit]
    return out


def exact_reciprocal(f: float) -> Fraction | None:
    """1/n when the float64 `f` is 1/n rounded (n an integer, 2 <= |n| <= MAX_RECIPROCAL)."""
    if not 0.5 / MAX_RECIPROCAL <= abs(f) < 0.5:
        return None
    n = round(1.0 / f)
    if 2 <= abs(n) <= MAX_RECIPROCAL and 1.0 / n == f:
        return Fraction(1, n)
    return None
