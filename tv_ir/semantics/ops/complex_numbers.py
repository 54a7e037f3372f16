"""Complex numbers (StableHLO spec: complex, imag, fft; real, the element-wise arithmetic,
abs, exponential, select, convert, dot_general and reduce on complex operands).

A complex tensor is its real and imaginary parts: `ctx.alg.complex_parts` takes one apart,
`ctx.alg.make_complex` builds one (numpy complex128 concretely, pairs of terms
symbolically), and every complex op is written over the parts with the real algebra, so
both interpreters share it. Ops not listed in COMPLEX_AWARE refuse complex operands
(tv_ir.semantics.interpreters.evaluator), rather than reading them as reals.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np

from tv_ir.ir.program import TensorType
from tv_ir.semantics.ops.registry import op

# ops whose evaluators handle complex operands and results (data movement is type-blind)
COMPLEX_AWARE = frozenset(
    "stablehlo." + n
    for n in (
        "complex real imag fft add subtract multiply divide negate select convert constant "
        "reshape transpose broadcast_in_dim slice dynamic_slice dynamic_update_slice "
        "concatenate reverse pad tuple get_tuple_element optimization_barrier while if case "
        "custom_call composite dot_general iota exponential abs reduce"
    ).split()
) | {"func.call"}


def add(alg, x, y):
    (a, b), (c, d) = alg.complex_parts(x), alg.complex_parts(y)
    return alg.make_complex(alg.add(a, c), alg.add(b, d))


def subtract(alg, x, y):
    (a, b), (c, d) = alg.complex_parts(x), alg.complex_parts(y)
    return alg.make_complex(alg.subtract(a, c), alg.subtract(b, d))


def multiply(alg, x, y):
    """(a + ib)(c + id) = (ac - bd) + i(ad + bc)."""
    (a, b), (c, d) = alg.complex_parts(x), alg.complex_parts(y)
    re = alg.subtract(alg.multiply(a, c), alg.multiply(b, d))
    return alg.make_complex(re, alg.add(alg.multiply(a, d), alg.multiply(b, c)))


def divide(alg, x, y):
    """(a + ib) / (c + id) = ((ac + bd) + i(bc - ad)) / (c^2 + d^2)."""
    (a, b), (c, d) = alg.complex_parts(x), alg.complex_parts(y)
    norm = alg.add(alg.multiply(c, c), alg.multiply(d, d))
    re = alg.divide(alg.add(alg.multiply(a, c), alg.multiply(b, d)), norm)
    return alg.make_complex(
        re, alg.divide(alg.subtract(alg.multiply(b, c), alg.multiply(a, d)), norm)
    )


def negate(alg, x):
    a, b = alg.complex_parts(x)
    return alg.make_complex(alg.negate(a), alg.negate(b))


def abs_(alg, x):
    """|a + ib| = sqrt(a^2 + b^2), a real number."""
    a, b = alg.complex_parts(x)
    return alg.unary("sqrt", alg.add(alg.multiply(a, a), alg.multiply(b, b)))


def reduce_sum(alg, x, init, axes: tuple):
    """init + the sum of x over `axes`, part by part."""
    (a, b), (c, d) = alg.complex_parts(x), alg.complex_parts(init)
    return alg.make_complex(
        alg.add(c, alg.reduce_sum(a, axes)), alg.add(d, alg.reduce_sum(b, axes))
    )


def exponential(alg, x):
    """exp(a + ib) = exp(a) cos(b) + i exp(a) sin(b)."""
    a, b = alg.complex_parts(x)
    scale = alg.unary("exp", a)
    return alg.make_complex(
        alg.multiply(scale, alg.unary("cos", b)), alg.multiply(scale, alg.unary("sin", b))
    )


def select(alg, pred, on_true, on_false):
    (a, b), (c, d) = alg.complex_parts(on_true), alg.complex_parts(on_false)
    return alg.make_complex(alg.select(pred, a, c), alg.select(pred, b, d))


def dot_general(ctx, lhs, rhs, real_dot):
    """(A + iB) . (C + iD) = (A.C - B.D) + i(A.D + B.C), each a real `real_dot` (XLA's
    partitioner writes a sharded fft as dot_generals with its twiddle factors)."""
    alg = ctx.alg

    def parts(x, t):
        return alg.complex_parts(x) if t.is_complex else (x, np.zeros(np.shape(x)))

    (a, b), (c, d) = parts(lhs, ctx.operand_types[0]), parts(rhs, ctx.operand_types[1])
    real = dataclasses.replace(
        ctx,
        operand_types=[TensorType(t.shape, "f64") for t in ctx.operand_types],
        result_types=[TensorType(ctx.result_type.shape, "f64")],
    )
    re = alg.subtract(real_dot(real, a, c), real_dot(real, b, d))
    im = alg.add(real_dot(real, a, d), real_dot(real, b, c))
    return alg.make_complex(re, im)


def convert(ctx, x):
    """To a complex type: complex values unchanged (parts are reals), real values with a
    zero imaginary part. From complex to a real type the spec leaves the meaning open."""
    src, dst = ctx.operand_types[0], ctx.result_type
    if not dst.is_complex:
        raise ctx.unsupported(f"conversion from {src.dtype} to {dst.dtype}")
    if src.is_complex:
        return ctx.alg.make_complex(*ctx.alg.complex_parts(x))
    f64 = type(dst)(dst.shape, "f64")
    re = ctx.alg.convert(x, src, f64)
    return ctx.alg.make_complex(re, np.zeros(dst.shape))


@op("stablehlo.complex")
def complex_(ctx, lhs, rhs):
    return ctx.alg.make_complex(lhs, rhs)


def real_part(ctx, x):
    return ctx.alg.complex_parts(x)[0]


@op("stablehlo.imag")
def imag(ctx, x):
    if not ctx.operand_types[0].is_complex:
        return np.zeros(np.shape(x))  # the imaginary part of a real number
    return ctx.alg.complex_parts(x)[1]


# -- fft: the DFT sum, one transformed dimension at a time ---------------------------------


def _unit_root(m: int, n: int) -> tuple[float, float]:
    """(cos, sin) of 2*pi*m/n, in float64 (like a transcendental function of a constant,
    which terms fold in float64), reduced to the first octant so that the symmetries hold
    exactly: cos(2 pi m/n) == cos(2 pi (n-m)/n), sin(pi/2 - t) == cos(t), and the values at
    multiples of a twelfth of a turn that are rational (0, +-1/2, +-1) are exact (so
    fft(ifft(x)) == x is proved for lengths 1, 2 and 4)."""
    q = Fraction(m % n, n)
    if q > Fraction(1, 2):
        c, s = _unit_root(n - m % n, n)
        return c, -s
    if q > Fraction(1, 4):
        r = Fraction(1, 2) - q
        c, s = _unit_root(r.numerator, r.denominator)
        return -c, s
    if q > Fraction(1, 8):
        r = Fraction(1, 4) - q
        c, s = _unit_root(r.numerator, r.denominator)
        return s, c
    if q == Fraction(1, 8):
        return math.sqrt(0.5), math.sqrt(0.5)
    if q == Fraction(1, 12):
        return math.sqrt(3) / 2, 0.5
    if q == 0:
        return 1.0, 0.0
    return math.cos(2 * math.pi * q), math.sin(2 * math.pi * q)


def _twiddles(n_in: int, n_out: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of 2*pi*j*k/n for input index j < n_in and output index k < n_out."""
    c, s = np.empty((n_in, n_out)), np.empty((n_in, n_out))
    for j in range(n_in):
        for k in range(n_out):
            c[j, k], s[j, k] = _unit_root(j * k, n)
    return c, s


