"""The op table. Importing this package registers every evaluator."""

from tv_ir.semantics.ops import (  # noqa: F401
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
from tv_ir.semantics.ops.registry import (
    COLLECTIVES,
    GLOBAL_VIEW,
    OPS,
    PROCESS_OPS,
    OpContext,
    collective,
    lookup,
    op,
)

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
