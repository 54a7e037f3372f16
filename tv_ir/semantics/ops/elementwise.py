"""Element-wise ops (StableHLO spec: add ... xor). Each is one line over the element algebra."""

from __future__ import annotations

import numpy as np

from tv_ir.errors import Unsupported
from tv_ir.semantics.ops import complex_numbers as C
from tv_ir.semantics.ops.registry import op


def _float(ctx) -> bool:
    return ctx.result_type.is_float


@op("stablehlo.add")
def add(ctx, x, y):
    if ctx.result_type.is_complex:
        return C.add(ctx.alg, x, y)
    if ctx.result_type.is_bool:
        return ctx.alg.logical_or(x, y)
    return ctx.alg.add(x, y)


@op("stablehlo.subtract")
def subtract(ctx, x, y):
    if ctx.result_type.is_complex:
        return C.subtract(ctx.alg, x, y)
    return ctx.alg.subtract(x, y)


@op("stablehlo.multiply")
def multiply(ctx, x, y):
    if ctx.result_type.is_complex:
        return C.multiply(ctx.alg, x, y)
    if ctx.result_type.is_bool:
        return ctx.alg.logical_and(x, y)
    return ctx.alg.multiply(x, y)


@op("stablehlo.divide")
def divide(ctx, x, y):
    if ctx.result_type.is_complex:
        return C.divide(ctx.alg, x, y)
    return ctx.alg.divide(x, y) if _float(ctx) else ctx.alg.int_divide(x, y)


@op("stablehlo.remainder")
def remainder(ctx, x, y):
    return ctx.alg.remainder(x, y)


@op("stablehlo.power")
def power(ctx, x, y):
    if ctx.result_type.is_integer and (ctx.alg.is_symbolic(x) or ctx.alg.is_symbolic(y)):
        return ctx.alg.int_power(x, y, *ctx.operand_types)
    return ctx.alg.power(x, y)


@op("stablehlo.maximum")
def maximum(ctx, x, y):
    if ctx.result_type.is_bool:
        return ctx.alg.logical_or(x, y)
    return ctx.alg.maximum(x, y)


@op("stablehlo.minimum")
def minimum(ctx, x, y):
    if ctx.result_type.is_bool:
        return ctx.alg.logical_and(x, y)
    return ctx.alg.minimum(x, y)


@op("stablehlo.atan2")
def atan2(ctx, x, y):
    return ctx.alg.atan2(x, y)


@op("stablehlo.negate")
def negate(ctx, x):
    if ctx.result_type.is_complex:
        return C.negate(ctx.alg, x)
    return ctx.alg.negate(x)


@op("stablehlo.abs")
def abs_(ctx, x):
    if ctx.operand_types[0].is_complex:
        return C.abs_(ctx.alg, x)
    return ctx.alg.abs(x)


@op("stablehlo.sign")
def sign(ctx, x):
    return ctx.alg.sign(x)


def _unary(name: str, fn: str):
    @op(name)
    def evaluate(ctx, x):
        if fn == "exp" and ctx.result_type.is_complex:
            return C.exponential(ctx.alg, x)
        return ctx.alg.unary(fn, x)

    evaluate.__name__ = fn
    return evaluate


for _name, _fn in [
    ("stablehlo.exponential", "exp"),
    ("stablehlo.exponential_minus_one", "expm1"),
    ("stablehlo.log", "log"),
    ("stablehlo.log_plus_one", "log1p"),
    ("stablehlo.logistic", "logistic"),
    ("stablehlo.tanh", "tanh"),
    ("stablehlo.sqrt", "sqrt"),
    ("stablehlo.rsqrt", "rsqrt"),
    ("stablehlo.cbrt", "cbrt"),
    ("stablehlo.sine", "sin"),
    ("stablehlo.cosine", "cos"),
    ("stablehlo.tan", "tan"),
    ("chlo.tan", "tan"),
    ("chlo.erf", "erf"),
    ("chlo.lgamma", "lgamma"),
    ("chlo.erf_inv", "erf_inv"),
    ("chlo.digamma", "digamma"),
    ("stablehlo.floor", "floor"),
    ("stablehlo.ceil", "ceil"),
    ("stablehlo.round_nearest_afz", "round_nearest_afz"),
    ("stablehlo.round_nearest_even", "round_nearest_even"),
    ("stablehlo.is_finite", "is_finite"),
]:
    _unary(_name, _fn)


@op("stablehlo.compare")
def compare(ctx, x, y):
    direction = str(ctx.attr("comparison_direction"))
    if str(ctx.attr("compare_type", "")) == "TOTALORDER" and ctx.operand_types[0].is_float:
        return ctx.alg.compare_total(direction, x, y)
    return ctx.alg.compare(direction, x, y)


@op("stablehlo.select")
def select(ctx, pred, on_true, on_false):
    if ctx.result_type.is_complex:
        return C.select(ctx.alg, pred, on_true, on_false)
    return ctx.alg.select(pred, on_true, on_false)


@op("stablehlo.clamp")
def clamp(ctx, lo, x, hi):
    return ctx.alg.minimum(ctx.alg.maximum(x, lo), hi)


def _bitwise(ctx, *xs) -> list:
    """and/or/xor/not are logical on booleans, bitwise on integers. Terms have no bits:
    integer operands must be known numbers (else the op is unsupported)."""
    if ctx.result_type.is_bool or not any(ctx.alg.is_symbolic(x) for x in xs):
        return list(xs)
    dt = ctx.result_type.numpy_dtype
    try:
        return [np.asarray(ctx.alg.indices(x)).astype(dt) for x in xs]
    except Unsupported:
        raise ctx.unsupported("bitwise operation on input-dependent integers") from None


@op("stablehlo.and")
def and_(ctx, x, y):
    return ctx.alg.logical_and(*_bitwise(ctx, x, y))


@op("stablehlo.or")
def or_(ctx, x, y):
    return ctx.alg.logical_or(*_bitwise(ctx, x, y))


@op("stablehlo.xor")
def xor(ctx, x, y):
    return ctx.alg.logical_xor(*_bitwise(ctx, x, y))


@op("stablehlo.not")
def not_(ctx, x):
    return ctx.alg.logical_not(*_bitwise(ctx, x))


@op("stablehlo.shift_left")
def shift_left(ctx, x, y):
    return ctx.alg.shift("left", x, y)


@op("stablehlo.shift_right_logical")
def shift_right_logical(ctx, x, y):
    return ctx.alg.shift("right_logical", x, y)


@op("stablehlo.shift_right_arithmetic")
def shift_right_arithmetic(ctx, x, y):
    return ctx.alg.shift("right_arithmetic", x, y)


@op("stablehlo.popcnt")
def popcnt(ctx, x):
    return ctx.alg.popcnt(x)


@op("stablehlo.count_leading_zeros")
def count_leading_zeros(ctx, x):
    return ctx.alg.count_leading_zeros(x)


@op("stablehlo.convert")
def convert(ctx, x):
    if ctx.operand_types[0].is_complex or ctx.result_type.is_complex:
        return C.convert(ctx, x)
    return ctx.alg.convert(x, ctx.operand_types[0], ctx.result_type)


@op("stablehlo.reduce_precision")
def reduce_precision(ctx, x):
    return x  # floats are reals: rounding to fewer bits is not modelled


@op("stablehlo.real")
def real(ctx, x):
    if ctx.operand_types[0].is_complex:
        return C.real_part(ctx, x)
    return x  # the real part of a real number
