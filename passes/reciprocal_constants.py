"""reciprocal-constants: a compiler's `x * (1/n)` for `x / n` is the same program.

XLA's algebraic simplifier folds a division by a constant n into a multiplication by 1/n
rounded to the type (a mean and its gradient in a partitioned `jax.jit` step: the spec
keeps `/ 96`, the partitioned program multiplies by 0.010416667, 1/96 in f32). Read as the
exact value of its bits that constant is 1/96 x (1 + 3e-8), and a correct step was refuted.

The simplifier also folds the constants around it: AdamW's `(1 - b1) * g` with `g` the
mean's gradient becomes one constant, `(1 - b1) * (1/12)` rounded. So this pass runs on the
pair: where either program divides by a constant integer n (no power of 2, whose
reciprocals are exact), a one-number float constant of either program that is k/n rounded
to its type (once, or as `k * (1/n)` folded in the type's arithmetic), k +-1 or +- the exact
value of a one-number constant of the pair, and that rounds no other such k/n, is read as
k/n exactly (its float64 value in the module; the exact rational in `float_constants.EXACT`,
which the symbolic interpreter reads). Nothing else changes: a learning rate of 0.001 or a
table of frequencies keeps the exact value of its bits, and `* (1/95)` against `/ 96` is
still a difference (docs/equivalence.md, "Constants"). The modules are rewritten in place
(the constants' values only).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from tv_ir.ir.float_constants import EXACT
from tv_ir.ir.program import Module, Op, Value, storage_dtype, walk

name = "reciprocal-constants"

# ops that pass one number through unchanged in value (a divisor is often a broadcast)
_SAME_NUMBER = {"stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.convert"}


def run(spec: Module, impl: Module) -> int:
    """Rewrites both modules in place; returns how many constants it read as some k/n."""
    divisors = _divisors(spec) | _divisors(impl)
    if not divisors:
        return 0
    numbers = {
        Fraction(float(c))
        for m in (spec, impl)
        for op in _ops(m)
        if (c := _one_number(op)) is not None and np.isfinite(c) and c != 0
    }
    if len(numbers) > MAX_NUMBERS:
        numbers = set()
    numbers.add(Fraction(1))
    numbers |= {-k for k in numbers}
    candidates = {(k, n) for k in numbers for n in divisors}
    return _read(spec, candidates) + _read(impl, candidates)


MAX_NUMBERS = 256  # one-number constants of a pair tried as numerators (else 1 only)


def _ops(module: Module):
    for fn in module.functions.values():
        yield from walk(fn.body)


def _one_number(op: Op) -> np.ndarray | None:
    """The value of a float constant holding one number (a scalar or a splat), else None."""
    value = op.attrs.get("value")
    if op.name != "stablehlo.constant" or not isinstance(value, np.ndarray):
        return None
    if value.dtype.kind != "f" or value.size == 0:
        return None
    first = value.reshape(-1)[0]
    if value.size > 1 and not np.all(value == first):
        return None
    return first


def _constant_behind(v: Value) -> Op | None:
    op = v.owner
    while op is not None and op.name in _SAME_NUMBER and op.operands:
        op = op.operands[0].owner
    return op


def _divisors(module: Module) -> set[int]:
    out = set()
    for op in _ops(module):
        if op.name != "stablehlo.divide":
            continue
        const = _constant_behind(op.operands[1])
        c = _one_number(const) if const is not None else None
        if c is None or not np.isfinite(c) or c != np.rint(c):
            continue
        n = abs(int(c))
        if n >= 2 and n & (n - 1):
            out.add(n)
    return out


def _read(module: Module, candidates: set[tuple[Fraction, int]]) -> int:
    count = 0
    roundings: dict = {}  # element type -> {a candidate rounded to it: the candidates}
    for op in _ops(module):
        c = _one_number(op)
        if c is None or c == 0 or not np.isfinite(c):
            continue
        dtype = storage_dtype(op.results[0].type)
        if dtype not in roundings:
            roundings[dtype] = by_rounding = {}
            for k, n in candidates:
                for rounded in _roundings(k, n, dtype):
                    by_rounding.setdefault(rounded, set()).add(k / n)
        near = roundings[dtype].get(float(c), ())
        if len(near) != 1:
            continue
        exact = next(iter(near))
        if exact == Fraction(float(c)):
            continue
        value = float(exact)
        EXACT.setdefault(value, exact)
        if EXACT[value] != exact:  # another pair read this float64 otherwise: leave it
            continue
        op.attrs["value"] = np.full(op.attrs["value"].shape, value)
        count += 1
    return count


def _roundings(k: Fraction, n: int, dtype) -> set[float]:
    """k/n as a constant of `dtype` may hold it: rounded once, or k times 1/n each rounded
    and their product rounded (a compiler folding `k * (1/n)` in the type's arithmetic)."""
    with np.errstate(over="ignore", under="ignore"):
        once = np.asarray(float(k / n)).astype(dtype)
        k_t, inv_t = np.asarray(float(k)).astype(dtype), np.asarray(1.0 / n).astype(dtype)
        folded = np.multiply(k_t, inv_t, dtype=dtype)
    return {float(once), float(folded)}
