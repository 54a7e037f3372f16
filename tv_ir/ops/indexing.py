"""gather and scatter, following the index formulas of the StableHLO spec."""

from __future__ import annotations

import numpy as np

from .reduction import reducer_kind
from .registry import op


def _start_vectors(indices: np.ndarray, index_vector_dim: int) -> np.ndarray:
    """Index array with the index vector moved last: shape batch_shape + (k,)."""
    if index_vector_dim == indices.ndim:
        indices = indices[..., None]
    return np.moveaxis(indices, index_vector_dim, -1)


def _batch_dim(d: int, index_vector_dim: int) -> int:
    """Position of start-indices dim d among the batch dims (the index vector dim removed)."""
    return d if d < index_vector_dim else d - 1


@op("stablehlo.gather")
def gather(ctx, operand, start_indices):
    dn = ctx.attr("dimension_numbers")
    slice_sizes = ctx.attr("slice_sizes")
    out_shape = ctx.result_type.shape
    operand = np.asarray(operand)
    starts = _start_vectors(ctx.alg.indices(start_indices), dn.index_vector_dim)
    batch_dims = [d for d in range(len(out_shape)) if d not in dn.offset_dims]
    grid = np.indices(out_shape, dtype=np.int64) if out_shape else np.zeros((0,), np.int64)
    batch_index = tuple(grid[d] for d in batch_dims)
    vec = starts[batch_index] if batch_dims else starts.reshape(starts.shape[-1:])
    window_dims = [
        d for d in range(operand.ndim)
        if d not in dn.collapsed_slice_dims and d not in dn.operand_batching_dims
    ]
    operand_index = []
    for d in range(operand.ndim):
        idx = np.zeros(out_shape, np.int64)
        if d in dn.start_index_map:
            k = dn.start_index_map.index(d)
            idx = idx + np.clip(vec[..., k], 0, operand.shape[d] - slice_sizes[d])
        if d in dn.operand_batching_dims:
            k = dn.operand_batching_dims.index(d)
            bd = _batch_dim(dn.start_indices_batching_dims[k], dn.index_vector_dim)
            idx = idx + batch_index[bd]
        if d in window_dims:
            idx = idx + grid[dn.offset_dims[window_dims.index(d)]]
        operand_index.append(idx)
    return operand[tuple(operand_index)]


@op("stablehlo.scatter")
def scatter(ctx, *operands):
    n = (len(operands) - 1) // 2
    inputs = [np.asarray(x) for x in operands[:n]]
    indices = ctx.alg.indices(operands[n])
    updates = [np.asarray(u) for u in operands[n + 1 :]]
    dn = ctx.attr("scatter_dimension_numbers")
    symbolic = any(x.dtype == object for x in inputs + updates)
    results = [x.astype(object) if symbolic else x.copy() for x in inputs]
    starts = _start_vectors(indices, dn.index_vector_dim)
    upd_shape = updates[0].shape
    scatter_dims = [d for d in range(len(upd_shape)) if d not in dn.update_window_dims]
    window_dims = [
        d for d in range(inputs[0].ndim)
        if d not in dn.inserted_window_dims and d not in dn.input_batching_dims
    ]
    kind = reducer_kind(ctx) if n == 1 else None
    replace = _is_replace(ctx)
    for update_index in np.ndindex(*upd_shape):
        scatter_index = tuple(update_index[d] for d in scatter_dims)
        vec = starts[scatter_index]
        result_index = []
        for d in range(inputs[0].ndim):
            i = 0
            if d in dn.scattered_dims_to_operand_dims:
                i += int(vec[dn.scattered_dims_to_operand_dims.index(d)])
            if d in dn.input_batching_dims:
                k = dn.input_batching_dims.index(d)
                i += scatter_index[_batch_dim(dn.scatter_indices_batching_dims[k],
                                              dn.index_vector_dim)]
            if d in window_dims:
                i += update_index[dn.update_window_dims[window_dims.index(d)]]
            result_index.append(i)
        if any(i < 0 or i >= s for i, s in zip(result_index, inputs[0].shape, strict=True)):
            continue  # out-of-bounds updates are skipped (XLA's behaviour)
        ri = tuple(result_index)
        if replace:
            for r, u in zip(results, updates, strict=True):
                r[ri] = u[update_index]
        elif kind is not None:
            binary = getattr(ctx.alg, kind[1])
            results[0][ri] = binary(np.asarray(results[0][ri]), np.asarray(updates[0][update_index]))
        else:
            new = ctx.run_region(
                0, [np.asarray(r[ri]) for r in results] + [np.asarray(u[update_index]) for u in updates]
            )
            for r, v in zip(results, new, strict=True):
                r[ri] = v
    return results


def _is_replace(ctx) -> bool:
    """The update computation returns its update arguments unchanged."""
    block = ctx.regions[0].block
    n = len(block.args) // 2
    return not block.ops and [v.id for v in block.results] == [a.id for a in block.args[n:]]
