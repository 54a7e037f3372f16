"""The op table. Importing this package registers every evaluator."""

from . import collectives, control, elementwise, indexing, reduction, shape, sharding  # noqa: F401
from .registry import COLLECTIVES, GLOBAL_VIEW, OPS, PROCESS_OPS, OpContext, collective, lookup, op

__all__ = [
    "COLLECTIVES",
    "GLOBAL_VIEW",
    "OPS",
    "PROCESS_OPS",
    "OpContext",
    "collective",
    "lookup",
    "op",
]
