"""The spec's dynamic-shape ops, where they refine to static shapes: the shape (or padding,
slice size) operands must be known and agree with the static result type; then each op is
its static counterpart with those values as attributes. Shapes that depend on the inputs
are unsupported. (XLA cannot translate `dynamic_conv`: its conformance record checks it
against XLA running `convolution` with the same padding as an attribute.)

Also `map` (the spec's element-wise application of a region).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tv_ir.semantics.ops import indexing, shape
from tv_ir.semantics.ops.reduction import assemble, convolution
from tv_ir.semantics.ops.registry import op


def _known(ctx, x, what: str) -> tuple[int, ...]:
    """A shape-like operand's values; they must not depend on the inputs."""
    return tuple(int(v) for v in np.asarray(ctx.alg.indices(x)).reshape(-1))


def _static(ctx, output_shape) -> None:
    dims = _known(ctx, output_shape, "output shape")
    if dims != tuple(ctx.result_type.shape):
        raise ctx.unsupported(f"output shape {list(dims)} is not the result type's")


def _with(ctx, **attrs):
    return dataclasses.replace(ctx, attrs={**ctx.attrs, **attrs})


@op("stablehlo.dynamic_iota")
def dynamic_iota(ctx, output_shape):
    _static(ctx, output_shape)
    return shape.iota(ctx)


@op("stablehlo.dynamic_reshape")
def dynamic_reshape(ctx, x, output_shape):
    _static(ctx, output_shape)
    return shape.reshape(ctx, x)


@op("stablehlo.dynamic_broadcast_in_dim")
def dynamic_broadcast_in_dim(ctx, x, output_dimensions):
    # known_(non)expanding_dimensions are promises about sizes the static types already fix
    _static(ctx, output_dimensions)
    return shape.broadcast_in_dim(ctx, x)


@op("stablehlo.dynamic_pad")
def dynamic_pad(ctx, x, padding_value, low, high, interior):
    padded = _with(
        ctx,
        edge_padding_low=_known(ctx, low, "padding"),
        edge_padding_high=_known(ctx, high, "padding"),
        interior_padding=_known(ctx, interior, "padding"),
    )
    return shape.pad(padded, x, padding_value)


@op("stablehlo.dynamic_conv")
def dynamic_conv(ctx, lhs, rhs, padding):
    pads = np.asarray(_known(ctx, padding, "padding")).reshape(np.shape(padding))
    dn = ctx.attr("dimension_numbers")
    out = tuple(ctx.result_type.shape[d] for d in dn.output_spatial)
    if _conv_spatial_sizes(ctx, pads) != out:
        raise ctx.unsupported(f"padding {pads.tolist()} does not give the result type's shape")
    return convolution(_with(ctx, padding=pads), lhs, rhs)


def _conv_spatial_sizes(ctx, pads) -> tuple[int, ...]:
    """The output's spatial sizes under padding `pads` (the spec's num_windows, C25)."""
    dn = ctx.attr("dimension_numbers")
    lhs_t, rhs_t = ctx.operand_types[0], ctx.operand_types[1]
    n = len(dn.input_spatial)
    strides = ctx.attr("window_strides") or (1,) * n
    lhs_dil = ctx.attr("lhs_dilation") or (1,) * n
    rhs_dil = ctx.attr("rhs_dilation") or (1,) * n
    sizes = []
    for d in range(n):
        size = lhs_t.shape[dn.input_spatial[d]]
        dilated = (size - 1) * lhs_dil[d] + 1 if size else 0
        padded = dilated + int(pads[d][0]) + int(pads[d][1])
        window = (rhs_t.shape[dn.kernel_spatial[d]] - 1) * rhs_dil[d] + 1
        sizes.append((padded - window) // strides[d] + 1 if padded >= window else 0)
    return tuple(sizes)


@op("stablehlo.dynamic_gather")
def dynamic_gather(ctx, operand, start_indices, slice_sizes):
    sizes = _known(ctx, slice_sizes, "slice sizes")
    return indexing.gather(_with(ctx, slice_sizes=sizes), operand, start_indices)


@op("stablehlo.map")
def map_(ctx, *inputs):
    """The region applied to the elements at each index (`dimensions` is every dimension)."""
    arrays = [np.asarray(x) for x in inputs]
    out = [
        ctx.run_region(0, [np.asarray(a[i]) for a in arrays])[0]
        for i in np.ndindex(*arrays[0].shape)
    ]
    if not out:
        return np.zeros(ctx.result_type.shape, dtype=ctx.result_type.numpy_dtype)
    return assemble(arrays[0].shape, out)
