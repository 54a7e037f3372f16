"""A concrete sort by numpy's own sort, accepted only when the comparator confirms it.

The lane merge sort (lane_merge_sort.py) runs the comparator region about log2(n)^2 / 2
times on whole arrays: 2 lanes of 209664 keys (XLA's TopK tests) take about 10 s, which
the real-size confirmation of a proof at reduced shapes pays once per sort per run. Most
comparators order by one operand (ascending or descending) with ties by position or by a
second operand, so numpy's stable argsort on those keys usually gives the right order.
A candidate order is never trusted: the comparator checks it, in two region runs on all
adjacent pairs at once, and it is used only when

- no element is less than the one before it (`not less(next, cur)`), and
- of each adjacent pair where neither is less than the other, the earlier came first in
  the input (stability).

For a strict weak order (the only comparators a sort has a meaning for) "not less(b, a)"
is a total preorder, so a sequence ordered so between neighbours is ordered throughout,
and elements equivalent to each other are contiguous and, by the second condition, in
their input order: exactly the stable sort's result, whichever candidate produced it.
When no candidate passes, the caller falls back to the merge sort.
"""

from __future__ import annotations

import numpy as np

# (operand, descending) keys, most significant first; numpy's stable argsort per key
CANDIDATES = (
    ((0, False),),
    ((0, True),),
    ((0, False), (1, False)),
    ((0, True), (1, False)),
)


def checked_sort_lanes(moved: list[np.ndarray], less) -> list[np.ndarray] | None:
    """`moved`: the operands with the sorted dimension last (same shapes); `less(args)` the
    comparator on arrays (lhs_0, rhs_0, lhs_1, rhs_1, ...), elementwise. The operands sorted
    stably along the last dimension when a candidate order passes the comparator's check,
    else None."""
    shape = moved[0].shape
    n = shape[-1]
    cur = [np.asarray(m).reshape(-1, n) for m in moved]
    if n < 2 or cur[0].size == 0 or not all(_sortable(c) for c in cur):
        return None
    for keys in CANDIDATES:
        if any(k >= len(cur) for k, _ in keys):
            continue
        perm = _stable_order(cur, keys)
        out = [np.take_along_axis(c, perm, axis=-1) for c in cur]
        if _ordered(out, perm, less):
            return [o.reshape(shape) for o in out]
    return None


def _sortable(a: np.ndarray) -> bool:
    """Whether numpy sorts these values (real numbers or booleans, not terms)."""
    return a.dtype.kind in "biuf"


def _stable_order(cur: list[np.ndarray], keys) -> np.ndarray:
    """Per lane, the positions in the stable order of `keys` (least significant key
    applied first: each later stable sort keeps the earlier order among its ties)."""
    perm = np.broadcast_to(np.arange(cur[0].shape[-1]), cur[0].shape).copy()
    for k, descending in reversed(keys):
        v = np.take_along_axis(cur[k], perm, axis=-1)
        if descending:  # stable descending: sort the reversed lane, reverse the order back
            n = v.shape[-1]
            order = n - 1 - np.argsort(v[:, ::-1], axis=-1, kind="stable")[:, ::-1]
        else:
            order = np.argsort(v, axis=-1, kind="stable")
        perm = np.take_along_axis(perm, order, axis=-1)
    return perm


def _ordered(out: list[np.ndarray], perm: np.ndarray, less) -> bool:
    """Whether `out` (the operands in the order `perm`) is the stable sort by `less`."""
    before = [o[:, :-1] for o in out]
    after = [o[:, 1:] for o in out]
    shape = before[0].shape

    def lt(xs, ys) -> np.ndarray:
        args = []
        for x, y in zip(xs, ys, strict=True):
            args += [x, y]
        return np.broadcast_to(np.asarray(less(args), dtype=bool), shape)

    if lt(after, before).any():  # an element less than the one before it
        return False
    tie = ~lt(before, after)
    return bool((perm[:, :-1] < perm[:, 1:])[tie].all())
