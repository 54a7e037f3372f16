"""gather and scatter, following the index formulas of the StableHLO spec.

Indices that depend on the inputs (symbolic) are split into cases: an element of the result
is a `select` over every in-range start its index vector may take (a start is clamped into
range by gather; a scatter window that does not fit is skipped), so the prover gets a finite
case analysis instead of an unknown.
"""

from __future__ import annotations

import itertools

import numpy as np

from tv_ir.semantics.ops.reduction import reducer_kind
from tv_ir.semantics.ops.registry import op
from tv_ir.semantics.ops.shape import filled


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
    if ctx.alg.is_symbolic(start_indices):
        return _gather_cases(ctx, operand, start_indices)
    starts = _start_vectors(ctx.alg.indices(start_indices), dn.index_vector_dim)
    batch_dims = [d for d in range(len(out_shape)) if d not in dn.offset_dims]
    grid = np.indices(out_shape, dtype=np.int64) if out_shape else np.zeros((0,), np.int64)
    batch_index = tuple(grid[d] for d in batch_dims)
    vec = starts[batch_index] if batch_dims else starts.reshape(starts.shape[-1:])
    window_dims = [
        d
        for d in range(operand.ndim)
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


def _gather_cases(ctx, operand: np.ndarray, start_indices) -> np.ndarray:
    """gather with input-dependent start indices: each element selects among the clamped
    starts its index vector can take."""
    dn = ctx.attr("dimension_numbers")
    sizes = ctx.attr("slice_sizes")
    out_shape = tuple(ctx.result_type.shape)
    starts = _start_vectors(np.asarray(start_indices, dtype=object), dn.index_vector_dim)
    batch_dims = [d for d in range(len(out_shape)) if d not in dn.offset_dims]
    window_dims = [
        d
        for d in range(operand.ndim)
        if d not in dn.collapsed_slice_dims and d not in dn.operand_batching_dims
    ]
    highs = [operand.shape[d] - sizes[d] for d in dn.start_index_map]
    out = np.empty(out_shape, dtype=object)
    for e in np.ndindex(*out_shape):
        batch_index = tuple(e[d] for d in batch_dims)
        vec = starts[batch_index] if batch_dims else starts.reshape(starts.shape[-1:])

        def element(start: tuple, e=e, batch_index=batch_index):
            idx = []
            for d in range(operand.ndim):
                i = 0
                if d in dn.start_index_map:
                    i += start[dn.start_index_map.index(d)]
                if d in dn.operand_batching_dims:
                    k = dn.operand_batching_dims.index(d)
                    i += batch_index[
                        _batch_dim(dn.start_indices_batching_dims[k], dn.index_vector_dim)
                    ]
                if d in window_dims:
                    i += e[dn.offset_dims[window_dims.index(d)]]
                idx.append(i)
            return operand[tuple(idx)]

        out[e] = _by_cases(ctx.alg, list(vec), highs, element, clamped=True)
    return out


def _by_cases(alg, vec: list, highs: list[int], value, clamped: bool, otherwise=None):
    """`value(start)` for the start the index vector `vec` denotes: a select over every
    start in [0, high] per component (`clamped`: out-of-range indices clamp into it;
    else they match no start and the result is `otherwise`)."""
    choices = []
    known = [alg.known_index(v) for v in vec]
    for i, hi in zip(known, highs, strict=True):
        if i is None:
            choices.append(range(hi + 1))
        else:
            if clamped:
                i = min(max(i, 0), hi)
            elif not 0 <= i <= hi:
                return otherwise
            choices.append((i,))
    combos = list(itertools.product(*choices))
    acc = value(combos[-1]) if clamped else otherwise
    rest = combos[:-1] if clamped else combos
    for start in reversed(rest):
        cond = None
        for v, c, hi, i in zip(vec, start, highs, known, strict=True):
            if i is not None:
                continue
            c_is = _index_is(alg, np.asarray(v, dtype=object), c, hi, clamped)
            cond = c_is if cond is None else alg.logical_and(cond, c_is)
        acc = value(start) if cond is None else alg.select(cond, value(start), acc)
    return np.asarray(acc)[()] if isinstance(acc, np.ndarray) else acc


def _index_is(alg, v, c: int, hi: int, clamped: bool):
    """The condition that index v selects start c (of 0..hi)."""
    if clamped and hi == 0:
        return alg.compare("EQ", np.asarray(0), np.asarray(0))
    if clamped and c == 0:
        return alg.compare("LE", v, np.asarray(0))
    if clamped and c == hi:
        return alg.compare("GE", v, np.asarray(hi))
    return alg.compare("EQ", v, np.asarray(c))


@op("stablehlo.scatter")
def scatter(ctx, *operands):
    """The spec's index formulas, with XLA's bounds rule: an update window whose start does
    not fit it inside the operand (start < 0 or start + extent > dim) is skipped whole.
    (The spec skips out-of-bounds elements one by one; XLA drops the window.)"""
    n = (len(operands) - 1) // 2
    if ctx.alg.is_symbolic(operands[n]):
        return _scatter_cases(ctx, n, operands)
    inputs = [np.asarray(x) for x in operands[:n]]
    indices = ctx.alg.indices(operands[n])
    updates = [np.asarray(u) for u in operands[n + 1 :]]
    dn = ctx.attr("scatter_dimension_numbers")
    symbolic = any(x.dtype == object for x in inputs + updates)
    results = [x.astype(object) if symbolic else x.copy() for x in inputs]
    shape = inputs[0].shape
    rule = _update_rule(ctx, n)
    if not symbolic and rule is not None and _windows_last(dn, updates[0].ndim):
        starts = _start_vectors(indices, dn.index_vector_dim)
        _, window_dims, extent = _scatter_geometry(dn, shape, updates[0].shape)
        return _scatter_windows(dn, results, starts, updates, rule, window_dims, extent)
    for update_index, ri in scatter_targets(dn, indices, shape, updates[0].shape):
        olds = [np.asarray(r[ri]) for r in results]
        for r, v in zip(results, _combined(ctx, rule, olds, updates, update_index), strict=True):
            r[ri] = np.asarray(v)[()]
    return results


def scatter_targets(dn, indices: np.ndarray, shape: tuple, upd_shape: tuple):
    """(update index, operand position) of each update element that lands in the operand, in
    the order tv applies them (row-major over the updates); a window whose start does not fit
    it inside the operand is skipped whole (XLA's rule)."""
    starts = _start_vectors(indices, dn.index_vector_dim)
    scatter_dims, window_dims, extent = _scatter_geometry(dn, shape, upd_shape)
    for update_index in np.ndindex(*upd_shape):
        scatter_index = tuple(update_index[d] for d in scatter_dims)
        start = _window_start(dn, starts, scatter_index, shape, extent)
        if start is None:
            continue
        ri = list(start)
        for d, u in zip(window_dims, dn.update_window_dims, strict=True):
            ri[d] += update_index[u]
        yield update_index, tuple(ri)


def _windows_last(dn, update_rank: int) -> bool:
    """The update window dimensions are the updates' last ones: the element-by-element
    order (row-major over the updates) is then window by window, in scatter order."""
    k = len(dn.update_window_dims)
    return list(dn.update_window_dims) == list(range(update_rank - k, update_rank))


def _window_start(dn, starts, scatter_index: tuple, shape: tuple, extent: list):
    """Where the update window `scatter_index` starts in the operand, or None when it does
    not fit there (XLA's rule: skipped whole)."""
    start = _scatter_start(dn, starts[scatter_index], scatter_index, len(shape))
    if any(s < 0 or s + e > m for s, e, m in zip(start, extent, shape, strict=True)):
        return None
    return start


def _scatter_windows(dn, results, starts, updates, rule, window_dims, extent) -> list:
    """Concrete scatter one update window at a time (numpy on the window's block): the
    same combinations, in the same order, as element by element, when the window
    dimensions come last (`_windows_last`); a position is in a window at most once."""
    shape = results[0].shape
    batch = updates[0].shape[: updates[0].ndim - len(dn.update_window_dims)]
    for scatter_index in np.ndindex(*batch):
        start = _window_start(dn, starts, scatter_index, shape, extent)
        if start is None:
            continue
        at = tuple(
            slice(start[d], start[d] + extent[d]) if d in window_dims else start[d]
            for d in range(len(shape))
        )
        news = [np.asarray(u[scatter_index]) for u in updates]
        if rule == "replace":
            for r, v in zip(results, news, strict=True):
                r[at] = v
        else:
            results[0][at] = rule(results[0][at], news[0])
    return results


def _scatter_geometry(dn, shape: tuple, upd_shape: tuple):
    """(update dims that index updates, operand dims a window spans, window extent per
    operand dim)."""
    scatter_dims = [d for d in range(len(upd_shape)) if d not in dn.update_window_dims]
    window_dims = [
        d
        for d in range(len(shape))
        if d not in dn.inserted_window_dims and d not in dn.input_batching_dims
    ]
    extent = [1] * len(shape)
    for d, u in zip(window_dims, dn.update_window_dims, strict=True):
        extent[d] = upd_shape[u]
    return scatter_dims, window_dims, extent


def _update_rule(ctx, n: int):
    """How scatter combines old values with an update: "replace", an algebra binary op
    (a recognised reduction body), or None (run the region)."""
    if _is_replace(ctx):
        return "replace"
    kind = reducer_kind(ctx) if n == 1 else None
    return getattr(ctx.alg, kind[1]) if kind is not None else None


def _combined(ctx, rule, olds: list, updates: list, update_index: tuple) -> list:
    """The update computation applied to the old values and one update element."""
    news = [np.asarray(u[update_index]) for u in updates]
    if rule == "replace":
        return news
    if rule is not None:
        return [rule(olds[0], news[0])]
    return ctx.run_region(0, olds + news)


def _select_and_scatter_cases(ctx, operand, source, result, offsets, strides, lows):
    """select_and_scatter on input-dependent operands: the scan keeps, per window position,
    the condition that it is the selected one; each source element is then added under
    that condition."""
    alg, rank = ctx.alg, operand.ndim
    kind = reducer_kind(ctx, 1)
    for si in np.ndindex(*source.shape):
        window = []
        for w in offsets:
            i = tuple(si[d] * strides[d] - lows[d] + w[d] for d in range(rank))
            if all(0 <= j < n for j, n in zip(i, operand.shape, strict=True)):
                window.append(i)
        if not window:
            continue  # a window of padding only
        chosen = [np.asarray(True)]  # chosen[k]: window[k] is the current selection
        current = np.asarray(operand[window[0]])
        for i in window[1:]:
            keep = ctx.run_region(0, [current, np.asarray(operand[i])])[0]
            chosen = [alg.logical_and(c, keep) for c in chosen]
            chosen.append(alg.logical_not(keep))
            current = alg.select(keep, current, np.asarray(operand[i]))
        new = np.asarray(source[si])
        for c, i in zip(chosen, window, strict=True):
            acc = np.asarray(result[i])
            value = getattr(alg, kind[1])(acc, new) if kind else ctx.run_region(1, [acc, new])[0]
            result[i] = np.asarray(alg.select(c, np.asarray(value), acc))[()]
    return result


def _scatter_cases(ctx, n: int, operands) -> list:
    """scatter with input-dependent indices: every element an update window may land on
    becomes a select between the combined and the old value, per in-bounds start."""
    inputs = [np.asarray(x).astype(object) for x in operands[:n]]
    updates = [np.asarray(u) for u in operands[n + 1 :]]
    dn = ctx.attr("scatter_dimension_numbers")
    starts = _start_vectors(np.asarray(operands[n], dtype=object), dn.index_vector_dim)
    results = [x.copy() for x in inputs]
    shape = inputs[0].shape
    scatter_dims, window_dims, extent = _scatter_geometry(dn, shape, updates[0].shape)
    rule = _update_rule(ctx, n)
    additive = _is_additive(ctx, n)
    scattered = list(dn.scattered_dims_to_operand_dims)
    highs = [shape[d] - extent[d] for d in scattered]
    for update_index in np.ndindex(*updates[0].shape):
        scatter_index = tuple(update_index[d] for d in scatter_dims)
        vec = list(starts[scatter_index])
        base = _scatter_start(dn, [0] * len(vec), scatter_index, len(shape))

        def land(start: tuple, update_index=update_index, base=base):
            ri = list(base)
            for k, d in enumerate(scattered):
                ri[d] += start[k]
            if any(i < 0 or i + e > m for i, e, m in zip(ri, extent, shape, strict=True)):
                return None
            for d, u in zip(window_dims, dn.update_window_dims, strict=True):
                ri[d] += update_index[u]
            return tuple(ri)

        for start in itertools.product(*(range(h + 1) for h in highs)):
            ri = land(start)
            if ri is None:
                continue
            cond = None
            for v, c in zip(vec, start, strict=True):
                i = ctx.alg.known_index(v)
                c_is = (
                    _index_is(ctx.alg, np.asarray(v, dtype=object), c, 0, clamped=False)
                    if i is None
                    else np.asarray(i == c)
                )
                cond = c_is if cond is None else ctx.alg.logical_and(cond, c_is)
            olds = [np.asarray(r[ri]) for r in results]
            if additive:
                # old + (cond ? u : 0), not cond ? old + u : old (see _is_additive)
                u = np.asarray(updates[0][update_index])
                landed = ctx.alg.select(cond, u, np.zeros((), u.dtype))
                results[0][ri] = np.asarray(ctx.alg.add(olds[0], np.asarray(landed)))[()]
                continue
            new = _combined(ctx, rule, olds, updates, update_index)
            for r, old, v in zip(results, olds, new, strict=True):
                r[ri] = np.asarray(ctx.alg.select(cond, np.asarray(v), old))[()]
    return results


def _is_additive(ctx, n: int) -> bool:
    """A scatter-add of numbers: each landing is then written `old + (cond ? u : 0)`.

    Equal to `cond ? old + u : old` for every value of `cond` (over the reals, and for
    wrapping integers), and it keeps the result a sum of one term per update: a scatter-add
    over a batch is then, term for term, the sum of scatter-adds over the batch's pieces
    (the psum of per-device embedding gradients against the spec's one scatter-add), an
    equality of normal forms instead of a case split over every index for the solver.
    Colliding indices add both updates (two terms whose conditions both hold); an
    out-of-bounds index lands nowhere (no start is enumerated for it), as XLA drops it.
    """
    t = ctx.result_types[0]
    if n != 1 or t.is_bool or t.is_complex:
        return False
    kind = reducer_kind(ctx)
    return kind is not None and kind[0] == "reduce_sum"


def _scatter_start(dn, vec, scatter_index: tuple, rank: int) -> list[int]:
    """full_start_index + full_batching_index of one update (spec names)."""
    start = [0] * rank
    for k, d in enumerate(dn.scattered_dims_to_operand_dims):
        start[d] += int(vec[k])
    for d, sd in zip(dn.input_batching_dims, dn.scatter_indices_batching_dims, strict=True):
        start[d] += scatter_index[_batch_dim(sd, dn.index_vector_dim)]
    return start


def _is_replace(ctx) -> bool:
    """The update computation returns its update arguments unchanged."""
    block = ctx.regions[0].block
    n = len(block.args) // 2
    return not block.ops and [v.id for v in block.results] == [a.id for a in block.args[n:]]


@op("stablehlo.select_and_scatter")
def select_and_scatter(ctx, operand, source, init_value):
    """Scatter each source element to the element its window selects.

    A window's selection scans its in-bounds elements in row-major order, keeping the current
    one while `select(current, candidate)` holds (padding is never selected, as in XLA);
    the result starts at init_value and accumulates with `scatter`.
    """
    operand, source = np.asarray(operand), np.asarray(source)
    rank = operand.ndim
    window = ctx.attr("window_dimensions")
    strides = ctx.attr("window_strides") or (1,) * rank
    padding = ctx.attr("padding")
    lows = (
        [0] * rank
        if padding is None
        else [int(p) for p in np.asarray(padding).reshape(rank, 2)[:, 0]]
    )
    symbolic = any(a.dtype == object for a in (operand, source, np.asarray(init_value)))
    result = filled(
        operand.shape, np.asarray(init_value).astype(object if symbolic else operand.dtype)
    )
    kind = reducer_kind(ctx, 1)
    offsets = list(itertools.product(*[range(w) for w in window]))
    if operand.dtype == object:
        return _select_and_scatter_cases(ctx, operand, source, result, offsets, strides, lows)
    for si in np.ndindex(*source.shape):
        selected = None
        for w in offsets:
            i = tuple(si[d] * strides[d] - lows[d] + w[d] for d in range(rank))
            if any(j < 0 or j >= n for j, n in zip(i, operand.shape, strict=True)):
                continue
            if selected is None or not ctx.alg.truth(
                ctx.run_region(0, [np.asarray(operand[selected]), np.asarray(operand[i])])[0]
            ):
                selected = i
        if selected is None:
            continue  # a window of padding only
        acc, new = np.asarray(result[selected]), np.asarray(source[si])
        if kind is not None:
            value = getattr(ctx.alg, kind[1])(acc, new)
        else:
            value = ctx.run_region(1, [acc, new])[0]
        result[selected] = np.asarray(value)[()]
    return result
