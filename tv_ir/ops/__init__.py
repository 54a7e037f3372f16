"""The op table. Importing this package registers every evaluator."""

from . import control, elementwise, indexing, reduction, shape  # noqa: F401
from .registry import OPS, OpContext, lookup, op

__all__ = ["OPS", "OpContext", "lookup", "op"]
