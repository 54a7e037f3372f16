"""Rounded reciprocals of integers read as the exact rationals they stand for.

passes/reciprocal_constants.py reads such a constant as 1/n where the pair divides by n (a
compiler's `x * (1/n)` for `x / n`); the symbolic interpreter reads a float64 1/n as the
exact rational (docs/equivalence.md, "Constants").
"""

from __future__ import annotations

from fractions import Fraction

MAX_RECIPROCAL = 1 << 24  # the largest n whose rounded reciprocal 1/n is read as exact

# float64 values that passes/reciprocal_constants.py wrote for a rational it read a constant
# as (k/n): the symbolic interpreter reads them as that rational
EXACT: dict[float, Fraction] = {}


def exact_reciprocal(f: float) -> Fraction | None:
    """1/n when the float64 `f` is 1/n rounded (n an integer, 2 <= |n| <= MAX_RECIPROCAL)."""
    if not 0.5 / MAX_RECIPROCAL <= abs(f) < 0.5:
        return None
    n = round(1.0 / f)
    if 2 <= abs(n) <= MAX_RECIPROCAL and 1.0 / n == f:
        return Fraction(1, n)
    return None
