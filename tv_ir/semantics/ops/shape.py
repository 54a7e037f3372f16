"""Data-movement ops: pure indexing, identical for concrete and symbolic elements."""

from __future__ import annotations

import functools
import itertools

import numpy as np

from tv_ir.semantics.ops.registry import op


def filled(shape, value) -> np.ndarray:
    """An array of `shape` holding `value` broadcast to it (a 0-d array: everywhere), a copy
    in one step (any dtype, objects too)."""
    value = np.asarray(value)
    out = np.empty(shape, dtype=value.dtype)
    out[...] = value
    return out


def start_indices(operand_shape, sizes, starts: list) -> list:
    """dynamic_slice / dynamic_update_slice offsets: clamped into range (spec semantics).
    A start may be an integer array (one start per case: `np.clip` of each)."""
    return [
        np.clip(s, 0, n - k) if isinstance(s, np.ndarray) else min(max(s, 0), n - k)
        for s, n, k in zip(starts, operand_shape, sizes, strict=True)
    ]


# a constant that stands for any table of its shape: shape reduction marks a float table it
# shrank with a key naming the real table (passes/shape_reduction, rule_constant); concrete
# runs read its values, proofs one symbol per element, the same in both programs
TABLE_ATTR = "tv.table"


@op("stablehlo.constant")
def constant(ctx):
    value = np.asarray(ctx.attr("value"))
    key = ctx.attr(TABLE_ATTR)
    if key is not None:
        return ctx.alg.table(value, ctx.result_type, key)
    return ctx.alg.constant(value, ctx.result_type)


@op("stablehlo.iota")
def iota(ctx):
    t = ctx.result_type
    dim = ctx.attr("iota_dimension")
    shape = [1] * len(t.shape)
    shape[dim] = t.shape[dim]
    r = np.arange(t.shape[dim]).reshape(shape)
    return np.broadcast_to(r, t.shape).astype(t.numpy_dtype)


@op("stablehlo.broadcast_in_dim")
def broadcast_in_dim(ctx, x):
    t = ctx.result_type
    dims = ctx.attr("broadcast_dimensions")
    shape = [1] * len(t.shape)
    for i, d in enumerate(dims):
        shape[d] = x.shape[i]
    # operand dims may be permuted relative to result dims: order them first
    order = _sorting_order(tuple(dims))
    return filled(t.shape, np.reshape(np.transpose(x, order) if order is not None else x, shape))


@functools.lru_cache(maxsize=4096)
def _sorting_order(dims: tuple) -> list[int] | None:
    """The permutation putting `dims` in ascending order, or None when they already are."""
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    return None if order == list(range(len(dims))) else order


@op("stablehlo.reshape")
def reshape(ctx, x):
    return np.reshape(x, ctx.result_type.shape)


@op("stablehlo.transpose")
def transpose(ctx, x):
    return np.transpose(x, ctx.attr("permutation"))


@op("stablehlo.slice")
def slice_(ctx, x):
    starts, limits = ctx.attr("start_indices"), ctx.attr("limit_indices")
    strides = ctx.attr("strides") or (1,) * len(starts)
    return x[tuple(slice(s, e, k) for s, e, k in zip(starts, limits, strides, strict=True))]


# at most this many start combinations are enumerated for offsets that depend on the inputs
MAX_START_CASES = 4096


@op("stablehlo.dynamic_slice")
def dynamic_slice(ctx, x, *indices):
    sizes = ctx.attr("slice_sizes")

    def at(starts):
        return x[tuple(slice(s, s + n) for s, n in zip(starts, sizes, strict=True))]

    return _by_start_cases(ctx, x.shape, sizes, indices, at)


@op("stablehlo.dynamic_update_slice")
def dynamic_update_slice(ctx, x, update, *indices):
    def at(starts):
        numbers = type(x) is np.ndarray and type(update) is np.ndarray
        if numbers and x.dtype != object and update.dtype != object:
            out = x.copy()  # the common case: no promotion to objects to consider
        else:
            out = _common(x, update).copy()
        out[tuple(slice(s, s + n) for s, n in zip(starts, update.shape, strict=True))] = update
        return out

    return _by_start_cases(ctx, x.shape, update.shape, indices, at)


