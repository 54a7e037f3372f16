"""The op table. Importing this package registers every evaluator."""

from . import (  # noqa: F401
    asynchronous,
    collectives,
    complex_numbers,
    control,
    dynamic,
    elementwise,
    indexing,
    linalg,
    normalization,
    quantization,
    random,
    reduction,
    shape,
    sharding,
)
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
