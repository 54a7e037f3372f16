"""Control flow and calls: while, case, if, func.call, composite, custom_call.

Loops run (unrolled) when their predicates fold to constants; a loop predicate that depends
on symbolic inputs is unsupported. A `case` / `if` whose branch index or predicate depends
on the inputs runs every branch and selects among their results by it, when no branch
holds a collective (running every branch is then the same function as running the chosen
one; `tv_ir.semantics.interpreters.spmd` also allows collectives when every device decides on
the same term).
"""

from __future__ import annotations

import numpy as np

from tv_ir.errors import Unsupported
from tv_ir.semantics.ops.registry import op

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
    n = len(ctx.regions)
    i = ctx.alg.known_index(index)
    if i is not None:
        return ctx.run_region(i if 0 <= i < n else n - 1, [])
    refuse_collective_branches(ctx.regions, "a case index", ctx.loc)
    return select_case(ctx.alg, index, [ctx.run_region(k, []) for k in range(n)])


@op("stablehlo.if")
def if_(ctx, pred):
    decided = known_truth(ctx.alg, pred)
    if decided is not None:
        return ctx.run_region(0 if decided else 1, [])
    refuse_collective_branches(ctx.regions, "an if predicate", ctx.loc)
    return select_results(ctx.alg, pred, ctx.run_region(0, []), ctx.run_region(1, []))


def known_truth(alg, pred) -> bool | None:
    """A predicate's truth, or None when it depends on the inputs."""
    try:
        return alg.truth(pred)
    except Unsupported as e:
        if "depends on the inputs" not in str(e):
            raise
        return None


def select_case(alg, index, results: list[list]) -> list:
    """`case` as a choice among every branch's results (an index out of range: the last)."""
    chosen = results[-1]
    index = np.asarray(index)
    for k in reversed(range(len(results) - 1)):
        is_k = alg.compare("EQ", index, np.asarray(k, dtype=index.dtype))
        chosen = select_results(alg, is_k, results[k], chosen)
    return chosen


def select_results(alg, pred, on_true: list, on_false: list) -> list:
    """Each result chosen by a scalar predicate."""
    out = []
    for a, b in zip(on_true, on_false, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        p = np.broadcast_to(np.asarray(pred, dtype=object), a.shape)
        out.append(np.asarray(alg.select(p, a, b)))
    return out


def refuse_collective_branches(regions, what: str, loc=None) -> None:
    """Every branch may run only if none talks to other devices."""
    from tv_ir.semantics.ops.registry import COLLECTIVES

    stack = [r.block for r in regions]
    while stack:
        block = stack.pop()
        for inner in block.ops:
            if inner.name in COLLECTIVES:
                raise Unsupported(
                    f"{what} depends on the inputs and a branch holds {inner.name}",
                    op=inner.name,
                    loc=loc,
                )
            stack.extend(r.block for r in inner.regions)


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


@op("stablehlo.after_all")
def after_all(ctx, *tokens):
    """A token orders side effects and carries no value (tv's tokens are None); a program
    with no side effects has nothing for it to order."""
    return None
