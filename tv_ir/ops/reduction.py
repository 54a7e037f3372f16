"""Reductions and contractions: reduce, reduce_window, dot_general, sort."""

from __future__ import annotations

import functools
import itertools

import numpy as np

from .registry import op
from .shape import _pad_dim

# reducer bodies recognised as one algebra call: body op name -> algebra reduction
_FAST = {
    "stablehlo.add": ("reduce_sum", "add"),
    "stablehlo.multiply": ("reduce_prod", "multiply"),
    "stablehlo.maximum": ("reduce_max", "maximum"),
    "stablehlo.minimum": ("reduce_min", "minimum"),
    "stablehlo.and": ("reduce_and", "logical_and"),
    "stablehlo.or": ("reduce_or", "logical_or"),
}


def reducer_kind(ctx, region_index: int = 0) -> tuple[str, str] | None:
    """(reduction, binary op) if the region is `return op(arg0, arg1)` with scalar args."""
    block = ctx.regions[region_index].block
    if len(block.args) != 2 or len(block.ops) != 1 or len(block.results) != 1:
        return None
    body = block.ops[0]
    if body.results[0] is not block.results[0] or body.name not in _FAST:
        return None
    if {v.id for v in body.operands} != {a.id for a in block.args}:
        return None
    kind = _FAST[body.name]
    if block.args[0].type.is_bool and kind[0] in ("reduce_sum", "reduce_max"):
        return ("reduce_or", "logical_or")
    if block.args[0].type.is_bool and kind[0] in ("reduce_prod", "reduce_min"):
        return ("reduce_and", "logical_and")
    return kind


def fold(ctx, region_index, accs: list, elems: list) -> list:
    """Apply a reducer region: accs <- body(accs, elems), element-wise over arrays."""
    return ctx.run_region(region_index, list(accs) + list(elems))


@op("stablehlo.reduce")
def reduce(ctx, *operands):
    n = len(operands) // 2
    inputs, inits = operands[:n], operands[n:]
    axes = tuple(ctx.attr("dimensions"))
    kind = reducer_kind(ctx) if n == 1 else None
    if kind is not None:
        reduction, binary = kind
        reduced = getattr(ctx.alg, reduction)(inputs[0], axes)
        return getattr(ctx.alg, binary)(inits[0], reduced)
    # general reducer: move reduced axes last, fold one slice at a time
    moved = [_axes_last(np.asarray(x), axes) for x in inputs]
    keep = moved[0].shape[: moved[0].ndim - len(axes)]
    accs = [np.broadcast_to(i, keep).copy() for i in inits]
    flat = [m.reshape(keep + (-1,)) for m in moved]
    for j in range(flat[0].shape[-1]):
        accs = fold(ctx, 0, accs, [f[..., j] for f in flat])
    return accs


def _axes_last(x, axes):
    rest = [d for d in range(x.ndim) if d not in axes]
    return np.transpose(x, rest + list(axes))


@op("stablehlo.reduce_window")
def reduce_window(ctx, *operands):
    n = len(operands) // 2
    inputs, inits = operands[:n], operands[n:]
    rank = np.asarray(inputs[0]).ndim
    window = ctx.attr("window_dimensions")
    strides = ctx.attr("window_strides") or (1,) * rank
    base_dil = ctx.attr("base_dilations") or (1,) * rank
    win_dil = ctx.attr("window_dilations") or (1,) * rank
    padding = ctx.attr("padding")
    padding = np.zeros((rank, 2), int) if padding is None else np.asarray(padding).reshape(rank, 2)
    padded = []
    for x, init in zip(inputs, inits, strict=True):
        for d in range(rank):
            x = _pad_dim(np.asarray(x), init, d, int(padding[d, 0]), int(padding[d, 1]),
                         base_dil[d] - 1)
        padded.append(x)
    shape = padded[0].shape
    out = [(shape[d] - ((window[d] - 1) * win_dil[d] + 1)) // strides[d] + 1 for d in range(rank)]
    out = [max(o, 0) for o in out]
    slices = []
    for w in itertools.product(*[range(k) for k in window]):
        idx = tuple(
            slice(w[d] * win_dil[d], w[d] * win_dil[d] + (out[d] - 1) * strides[d] + 1, strides[d])
            for d in range(rank)
        )
        slices.append([p[idx] for p in padded])
    kind = reducer_kind(ctx) if n == 1 else None
    accs = [np.broadcast_to(i, out).copy() for i in inits]
    if kind is not None and slices:
        reduction, binary = kind
        stacked = np.stack([s[0] for s in slices], axis=-1)
        reduced = getattr(ctx.alg, reduction)(stacked, (rank,))
        return getattr(ctx.alg, binary)(accs[0], reduced)
    for s in slices:
        accs = fold(ctx, 0, accs, s)
    return accs


@op("stablehlo.dot_general")
def dot_general(ctx, lhs, rhs):
    dims = ctx.attr("dot_dimension_numbers")
    t = ctx.result_type
    lhs = ctx.alg.convert(lhs, ctx.operand_types[0], _like(ctx.operand_types[0], t))
    rhs = ctx.alg.convert(rhs, ctx.operand_types[1], _like(ctx.operand_types[1], t))
    lb, rb, lc, rc = dims.lhs_batch, dims.rhs_batch, dims.lhs_contract, dims.rhs_contract
    lf = [d for d in range(lhs.ndim) if d not in lb and d not in lc]
    rf = [d for d in range(rhs.ndim) if d not in rb and d not in rc]
    bshape = [lhs.shape[d] for d in lb]
    B = int(np.prod(bshape, dtype=np.int64))
    M = int(np.prod([lhs.shape[d] for d in lf], dtype=np.int64))
    N = int(np.prod([rhs.shape[d] for d in rf], dtype=np.int64))
    K = int(np.prod([lhs.shape[d] for d in lc], dtype=np.int64))
    a = np.transpose(lhs, list(lb) + lf + list(lc)).reshape(B, M, K)
    b = np.transpose(rhs, list(rb) + list(rc) + rf).reshape(B, K, N)
    return ctx.alg.matmul(a, b).reshape(t.shape)


def _like(src, dst):
    """src's shape with dst's element type (dot_general's operand promotion)."""
    from ..ir import TensorType

    return TensorType(src.shape, dst.dtype)


@op("stablehlo.sort")
def sort(ctx, *operands):
    dim = ctx.attr("dimension")
    arrays = [np.asarray(x) for x in operands]
    moved = [np.moveaxis(a, dim, -1) for a in arrays]
    lanes = moved[0].shape[:-1]
    n = moved[0].shape[-1]
    outs = [m.copy() for m in moved]

    for lane in np.ndindex(*lanes):
        def less(i, j, lane=lane):
            args = []
            for m in moved:
                args += [m[lane + (i,)], m[lane + (j,)]]
            return ctx.alg.truth(ctx.run_region(0, [np.asarray(a) for a in args])[0])

        def cmp(i, j, less=less):
            if less(i, j):
                return -1
            if less(j, i):
                return 1
            return 0

        perm = sorted(range(n), key=functools.cmp_to_key(cmp))  # Python's sort is stable
        for o, m in zip(outs, moved, strict=True):
            o[lane] = m[lane][perm]
    return [np.moveaxis(o, -1, dim) for o in outs]
