"""`close_elementwise` (when a simulated value equals a candidate tile) keeps its rule on its
fast path for float64 arrays: |a - b| <= rtol * max(1, |a|, |b|) at every finite place,
non-finite values in the same places (tv_ir/semantics/closeness.py)."""

from __future__ import annotations

import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tv_ir.semantics.closeness import RTOL, close_elementwise

SPECIAL = [0.0, -0.0, 1.0, 1e-300, 1e308, -1e308, np.inf, -np.inf, np.nan]


def by_the_rule(a: np.ndarray, b: np.ndarray) -> bool:
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not np.array_equal(fa, fb):
        return False
    x, y = a[fa], b[fb]
    with np.errstate(all="ignore"):
        return bool(np.all(np.abs(x - y) <= RTOL * np.maximum(1.0, np.maximum(abs(x), abs(y)))))


floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(SPECIAL))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(floats, floats, st.booleans()), min_size=1, max_size=6))
def test_the_fast_path_follows_the_rule(rows) -> None:
    a = np.array([x for x, _, _ in rows], dtype=np.float64)
    # b: its own value, or a's nudged by less than rtol (equal values take the fast path)
    b = np.array([x * (1 + RTOL / 4) if same else y for x, y, same in rows], dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning escapes the fast path
        got = close_elementwise(a, b)
    assert got == by_the_rule(a, b), (a, b)


def test_non_finite_values_must_be_in_the_same_places() -> None:
    inf = np.inf
    assert close_elementwise(np.array([1.0, inf]), np.array([1.0, inf]))
    assert close_elementwise(np.array([np.nan, 2.0]), np.array([-inf, 2.0]))  # which: not compared
    assert not close_elementwise(np.array([inf]), np.array([5.0]))
    assert not close_elementwise(np.array([5.0]), np.array([np.nan]))
    # both finite, their difference overflows: far apart, not equal
    assert not close_elementwise(np.array([1e308]), np.array([-1e308]))


def test_each_element_at_its_own_scale() -> None:
    assert close_elementwise(np.array([1e12]), np.array([1e12 + 1e-1]))  # 1e-13 relative
    assert not close_elementwise(np.array([1e12, 1.0]), np.array([1e12, 1.0 + 1e-6]))
    assert not close_elementwise(np.zeros((2, 3)), np.zeros((3, 2)))