def _contract_last(alg, x, matrix: np.ndarray):
    """sum_j x[..., j] * matrix[j, k] over x's last dimension."""
    x = np.asarray(x)
    lead = x.shape[:-1]
    m = int(np.prod(lead, dtype=np.int64))
    flat = x.reshape(1, m, x.shape[-1])
    return np.asarray(alg.matmul(flat, matrix[None])).reshape(*lead, matrix.shape[1])


def _dft(alg, re, im, axis: int, n: int, n_out: int, inverse: bool):
    """The DFT (sign -1) or unnormalised inverse DFT (sign +1) of length n along `axis`:
    out[k] = sum_j x[j] * (cos(2 pi jk/n) -+ i sin(2 pi jk/n)), for k < n_out."""
    re, im = np.moveaxis(np.asarray(re), axis, -1), np.moveaxis(np.asarray(im), axis, -1)
    c, s = _twiddles(re.shape[-1], n_out, n)
    rc, rs = _contract_last(alg, re, c), _contract_last(alg, re, s)
    ic, is_ = _contract_last(alg, im, c), _contract_last(alg, im, s)
    if inverse:  # (a + ib)(cos + i sin)
        out_re, out_im = alg.subtract(rc, is_), alg.add(ic, rs)
    else:  # (a + ib)(cos - i sin)
        out_re, out_im = alg.add(rc, is_), alg.subtract(ic, rs)
    return np.moveaxis(np.asarray(out_re), -1, axis), np.moveaxis(np.asarray(out_im), -1, axis)


