"""Control flow and calls: while, case, if, func.call, composite, custom_call.

Control decisions must be concrete: loops run (unrolled) when their predicates fold to
constants; a predicate that depends on symbolic inputs is unsupported.
"""

from __future__ import annotations

import numpy as np

from ..errors import Unsupported
from .registry import op

MAX_TRIP_COUNT = 1_000_000


@op("stablehlo.while")
def while_(ctx, *operands):
    values = list(operands)
    for _ in range(MAX_TRIP_COUNT):
        if not ctx.alg.truth(ctx.run_region(0, values)[0]):
            return values
        values = ctx.run_region(1, values)
    raise ctx.unsupported(f"loop did not terminate within {MAX_TRIP_COUNT} iterations")


@op("stablehlo.case")
def case(ctx, index):
    i = ctx.alg.index(index)
    n = len(ctx.regions)
    return ctx.run_region(i if 0 <= i < n else n - 1, [])


@op("stablehlo.if")
def if_(ctx, pred):
    return ctx.run_region(0 if ctx.alg.truth(pred) else 1, [])


@op("func.call")
def call(ctx, *args):
    return ctx.call(ctx.attr("callee"), list(args))


@op("stablehlo.composite")
def composite(ctx, *args):
    """Its semantics are its decomposition function's."""
    return ctx.call(ctx.attr("decomposition"), list(args))


@op("stablehlo.custom_call")
def custom_call(ctx, *args):
    target = ctx.attr("call_target_name")
    if target in ("Sharding", "mhlo.sharding") and len(args) == 1:
        return np.asarray(args[0])  # a sharding annotation: the identity on values
    raise Unsupported(
        f"custom_call @{target} has no known semantics",
        op=f"stablehlo.custom_call @{target}",
        loc=ctx.loc,
    )