def _by_start_cases(ctx, operand_shape, sizes, index_arrays, at):
    """`at(starts)` at the clamped starts; an offset that depends on the inputs is read by
    cases: a `select` over every start it can clamp to (the first and last take every index
    below and above the range)."""
    known_index = ctx.alg.known_index
    known = [known_index(i) for i in index_arrays]
    if None not in known:
        return at(start_indices(operand_shape, sizes, known))
    ranges = []
    for d, k in enumerate(known):
        top = operand_shape[d] - sizes[d]
        ranges.append([min(max(k, 0), top)] if k is not None else list(range(top + 1)))
    cases = list(itertools.product(*ranges))
    if len(cases) > MAX_START_CASES:
        raise ctx.unsupported(
            f"an offset that depends on the inputs can take {len(cases)} start combinations "
            f"(more than {MAX_START_CASES})"
        )
    result = None
    for starts in reversed(cases):
        value = np.asarray(at(list(starts)))
        if result is None:
            result = value
            continue
        cond = None
        for d, (k, idx) in enumerate(zip(known, index_arrays, strict=True)):
            top = operand_shape[d] - sizes[d]
            if k is not None or top == 0:
                continue  # a known start, or one every index clamps to
            idx = np.asarray(idx)
            bound = np.asarray(starts[d], dtype=idx.dtype)
            if starts[d] == 0:
                c = ctx.alg.compare("LE", idx, bound)
            elif starts[d] == top:
                c = ctx.alg.compare("GE", idx, bound)
            else:
                c = ctx.alg.compare("EQ", idx, bound)
            cond = c if cond is None else ctx.alg.logical_and(cond, c)
        pred = np.broadcast_to(np.asarray(cond, dtype=object), value.shape)
        result = np.asarray(ctx.alg.select(pred, value, result))
    return result


def _common(*arrays):
    """Promote to object dtype if any array is symbolic, so assignment keeps terms."""
    if any(np.asarray(a).dtype == object for a in arrays):
        return np.asarray(arrays[0]).astype(object)
    return np.asarray(arrays[0])


@op("stablehlo.concatenate")
def concatenate(ctx, *xs):
    dim = ctx.attr("dimension")
    if any(np.asarray(a).dtype == object for a in xs):
        xs = [np.asarray(a).astype(object) for a in xs]
    return np.concatenate(xs, axis=dim)


@op("stablehlo.pad")
def pad(ctx, x, padding_value):
    lo, hi = ctx.attr("edge_padding_low"), ctx.attr("edge_padding_high")
    interior = ctx.attr("interior_padding")
    out = x
    for d in range(x.ndim):
        out = _pad_dim(out, padding_value, d, lo[d], hi[d], interior[d])
    return out


def _pad_dim(x, value, d, lo, hi, interior):
    n = x.shape[d]
    inner = n + max(n - 1, 0) * interior
    total = max(lo, 0) + inner + max(hi, 0)
    shape = list(x.shape)
    shape[d] = total
    kind = object if (x.dtype == object or np.asarray(value).dtype == object) else x.dtype
    out = filled(shape, np.asarray(value).astype(kind))
    idx = [slice(None)] * x.ndim
    idx[d] = slice(max(lo, 0), max(lo, 0) + inner, interior + 1)
    out[tuple(idx)] = x
    idx[d] = slice(max(-lo, 0), total - max(-hi, 0))
    return out[tuple(idx)]


@op("stablehlo.reverse")
def reverse(ctx, x):
    return np.flip(x, axis=tuple(ctx.attr("dimensions")))


@op("stablehlo.get_dimension_size")
def get_dimension_size(ctx, x):
    return np.asarray(x.shape[ctx.attr("dimension")], dtype=np.int32)


@op("mhlo.copy")  # XLA's `copy` (in partitioned programs); no StableHLO counterpart
def copy(ctx, x):
    return x


@op("stablehlo.optimization_barrier")
def optimization_barrier(ctx, *xs):
    return list(xs)


@op("stablehlo.tuple")
def tuple_(ctx, *xs):
    return [tuple(xs)]


@op("stablehlo.get_tuple_element")
def get_tuple_element(ctx, t):
    return t[ctx.attr("index")]


@op("stablehlo.bitcast_convert")
def bitcast_convert(ctx, x):
    """Reinterpret the bits: numbers concretely; terms through an opaque function of them
    (tv_ir.semantics.bit_casts: a term has no bit pattern). To the same type (a quantized
    type and its storage type, at import) it is the identity."""
    if ctx.operand_types[0] == ctx.result_type:
        return x
    return ctx.alg.bitcast(x, ctx.operand_types[0], ctx.result_type)
