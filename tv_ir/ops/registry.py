"""The op table: one entry per StableHLO op, shared by the concrete and symbolic interpreters.

An evaluator is `fn(ctx, *operands) -> array | list[array]`. It sees decoded attributes and
result types through `ctx`, and does element arithmetic only through `ctx.alg` (numpy floats
for the concrete interpreter, terms for the symbolic one). Indexing logic is plain numpy,
which works for both float and object (term) arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import Unsupported

OPS: dict[str, Callable] = {}


def op(*names: str):
    """Register an evaluator under one or more op names; refuses duplicates."""

    def register(fn: Callable) -> Callable:
        for n in names:
            if n in OPS:
                raise ValueError(f"op {n} registered twice")
            OPS[n] = fn
        return fn

    return register


def lookup(name: str, loc=None) -> Callable:
    fn = OPS.get(name)
    if fn is None:
        raise Unsupported(f"unsupported op {name}", op=name, loc=loc)
    return fn


@dataclass
class OpContext:
    """What an evaluator may know about the op it evaluates."""

    name: str
    attrs: dict[str, Any]
    operand_types: list
    result_types: list
    alg: Any  # the element algebra (tv_ir.algebra.NumpyAlgebra or a subclass)
    run_region: Callable[[int, list], list]  # evaluate region i on argument arrays
    regions: list = field(default_factory=list)  # tv_ir.ir.Region objects (for pattern checks)
    call: Callable[[str, list], list] | None = None  # call a module function by name
    device: Any = None  # SPMD device context (partition_id, replica_id), if any
    loc: Any = None

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def unsupported(self, why: str) -> Unsupported:
        return Unsupported(f"{self.name}: {why}", op=self.name, loc=self.loc)

    @property
    def result_type(self):
        return self.result_types[0]
