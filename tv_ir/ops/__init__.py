"""The op table. Importing this package registers every evaluator."""

from . import collectives, control, elementwise, indexing, reduction, shape  # noqa: F401
from .registry import COLLECTIVES, OPS, PROCESS_OPS, OpContext, collective, lookup, op

__all__ = ["COLLECTIVES", "OPS", "PROCESS_OPS", "OpContext", "collective", "lookup", "op"]
