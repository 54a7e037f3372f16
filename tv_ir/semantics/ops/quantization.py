"""uniform_quantize and uniform_dequantize (StableHLO spec: `quantize`, `dequantize`).

Values of quantized types are their storage integers (tv_ir.ir.quantized_types rewrites the
types at import); each op carries its types' parameters as `UniformQuantization` records.
"""

from __future__ import annotations

import numpy as np

from tv_ir.ir.program import TensorType, storage_dtype
from tv_ir.ir.quantized_types import OPERAND_ATTR, RESULT_ATTR, UniformQuantization
from tv_ir.semantics.ops.registry import op

_F64 = "f64"


def _params(ctx, key: str) -> UniformQuantization | None:
    d = ctx.attr(key)
    return None if d is None else UniformQuantization.from_attr(d)


def _per_element(q: UniformQuantization, values, shape: tuple, dtype) -> np.ndarray:
    """A quantization parameter (scales or zero points) at every index of `shape`: one
    value per tensor, or the value of the index's coordinate along the axis."""
    v = np.asarray(values, dtype=dtype)
    if q.axis is None:
        return np.broadcast_to(v.reshape(()), shape)
    index_shape = [1] * len(shape)
    index_shape[q.axis] = shape[q.axis]
    return np.broadcast_to(v.reshape(index_shape), shape)


def _scales(q: UniformQuantization, shape: tuple) -> np.ndarray:
    """Scales as constants of the expressed type (the spec's `constant(scale, expressed)`),
    widened to float64."""
    rounded = np.asarray(q.scales, dtype=storage_dtype(TensorType((), q.expressed)))
    return _per_element(q, rounded.astype(np.float64), shape, np.float64)


def dequantize(alg, x, q: UniformQuantization, shape: tuple):
    """(x - zero_point) * scale, the difference taken exactly (the spec subtracts in the
    storage type, where it may overflow; every implementation widens first)."""
    storage = TensorType(shape, q.storage)
    real = alg.convert(x, storage, TensorType(shape, _F64))
    zps = _per_element(q, np.asarray(q.zero_points, dtype=np.float64), shape, np.float64)
    return alg.multiply(alg.subtract(real, zps), _scales(q, shape))


def quantize(alg, x, q: UniformQuantization, shape: tuple):
    """round_nearest_even(clamp(lo, x / scale + zero_point, hi)) in the storage type."""
    zps = _per_element(q, np.asarray(q.zero_points, dtype=np.float64), shape, np.float64)
    scaled = alg.add(alg.divide(x, _scales(q, shape)), zps)
    clamped = alg.minimum(alg.maximum(scaled, np.float64(q.lo)), np.float64(q.hi))
    rounded = alg.unary("round_nearest_even", clamped)
    return alg.convert(rounded, TensorType(shape, _F64), TensorType(shape, q.storage))


@op("stablehlo.uniform_quantize")
def uniform_quantize(ctx, x):
    shape = tuple(ctx.result_type.shape)
    source = _params(ctx, OPERAND_ATTR)
    if source is not None:  # requantize: to the expressed type first
        x = dequantize(ctx.alg, x, source, shape)
    return quantize(ctx.alg, x, _params(ctx, RESULT_ATTR), shape)


@op("stablehlo.uniform_dequantize")
def uniform_dequantize(ctx, x):
    return dequantize(ctx.alg, x, _params(ctx, OPERAND_ATTR), tuple(ctx.result_type.shape))
