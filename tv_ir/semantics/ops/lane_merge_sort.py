"""A stable merge sort of all lanes at once, calling the comparator on whole arrays.

The concrete `sort` called its comparator region once per comparison (one scalar per
operand), about n log n region runs per lane: 1024 lanes of 1024 keys took minutes, which
the real-size confirmation of a proof at reduced shapes pays (`SortShardedOnSortDim_*`).
Here the region runs on arrays: bottom-up merge sort, runs of width w merged pairwise in
every lane together, each element's place in the merged run found by a binary search in
the other run (about log2(n)^2 / 2 region runs in all).

An element a of the left run goes after the elements b of the right run with
less(b, a); an element b of the right run after the elements a of the left run with
not less(b, a): ties keep their order (stable). Both sets are prefixes of a sorted run,
which the binary search needs, when `less` is a strict weak order, the only comparators a
sort has a meaning for; on any other comparator the result is some permutation, as the
one-comparison-at-a-time sort's is.
"""

from __future__ import annotations

import numpy as np


def merge_sort_lanes(moved: list[np.ndarray], less) -> list[np.ndarray]:
    """`moved`: the operands with the sorted dimension last (same shapes); `less(args)` the
    comparator on arrays (lhs_0, rhs_0, lhs_1, rhs_1, ...), elementwise. The operands sorted
    stably along the last dimension."""
    shape = moved[0].shape
    n = shape[-1]
    if n < 2 or moved[0].size == 0:
        return [np.array(m, copy=True) for m in moved]
    cur = [np.asarray(m).reshape(-1, n) for m in moved]
    pos = np.broadcast_to(np.arange(n), cur[0].shape)
    w = 1
    while w < n:
        run, q = pos // (2 * w), pos % (2 * w)
        left = q < w
        start = run * (2 * w) + np.where(left, w, 0)  # the other run's start
        length = np.clip(np.minimum(w, n - start), 0, None)
        lo, hi = np.zeros_like(pos), length.copy()
        while True:
            active = lo < hi
            if not active.any():
                break
            mid = (lo + hi) // 2
            probe = np.minimum(start + mid, n - 1)
            args = []
            for c in cur:
                other = np.take_along_axis(c, probe, axis=-1)
                args += [np.where(left, other, c), np.where(left, c, other)]
            res = np.broadcast_to(np.asarray(less(args), dtype=bool), pos.shape)
            # left: count right-run elements less than it; right: left-run ones not after it
            go_right = np.where(left, res, ~res) & active
            lo = np.where(go_right, mid + 1, lo)
            hi = np.where(active & ~go_right, mid, hi)
        own = np.where(left, q, q - w)
        dest = run * (2 * w) + own + lo
        out = []
        for c in cur:
            o = np.empty_like(c)
            np.put_along_axis(o, dest, c, axis=-1)
            out.append(o)
        cur = out
        w *= 2
    return [c.reshape(shape) for c in cur]
