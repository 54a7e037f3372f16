"""Windows that fold a whole dimension: shape reduction reads them at any size."""

from __future__ import annotations

import numpy as np

from tv_ir.ir.program import Op


def cumulative(op: Op, a: int) -> bool:
    """Whether reduce_window `op` folds, along dimension `a`, every position up to each one
    (or from it on): a window of the whole dimension padded by its size less one on one
    side, stride 1 (`jnp.cumsum`, `cummax`). Its result at any size is the same fold over a
    prefix (suffix), so the dimension shrinks with its window (`rewrite`)."""
    n = op.operands[0].type.shape[a]
    rank = len(op.operands[0].type.shape)
    ones = (1,) * rank
    if n < 2 or op.results[0].type.shape[a] != n:
        return False
    for key in ("window_strides", "base_dilations", "window_dilations"):
        if (op.attrs.get(key) or ones)[a] != 1:
            return False
    if (op.attrs.get("window_dimensions") or ones)[a] != n:
        return False
    padding = op.attrs.get("padding")
    if padding is None:
        return False
    lo, hi = (int(p) for p in np.asarray(padding).reshape(rank, 2)[a])
    return (lo, hi) in ((n - 1, 0), (0, n - 1))


def whole_window(op: Op, a: int) -> bool:
    """Whether reduce_window `op` folds, along dimension `a`, windows at least half its
    operand's size with stride 1 and no dilation (not `cumulative`): XLA's partitioned
    `cumsum` gathers the row, pads it by its size less one and slides a window of the row's
    size over each device's stretch. The window and padding are sizes of the dimension's
    class (read at the reduced size by `rewrite`), not a stencil's few positions."""
    if cumulative(op, a):
        return False
    x = op.operands[0].type.shape
    ones = (1,) * len(x)
    for key in ("window_strides", "base_dilations", "window_dilations"):
        if (op.attrs.get(key) or ones)[a] != 1:
            return False
    w = (op.attrs.get("window_dimensions") or ones)[a]
    return w > 1 and 2 * w >= x[a]


def window_pads(op: Op) -> np.ndarray:
    """reduce_window's padding as (rank, 2) (zeros when it has none)."""
    rank = len(op.operands[0].type.shape)
    padding = op.attrs.get("padding")
    return np.zeros((rank, 2), int) if padding is None else np.asarray(padding).reshape(rank, 2)
