"""batch_norm_training, batch_norm_inference, batch_norm_grad, as the StableHLO spec defines
them: ordinary reductions and element arithmetic (mean, variance, variance + epsilon), so the
symbolic interpreter produces ordinary terms.

The spec divides by `stddev = sqrt(variance + epsilon)`; here that is a multiplication by
`rsqrt(variance + epsilon)`, as XLA's batchnorm expander computes it. Over the reals the two
are equal and defined at the same points (sqrt needs >= 0, the division != 0: together
> 0, rsqrt's condition), and rsqrt is the form hand-written normalisations use, so their
terms meet the op's as equal normal forms."""

from __future__ import annotations

import numpy as np

from tv_ir.ir.program import TensorType, storage_dtype
from tv_ir.semantics.ops.registry import op


def _along(v, feature_index: int, shape: tuple) -> np.ndarray:
    """broadcast_in_dim(v, [feature_index], shape): the 1-d `v` along `feature_index`."""
    dims = [1] * len(shape)
    dims[feature_index] = np.shape(v)[0]
    return np.broadcast_to(np.reshape(v, dims), shape)


def _scalar(ctx, value: float, like: TensorType):
    """constant(value, element_type(like)): rounded to that type, as XLA holds it."""
    rounded = np.asarray(value, dtype=np.float64).astype(storage_dtype(like)).astype(np.float64)
    return ctx.alg.constant(rounded, TensorType((), like.dtype))


def _sum(ctx, x, feature_index: int):
    """compute_sum: reduce with add over every dimension but `feature_index`."""
    axes = tuple(d for d in range(np.ndim(x)) if d != feature_index)
    return ctx.alg.reduce_sum(x, axes)


def _count(ctx, t: TensorType, feature_index: int):
    """size(operand) / dim(operand, feature_index) as a constant of t's element type."""
    return _scalar(ctx, t.size // t.shape[feature_index], t)


def _mean(ctx, x, t: TensorType, feature_index: int):
    return ctx.alg.divide(_sum(ctx, x, feature_index), _count(ctx, t, feature_index))


def _normalize(ctx, operand, scale, offset, mean, variance, t: TensorType):
    """batch_norm_inference's body: scale * (operand - mean) / sqrt(variance + eps) + offset."""
    fi, eps = ctx.attr("feature_index"), _scalar(ctx, ctx.attr("epsilon"), t)
    centered = ctx.alg.subtract(operand, _along(mean, fi, t.shape))
    inv_stddev = ctx.alg.unary("rsqrt", ctx.alg.add(_along(variance, fi, t.shape), eps))
    normalized = ctx.alg.multiply(centered, inv_stddev)
    return ctx.alg.add(
        ctx.alg.multiply(_along(scale, fi, t.shape), normalized), _along(offset, fi, t.shape)
    )


@op("stablehlo.batch_norm_inference")
def batch_norm_inference(ctx, operand, scale, offset, mean, variance):
    return _normalize(ctx, operand, scale, offset, mean, variance, ctx.operand_types[0])


@op("stablehlo.batch_norm_training")
def batch_norm_training(ctx, operand, scale, offset):
    t, fi = ctx.operand_types[0], ctx.attr("feature_index")
    mean = _mean(ctx, operand, t, fi)
    centered = ctx.alg.subtract(operand, _along(mean, fi, t.shape))
    variance = _mean(ctx, ctx.alg.multiply(centered, centered), t, fi)
    return [_normalize(ctx, operand, scale, offset, mean, variance, t), mean, variance]


@op("stablehlo.batch_norm_grad")
def batch_norm_grad(ctx, operand, scale, mean, variance, grad_output):
    """The spec's definition (XLA's batchnorm_expander, with its temporaries i1 ... i6)."""
    t, fi = ctx.operand_types[0], ctx.attr("feature_index")
    eps = _scalar(ctx, ctx.attr("epsilon"), t)
    alg = ctx.alg
    variance_eps = alg.add(_along(variance, fi, t.shape), eps)
    centered = alg.subtract(operand, _along(mean, fi, t.shape))
    inv_stddev = alg.unary("rsqrt", variance_eps)
    normalized = alg.multiply(centered, inv_stddev)
    n = _count(ctx, t, fi)
    i1 = alg.multiply(grad_output, n)
    i2 = _along(_sum(ctx, grad_output, fi), fi, t.shape)
    i3 = _along(_sum(ctx, alg.multiply(grad_output, centered), fi), fi, t.shape)
    i4 = alg.multiply(i3, centered)
    i5 = alg.divide(i4, variance_eps)
    i6 = alg.subtract(alg.subtract(i1, i2), i5)
    grad_operand = alg.multiply(
        alg.divide(alg.multiply(_along(scale, fi, t.shape), inv_stddev), n), i6
    )
    grad_scale = _sum(ctx, alg.multiply(grad_output, normalized), fi)
    grad_offset = _sum(ctx, grad_output, fi)
    return [grad_operand, grad_scale, grad_offset]
