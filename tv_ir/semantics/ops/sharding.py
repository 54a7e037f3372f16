"""Shardy's global-view ops: what they mean in a sharded program read as one computation.

A pre-partition Shardy program describes global tensors; its sharding ops only say where
the pieces live. `sdy.reshard`, `sdy.sharding_constraint` and the explicit collectives
`sdy.all_gather`, `sdy.all_slice`, `sdy.all_to_all`, `sdy.collective_permute` move data
between devices without changing the global tensor, and `sdy.all_reduce` /
`sdy.reduce_scatter` turn a tensor held as partial sums over some axes (unreduced) into its
reduced form: the global value, again, is unchanged. So in the global view (the semantics
the partitioned program must preserve) each is the identity, and `sdy.constant` is a
constant. A per-device program never holds them (the SPMD interpreter refuses them).
"""

from __future__ import annotations

import numpy as np

from tv_ir.semantics.ops.registry import global_view_op

# the global-view collectives whose operand is a partial sum over the reduced axes
REDUCING = ("sdy.all_reduce", "sdy.reduce_scatter")


@global_view_op(
    "sdy.reshard",
    "sdy.sharding_constraint",
    "sdy.all_gather",
    "sdy.all_slice",
    "sdy.all_to_all",
    "sdy.collective_permute",
    *REDUCING,
)
def same_global_value(ctx, x):
    return x


@global_view_op("sdy.constant")
def constant(ctx):
    return ctx.alg.constant(np.asarray(ctx.attr("value")), ctx.result_type)
