"""Is a sort's comparator a strict weak order? Tested on small values, concretely.

A `sort` means "the stable sorted permutation" only when its comparator is a strict weak
order (irreflexive, transitive, and incomparability transitive); XLA requires one, and
otherwise the result depends on the sorting algorithm (tv's concrete sort and its symbolic
transposition network could differ). Shape reduction shrinks a sorted dimension only for
such comparators (passes/shape_reduction/sorts.py): sorting by a strict weak order is
defined the same way at every length.

The comparator is run on every pair of a small pool of elements (ties likely: -0.0 and 0.0,
repeated small integers); a violation found is certain, finding none is evidence, not a
proof. NaN is not drawn: tv's symbolic values are reals, and a plain `LT` on floats is a
strict weak order on them (with NaN it is not, on XLA as well).
"""

from __future__ import annotations

import itertools

import numpy as np

from tv_ir.ir.program import Block, Module, TensorType

POOL = 40  # elements drawn when the product of the operands' values is larger
FLOATS = (-1.5, -0.0, 0.0, 1.0, 2.5)
SIGNED = (-1, 0, 1, 2)
UNSIGNED = (0, 1, 2)
BOOLS = (False, True)


def strict_weak_order_violation(module: Module, block: Block) -> str | None:
    """Why the comparator `block` (args lhs_0, rhs_0, lhs_1, rhs_1, ...) is not a strict
    weak order on small values, or None when no violation was found."""
    args = list(block.args)
    if len(args) % 2 or not args or not all(_scalar(a.type) for a in args):
        return "its arguments are not pairs of scalars"
    types = [a.type for a in args[::2]]
    pool = _pool(types)
    try:
        less = _less_matrix(module, block, pool, types)
    except Exception as e:  # noqa: BLE001 - a comparator tv cannot run concretely
        return f"tv cannot run it on small values ({type(e).__name__})"
    n = len(pool)
    if less[np.arange(n), np.arange(n)].any():
        i = int(np.flatnonzero(less[np.arange(n), np.arange(n)])[0])
        return f"less({_show(pool[i])}, itself) is true"
    found = _intransitive(less)
    if found:
        a, b, c = (_show(pool[i]) for i in found)
        return f"less({a}, {b}) and less({b}, {c}) but not less({a}, {c})"
    unordered = ~less & ~less.T
    found = _intransitive(unordered)
    if found:
        a, b, c = (_show(pool[i]) for i in found)
        return f"{a} ~ {b} and {b} ~ {c} are unordered but {a}, {c} are ordered"
    return None


def _pool(types: list[TensorType]) -> list[tuple]:
    choices = [_values(t) for t in types]
    total = 1
    for c in choices:
        total *= len(c)
    if total <= POOL:
        return list(itertools.product(*choices))
    rng = np.random.default_rng(0)
    picked = {tuple(c[rng.integers(len(c))] for c in choices) for _ in range(4 * POOL)}
    return sorted(picked, key=repr)[:POOL]


def _values(t: TensorType) -> tuple:
    if t.is_float:
        return FLOATS
    if t.is_bool:
        return BOOLS
    return UNSIGNED if t.dtype.startswith("ui") else SIGNED


def _less_matrix(module: Module, block: Block, pool: list[tuple], types) -> np.ndarray:
    from tv_ir.semantics.algebra import NumpyAlgebra
    from tv_ir.semantics.interpreters.evaluator import BlockEvaluator

    run = BlockEvaluator(module, NumpyAlgebra())
    dtypes = [np.dtype(t.numpy_dtype) for t in types]
    n = len(pool)
    less = np.zeros((n, n), dtype=bool)
    for i, j in itertools.product(range(n), repeat=2):
        args = []
        for a, b, dt in zip(pool[i], pool[j], dtypes, strict=True):
            args += [np.asarray(a, dtype=dt), np.asarray(b, dtype=dt)]
        less[i, j] = bool(np.asarray(run._block(block, args, top=False)[0]))
    return less


def _intransitive(rel: np.ndarray) -> tuple[int, int, int] | None:
    """(a, b, c) with rel(a, b), rel(b, c) and not rel(a, c), if any."""
    r = rel.astype(np.int64)
    bad = ((r @ r) > 0) & ~rel
    if not bad.any():
        return None
    a, c = (int(x) for x in np.argwhere(bad)[0])
    b = int(np.flatnonzero(rel[a] & rel[:, c])[0])
    return a, b, c


def _scalar(t) -> bool:
    return isinstance(t, TensorType) and t.shape == () and not t.is_complex


def _show(element: tuple) -> str:
    return "(" + ", ".join(repr(v) for v in element) + ")" if len(element) > 1 else repr(element[0])
