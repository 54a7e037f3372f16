"""Reductions and contractions: reduce, reduce_window, dot_general, sort."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from tv_ir.ir.program import TensorType
from tv_ir.limits import OutOfMemoryBudget, OutOfTime
from tv_ir.semantics.ops import complex_numbers
from tv_ir.semantics.ops.checked_sort import checked_sort_lanes
from tv_ir.semantics.ops.lane_merge_sort import merge_sort_lanes
from tv_ir.semantics.ops.registry import REGION_ON_ARRAYS, op
from tv_ir.semantics.ops.shape import _pad_dim

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
    """Apply a reducer region once to scalars: accs <- body(accs, elems)."""
    return ctx.run_region(region_index, list(accs) + list(elems))


def assemble(shape: tuple, scalars: list) -> np.ndarray:
    """An array of `shape` from a row-major list of 0-d arrays (object dtype if any is)."""
    scalars = [np.asarray(v) for v in scalars]
    kinds = {v.dtype for v in scalars}
    dtype = object if object in kinds or not kinds else np.result_type(*kinds)
    out = np.empty(len(scalars), dtype=dtype)
    for i, v in enumerate(scalars):
        out[i] = v[()]
    return out.reshape(shape)


def fold_lanes(ctx, region_index: int, inits: list, lanes: list) -> list:
    """Fold a reducer region along the last axis of each of `lanes`, one position at a time.

    Regions take scalars, so the body runs once per element: result[i] is
    body(...body(body(inits, lanes[..][i, 0]), lanes[..][i, 1])..., lanes[..][i, n-1]).
    """
    keep = lanes[0].shape[:-1]
    per_result: list[list] = [[] for _ in inits]
    for i in np.ndindex(*keep):
        accs = [np.asarray(v) for v in inits]
        for j in range(lanes[0].shape[-1]):
            accs = fold(ctx, region_index, accs, [np.asarray(x[i + (j,)]) for x in lanes])
        for out, a in zip(per_result, accs, strict=True):
            out.append(a)
    if not keep or all(keep):
        return [assemble(keep, r) for r in per_result]
    return [np.broadcast_to(v, keep).copy() for v in inits]  # no lanes at all


@op("stablehlo.reduce")
def reduce(ctx, *operands):
    n = len(operands) // 2
    inputs, inits = operands[:n], operands[n:]
    axes = tuple(ctx.attr("dimensions"))
    keep = tuple(s for d, s in enumerate(np.shape(inputs[0])) if d not in axes)
    if any(np.shape(inputs[0])[d] == 0 for d in axes):
        return [np.broadcast_to(i, keep).copy() for i in inits]  # nothing to reduce: the inits
    kind = reducer_kind(ctx) if n == 1 else None
    if kind is not None and ctx.result_types[0].is_complex:
        if kind[0] == "reduce_sum":  # a sum of complex numbers: the sums of their parts
            return complex_numbers.reduce_sum(ctx.alg, inputs[0], inits[0], axes)
        kind = None  # other bodies run op by op (ops without complex semantics refuse)
    if kind is not None:
        reduction, binary = kind
        reduced = getattr(ctx.alg, reduction)(inputs[0], axes)
        return getattr(ctx.alg, binary)(inits[0], reduced)
    # general reducer: move reduced axes last, fold each lane
    lanes = [_axes_last(np.asarray(x), axes).reshape(keep + (-1,)) for x in inputs]
    return fold_lanes(ctx, 0, list(inits), lanes)


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
            x = _pad_dim(
                np.asarray(x), init, d, int(padding[d, 0]), int(padding[d, 1]), base_dil[d] - 1
            )
        padded.append(x)
    shape = padded[0].shape
    out = [(shape[d] - ((window[d] - 1) * win_dil[d] + 1)) // strides[d] + 1 for d in range(rank)]
    out = [max(o, 0) for o in out]
    if 0 in out:
        return [np.broadcast_to(i, out).copy() for i in inits]
    kind = reducer_kind(ctx) if n == 1 else None
    if kind is not None:  # each window's elements on trailing axes of a view (no copy)
        reduction, binary = kind
        span = [(w - 1) * d + 1 for w, d in zip(window, win_dil, strict=True)]
        views = np.lib.stride_tricks.sliding_window_view(padded[0], span)
        views = views[
            tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(out, strides, strict=True))
            + tuple(slice(None, None, d) for d in win_dil)
        ]
        reduced = getattr(ctx.alg, reduction)(views, tuple(range(rank, 2 * rank)))
        return getattr(ctx.alg, binary)(np.broadcast_to(inits[0], out), reduced)
    slices = []
    for w in itertools.product(*[range(k) for k in window]):
        idx = tuple(
            slice(w[d] * win_dil[d], w[d] * win_dil[d] + (out[d] - 1) * strides[d] + 1, strides[d])
            for d in range(rank)
        )
        slices.append([p[idx] for p in padded])
    # general reducer: stack each window's elements on a last axis, fold each lane
    lanes = [np.stack([s[k] for s in slices], axis=-1) for k in range(n)]
    return fold_lanes(ctx, 0, list(inits), lanes)


@op("stablehlo.dot_general")
def dot_general(ctx, lhs, rhs):
    if ctx.result_type.is_complex:
        return complex_numbers.dot_general(ctx, lhs, rhs, dot_general)
    dims = ctx.attr("dot_dimension_numbers")
    t = ctx.result_type
    lhs = ctx.alg.convert(lhs, ctx.operand_types[0], _like(ctx.operand_types[0], t))
    rhs = ctx.alg.convert(rhs, ctx.operand_types[1], _like(ctx.operand_types[1], t))
    lb, rb, lc, rc = dims.lhs_batch, dims.rhs_batch, dims.lhs_contract, dims.rhs_contract
    lf = [d for d in range(lhs.ndim) if d not in lb and d not in lc]
    rf = [d for d in range(rhs.ndim) if d not in rb and d not in rc]
    B = math.prod(lhs.shape[d] for d in lb)
    M = math.prod(lhs.shape[d] for d in lf)
    N = math.prod(rhs.shape[d] for d in rf)
    K = math.prod(lhs.shape[d] for d in lc)
    a = np.transpose(lhs, list(lb) + lf + list(lc)).reshape(B, M, K)
    b = np.transpose(rhs, list(rb) + list(rc) + rf).reshape(B, K, N)
    return ctx.alg.matmul(a, b).reshape(t.shape)


@op("stablehlo.convolution")
def convolution(ctx, lhs, rhs):
    """The spec's definition: dot products of (padded, dilated) lhs windows with rhs.

    Works in canonical layouts (lhs [N, C, spatial...], rhs [O, I, spatial...]); all windows
    are gathered by strided slices and contracted with the kernel in one matmul.
    Feature and batch groups split lhs and rhs and concatenate the results on features.
    """
    dn = ctx.attr("dimension_numbers")
    t = ctx.result_type
    lhs = ctx.alg.convert(lhs, ctx.operand_types[0], _like(ctx.operand_types[0], t))
    rhs = ctx.alg.convert(rhs, ctx.operand_types[1], _like(ctx.operand_types[1], t))
    x = np.transpose(lhs, [dn.input_batch, dn.input_feature, *dn.input_spatial])
    k = np.transpose(rhs, [dn.kernel_output_feature, dn.kernel_input_feature, *dn.kernel_spatial])
    nsp = x.ndim - 2
    reversal = ctx.attr("window_reversal") or (False,) * nsp
    k = np.flip(k, axis=tuple(2 + d for d in range(nsp) if reversal[d]))  # = reversed windows
    padding = ctx.attr("padding")
    padding = np.zeros((nsp, 2), int) if padding is None else np.asarray(padding).reshape(nsp, 2)
    lhs_dil = ctx.attr("lhs_dilation") or (1,) * nsp
    zero = ctx.alg.constant(np.zeros(()), TensorType((), t.dtype))
    for d in range(nsp):
        x = _pad_dim(x, zero, 2 + d, int(padding[d, 0]), int(padding[d, 1]), lhs_dil[d] - 1)
    groups_f, groups_b = ctx.attr("feature_group_count", 1), ctx.attr("batch_group_count", 1)
    xs = np.split(x, groups_f, axis=1) if groups_f > 1 else np.split(x, groups_b, axis=0)
    ks = np.split(k, max(groups_f, groups_b), axis=0)
    out = [_conv_canonical(ctx, xg, kg) for xg, kg in zip(xs, ks, strict=True)]
    canon = np.concatenate(out, axis=1) if len(out) > 1 else out[0]
    perm = [dn.output_batch, dn.output_feature, *dn.output_spatial]
    return np.transpose(canon, np.argsort(perm)).reshape(t.shape)


def _conv_canonical(ctx, x, k):
    """Ungrouped convolution of padded x [N, C, S...] with k [O, C, K...] -> [N, O, W...]."""
    nsp = x.ndim - 2
    strides = ctx.attr("window_strides") or (1,) * nsp
    rhs_dil = ctx.attr("rhs_dilation") or (1,) * nsp
    ksz = k.shape[2:]
    out = [(x.shape[2 + d] - ((ksz[d] - 1) * rhs_dil[d] + 1)) // strides[d] + 1 for d in range(nsp)]
    out = [max(o, 0) for o in out]
    patches = []  # one [N, C, W...] slice per kernel offset, in row-major kernel order
    for w in itertools.product(*[range(n) for n in ksz]):
        idx = tuple(
            slice(w[d] * rhs_dil[d], w[d] * rhs_dil[d] + (out[d] - 1) * strides[d] + 1, strides[d])
            if out[d]
            else slice(0, 0)
            for d in range(nsp)
        )
        patches.append(x[(slice(None), slice(None)) + idx])
    n, c, o = x.shape[0], x.shape[1], k.shape[0]
    p = len(patches)
    stacked = np.stack(patches, axis=2) if patches else np.zeros((n, c, 0, *out), x.dtype)
    # [N, C, P, W...] -> [1, N*W, C*P]; kernel [O, C, K...] -> [1, C*P, O] (same (c, p) order)
    a = np.transpose(stacked, [0, *range(3, 3 + nsp), 1, 2]).reshape(1, -1, c * p)
    b = k.reshape(o, c * p).T.reshape(1, c * p, o)
    r = ctx.alg.matmul(a, b).reshape(n, *out, o)
    return np.moveaxis(r, -1, 1)


def _like(src, dst):
    """src's shape with dst's element type (dot_general's operand promotion)."""
    return TensorType(src.shape, dst.dtype)


@op("stablehlo.sort")
def sort(ctx, *operands):
    return sort_with(ctx, operands, ctx.attr("dimension"), lambda args: ctx.run_region(0, args)[0])


def sort_with(ctx, operands, dim: int, less) -> list:
    """Stable sort of `operands` along `dim` by the comparator `less(args)`, which takes the
    scalars (lhs_0, rhs_0, lhs_1, rhs_1, ...) and returns a predicate (sort's region)."""
    arrays = [np.asarray(x) for x in operands]
    moved = [np.moveaxis(a, dim, -1) for a in arrays]
    lanes = moved[0].shape[:-1]
    n = moved[0].shape[-1]
    outs = [m.copy() for m in moved]
    if any(ctx.alg.is_symbolic(a) for a in arrays):
        return [np.moveaxis(o, -1, dim) for o in _sort_network(ctx, outs, lanes, n, less)]
    token = REGION_ON_ARRAYS.set(True)
    try:  # the comparator on whole arrays: fast; a region that needs scalars falls back
        done = checked_sort_lanes(moved, less) or merge_sort_lanes(moved, less)
        return [np.moveaxis(o, -1, dim) for o in done]
    except (OutOfTime, OutOfMemoryBudget, MemoryError):
        raise
    except Exception:  # noqa: BLE001 - a comparator that cannot run on arrays
        pass
    finally:
        REGION_ON_ARRAYS.reset(token)

    for lane in np.ndindex(*lanes):

        def lt(i, j, lane=lane):
            args = []
            for m in moved:
                args += [m[lane + (i,)], m[lane + (j,)]]
            return ctx.alg.truth(less([np.asarray(a) for a in args]))

        def cmp(i, j, lt=lt):
            if lt(i, j):
                return -1
            if lt(j, i):
                return 1
            return 0

        perm = sorted(range(n), key=functools.cmp_to_key(cmp))  # Python's sort is stable
        for o, m in zip(outs, moved, strict=True):
            o[lane] = m[lane][perm]
    return [np.moveaxis(o, -1, dim) for o in outs]


def _sort_network(ctx, outs: list, lanes: tuple, n: int, less) -> list:
    """Sort on input-dependent keys: odd-even transposition (n rounds of compare-exchange of
    neighbours, swapping only when the right one is strictly less: stable), every exchange a
    `select` on the comparator, so the result is a term in the inputs."""
    outs = [o.astype(object) for o in outs]
    for lane in np.ndindex(*lanes):
        for rnd in range(n):
            for i in range(rnd % 2, n - 1, 2):
                a, b = lane + (i,), lane + (i + 1,)
                args = []
                for o in outs:
                    args += [np.asarray(o[b]), np.asarray(o[a])]
                swap = less(args)  # less(b, a)
                for o in outs:
                    x, y = np.asarray(o[a]), np.asarray(o[b])
                    o[a] = np.asarray(ctx.alg.select(swap, y, x))[()]
                    o[b] = np.asarray(ctx.alg.select(swap, x, y))[()]
    return outs


@op("mhlo.topk")
def topk(ctx, x):
    """XLA's TopK (from HLO; serialized StableHLO spells it `custom_call @mhlo.topk`): the
    k largest elements of each lane of the last dimension, in order, and their indices;
    equal elements in index order (-0.0 and NaN by IEEE totalOrder). As chlo.top_k's
    legalization: a stable sort of (x, iota), then the first k. `largest = false` XLA:CPU
    does not run (no reference to check against): unsupported."""
    k = ctx.attr("k")
    if not ctx.attr("largest", True):
        raise ctx.unsupported("largest = false")
    t = ctx.result_types[1]
    dim = np.ndim(x) - 1
    shape = [1] * np.ndim(x)
    shape[dim] = np.shape(x)[dim]
    iota = np.broadcast_to(np.arange(np.shape(x)[dim]).reshape(shape), np.shape(x))
    iota = iota.astype(t.numpy_dtype)
    gt = ctx.alg.compare_total if ctx.operand_types[0].is_float else ctx.alg.compare
    values, indices = sort_with(ctx, [x, iota], dim, lambda args: gt("GT", args[0], args[1]))
    return [values[..., :k], indices[..., :k]]
