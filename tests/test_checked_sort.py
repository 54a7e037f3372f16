"""The concrete sort by numpy's argsort, kept only when the comparator confirms it
(tv_ir/semantics/ops/checked_sort.py): the same result as the lane merge sort whenever it
answers, and no answer when its candidates are not the comparator's order."""

from __future__ import annotations

import numpy as np

from tv_ir.semantics.ops.checked_sort import checked_sort_lanes
from tv_ir.semantics.ops.lane_merge_sort import merge_sort_lanes


def ascending(a):
    return a[0] < a[1]


def topk_idiom(a):
    """Descending keys, ties by ascending position (XLA's TopK comparator)."""
    return np.where(a[0] == a[1], a[2] < a[3], a[0] > a[1])


def total_order(a):
    """LT TOTALORDER on floats: -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN."""

    def key(x):
        bits = np.asarray(x, dtype=np.float64).view(np.int64)
        return np.where(bits < 0, np.int64(-(2**63)) - bits - 1, bits)

    return key(a[0]) < key(a[1])


def keys_with_ties(rng, lanes: int, n: int) -> np.ndarray:
    return rng.integers(0, max(n // 3, 1), size=(lanes, n)).astype(np.float64)


def test_candidate_order_is_the_stable_sort() -> None:
    rng = np.random.default_rng(0)
    for less in (ascending, topk_idiom):
        for n in (2, 3, 7, 64, 1000):
            keys = keys_with_ties(rng, 3, n)
            iota = np.broadcast_to(np.arange(n), keys.shape).copy()
            got = checked_sort_lanes([keys, iota], less)
            assert got is not None, (less.__name__, n)
            want = merge_sort_lanes([keys, iota], less)
            for g, w in zip(got, want, strict=True):
                assert (g == w).all(), (less.__name__, n)


def test_signed_zeros_and_nans_under_a_total_order() -> None:
    """numpy's sort ties -0 with +0 and puts NaNs last; a total order does neither: the
    check must reject the candidate or the result must still be the stable sort."""
    special = np.array([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1.0, -1.0])
    rng = np.random.default_rng(1)
    for _ in range(20):
        keys = rng.choice(special, size=(2, 16))
        iota = np.broadcast_to(np.arange(16), keys.shape).copy()
        got = checked_sort_lanes([keys, iota], total_order)
        want = merge_sort_lanes([keys, iota], total_order)
        if got is not None:
            for g, w in zip(got, want, strict=True):
                assert np.array_equal(g, w, equal_nan=True)


def test_no_answer_when_no_candidate_is_the_comparators_order() -> None:
    rng = np.random.default_rng(2)
    keys = keys_with_ties(rng, 2, 50)
    payload = rng.permutation(100).reshape(2, 50).astype(np.float64)
    # ordered by the second operand, descending: no candidate sorts by it first
    assert checked_sort_lanes([keys, payload], lambda a: a[2] > a[3]) is None
    # not a strict order (ties are "less"): adjacent ties fail the check
    assert checked_sort_lanes([keys, payload], lambda a: a[0] <= a[1]) is None
