"""Counts over devices compared: a mesh axis whose size bounds a value a comparison reads
keeps its size.

The device-side twin of passes/shape_reduction/counts.py. A collective summing values
bounded at both ends over an axis (each device's number of pad tokens, `psum`med over
"data") ranges over the axis's size times their range: on 8 devices of 2 tokens each a row
holds up to 16 pad tokens, on 2 of them up to 4, so `where(psum(count) > 6, 0, s)` drops
rows on the real mesh that the reduced one never does. Such an axis keeps its size. A
device's own sums of bounded values are bounded too (their sizes do not change with the
mesh); a count only computed with (a loss normalised by the global token count) does not
keep its axes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from tv_ir.passes.shape_reduction.counts import SUMMING, Counts
from tv_ir.passes.shape_reduction.ranges import sums

from tv_ir.ir.program import Op


class AxisCounts(Counts):
    """Counts of mesh axes: an `all_reduce` or `reduce_scatter` adding bounded values (or
    counts) over the axes its groups vary along (`axes`: id(op) -> those axes)."""

    def __init__(self, keep: Callable[[int, str], None], axes: dict[int, tuple[int, ...]]):
        super().__init__(keep)
        self.axes = axes

    def summed(self, op: Op) -> tuple:
        if op.name in SUMMING and sums(op) and any(self.counted(v) for v in op.operands):
            return self.axes.get(id(op), ())
        return ()

    def local_sum(self, op: Op) -> tuple[float, float] | None:
        x = op.operands[0]
        lo, hi = self.range(x)
        if not (np.isfinite(lo) and np.isfinite(hi)):
            return None
        n = int(np.prod([x.type.shape[a] for a in op.attrs["dimensions"]], dtype=np.int64))
        return (min(lo, n * lo), max(hi, n * hi))


def keep_counted_axes(sites: list, keep: Callable[[int, str], None], ops: list[Op]) -> None:
    """Keep (`keep(axis, why)`) the axes whose counts (`AxisCounts`) a comparison reads;
    `sites`: the template's, whose "groups" name each collective's axes."""
    axes = {id(s.op): s.axes for s in sites if s.kind == "groups"}
    counts = AxisCounts(keep, axes)
    for op in ops:
        counts.step(op)
