"""IR-to-IR passes over tv_ir modules, by name.

Each pass is a module with a `name` and a `run(module) -> module` function; `PASSES` maps
names to them and `run_pipeline` applies a list in order.
"""

from __future__ import annotations

from tv_ir.ir.program import Module

from . import (
    cse,
    dce,
    expand_batch_norm,
    inline_calls,
    inline_fusions,
    reroll,
    table_differences,
    total_order_compare,
)

PASSES = {
    p.name: p
    for p in (
        inline_fusions,
        inline_calls,
        expand_batch_norm,
        cse,
        dce,
        total_order_compare,
        reroll,
        table_differences,
    )
}
DEFAULT_PIPELINE = (
    "inline-fusions",
    "inline-calls",
    "expand-batch-norm",
    "cse",
    "table-differences",
    "total-order-compare",
)


def run_pipeline(module: Module, names=DEFAULT_PIPELINE) -> Module:
    for n in names:
        module = PASSES[n].run(module)
    return module
