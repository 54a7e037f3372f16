"""The op table: one entry per StableHLO op, shared by the concrete and symbolic interpreters.

An evaluator is `fn(ctx, *operands) -> array | list[array]`. It sees decoded attributes and
result types through `ctx`, and does element arithmetic only through `ctx.alg` (numpy floats
for the concrete interpreter, terms for the symbolic one). Indexing logic is plain numpy,
which works for both float and object (term) arrays.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tv_ir.errors import Unsupported

# True while a region runs on arrays standing for many scalars at once (a sort's comparator
# over all lanes, lane_merge_sort): the region's scalar results may be such arrays
REGION_ON_ARRAYS = contextvars.ContextVar("region_on_arrays", default=False)

# element-wise ops: each result element is f of the operands' elements at its position
ELEMENTWISE = frozenset(
    "stablehlo." + n
    for n in (
        "add subtract multiply divide remainder power maximum minimum atan2 negate abs sign "
        "compare select clamp and or xor not convert exponential exponential_minus_one log "
        "log_plus_one logistic tanh sqrt rsqrt cbrt sine cosine tan floor ceil "
        "round_nearest_afz round_nearest_even is_finite"
    ).split()
)

OPS: dict[str, Callable] = {}
# ops that read the process's place in the grid (partition_id, replica_id): per-device
# evaluators like OPS, kept apart because single-device conformance cannot exercise them
PROCESS_OPS: dict[str, Callable] = {}
# collectives: `fn(ctx, grid, per_device_operands) -> per_device_results`, run by
# tv_ir.semantics.interpreters.spmd.SpmdInterpreter on all devices at once
# (tv_ir/semantics/ops/collectives.py)
COLLECTIVES: dict[str, Callable] = {}
# Shardy's global-view ops (`sdy.reshard`, `sdy.all_gather`, ...): evaluators of what a
# sharded, pre-partition program means as a whole (tv_ir/semantics/ops/sharding.py); a per-device
# program never holds them
GLOBAL_VIEW: dict[str, Callable] = {}


def _registrar(table: dict[str, Callable], kind: str, names: tuple[str, ...]):
    def register(fn: Callable) -> Callable:
        for n in names:
            if n in OPS or n in PROCESS_OPS or n in COLLECTIVES or n in GLOBAL_VIEW:
                raise ValueError(f"{kind} {n} registered twice")
            table[n] = fn
        return fn

    return register


def op(*names: str):
    """Register an evaluator under one or more op names; refuses duplicates."""
    return _registrar(OPS, "op", names)


def process_op(*names: str):
    """Register a per-device evaluator that needs `ctx.device`; refuses duplicates."""
    return _registrar(PROCESS_OPS, "op", names)


def collective(*names: str):
    """Register a collective evaluator (all devices at once); refuses duplicates."""
    return _registrar(COLLECTIVES, "collective", names)


def global_view_op(*names: str):
    """Register the global-view meaning of a Shardy op; refuses duplicates."""
    return _registrar(GLOBAL_VIEW, "op", names)


def lookup(name: str, loc=None) -> Callable:
    """The per-device evaluator of `name`; collectives have none (they need SPMD execution)."""
    fn = OPS.get(name) or PROCESS_OPS.get(name) or GLOBAL_VIEW.get(name)
    if fn is not None:
        return fn
    if name in COLLECTIVES:
        raise Unsupported(
            f"{name} needs SPMD execution (tv_ir.semantics.interpreters.spmd.SpmdInterpreter)",
            op=name,
            loc=loc,
        )
    raise Unsupported(f"unsupported op {name}", op=name, loc=loc)


@dataclass
class OpContext:
    """What an evaluator may know about the op it evaluates."""

    name: str
    attrs: dict[str, Any]
    operand_types: list
    result_types: list
    alg: Any  # the element algebra (tv_ir.semantics.algebra.NumpyAlgebra or a subclass)
    run_region: Callable[[int, list], list]  # evaluate region i on argument arrays
    regions: list = field(
        default_factory=list
    )  # tv_ir.ir.program.Region objects (for pattern checks)
    call: Callable[[str, list], list] | None = None  # call a module function by name
    device: Any = (
        None  # tv_ir.semantics.interpreters.process_grid.Device under SPMD execution, else None
    )
    loc: Any = None
    # evaluate region i on numbers (numpy arrays) whatever `alg` is: what a loop whose trip
    # count depends on the inputs computes, for the values of its terms
    run_numeric: Callable[[int, list], list] | None = None

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def unsupported(self, why: str) -> Unsupported:
        return Unsupported(f"{self.name}: {why}", op=self.name, loc=self.loc)

    @property
    def result_type(self):
        return self.result_types[0]
