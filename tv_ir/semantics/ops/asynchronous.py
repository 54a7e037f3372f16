"""async_start / async_done (StableHLO spec): the asynchrony is a scheduling hint, so the
pair means the op in async_start's body applied to its operands. A future holds that op's
results (tv_ir.ir.importer reads `!stablehlo.future<T>` as T, or a tuple of several). A body
holding a collective runs in lockstep on every device (tv_ir.semantics.interpreters.spmd)."""

from __future__ import annotations

from tv_ir.semantics.ops.registry import op


@op("stablehlo.async_start")
def async_start(ctx, *operands):
    results = ctx.run_region(0, list(operands))
    return results[0] if len(results) == 1 else tuple(results)


@op("stablehlo.async_done")
def async_done(ctx, future):
    return list(future) if isinstance(future, tuple) else future