def _hermitian_full(alg, re, im, axis: int, n: int):
    """The n values of a signal's spectrum from its first n // 2 + 1 (IRFFT's input):
    X[k] = conj(X[n - k]) above n // 2. Only the real parts of X[0] (and X[n / 2] for even n)
    count, as they do for a real signal (numpy's and XLA's irfft)."""
    re, im = np.moveaxis(np.asarray(re), axis, -1), np.moveaxis(np.asarray(im), axis, -1)
    half = n // 2 + 1
    re, im = re[..., :half], im[..., :half]
    mirror = [n - k for k in range(half, n)]
    zero = np.zeros(im.shape[:-1] + (1,), dtype=im.dtype)
    kept = [zero, im[..., 1 : n - half + 1]] + ([zero] if n % 2 == 0 else [])
    im = np.concatenate(kept, axis=-1) if n > 1 else zero
    full_re = np.concatenate([re, re[..., mirror]], axis=-1)
    full_im = np.concatenate([im, alg.negate(im[..., mirror])], axis=-1)
    return np.moveaxis(full_re, -1, axis), np.moveaxis(full_im, -1, axis)


@op("stablehlo.fft")
def fft(ctx, x):
    """FFT / IFFT over the last len(fft_length) dimensions; RFFT: a real signal, the first
    n // 2 + 1 outputs of the last dimension, then FFT of the others; IRFFT: IFFT of the
    leading ones, then the real inverse of the last. Inverses divide by the length."""
    kind = str(ctx.attr("fft_type"))
    lengths = tuple(ctx.attr("fft_length"))
    alg = ctx.alg
    rank = len(ctx.result_type.shape)
    axes = list(range(rank - len(lengths), rank))
    if kind == "RFFT":
        re, im = x, np.zeros(np.shape(x))
    else:
        re, im = alg.complex_parts(x)
    inverse = kind in ("IFFT", "IRFFT")
    order = axes[::-1] if kind == "RFFT" else axes  # the real dimension (last) first for RFFT
    if kind == "IRFFT":
        order = axes[:-1] + axes[-1:]
    for axis in order:
        n = lengths[axis - axes[0]]
        n_out = ctx.result_type.shape[axis]
        if kind == "IRFFT" and axis == axes[-1]:
            re, im = _hermitian_full(alg, re, im, axis, n)
        re, im = _dft(alg, re, im, axis, n, n_out, inverse)
        if inverse:
            re, im = alg.divide(re, np.float64(n)), alg.divide(im, np.float64(n))
    if kind == "IRFFT":
        return re
    return alg.make_complex(re, im)
