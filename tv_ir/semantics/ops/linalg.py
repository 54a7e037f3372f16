"""cholesky and triangular_solve, written out over the element algebra (substitution and the
Cholesky-Banachiewicz recurrences), so symbolic evaluation gives ordinary terms: the
divisions by pivots and the square roots carry their definedness conditions.

Where the spec leaves results implementation-defined, these are XLA:CPU's (checked by the
conformance records): cholesky reads the triangle `lower` names, zeroes the other one, and
returns NaN everywhere when the factorisation fails (a non-positive pivot).
"""

from __future__ import annotations

import numpy as np

from tv_ir.ir.program import TensorType
from tv_ir.semantics.ops.reduction import assemble
from tv_ir.semantics.ops.registry import op


def _zero(ctx, t: TensorType):
    return np.asarray(ctx.alg.constant(np.zeros(()), TensorType((), t.dtype)))


def _sum(ctx, zero, items):
    out = zero
    for x in items:
        out = ctx.alg.add(out, x)
    return out


def _cholesky_lower(ctx, a, n: int, zero) -> list[list]:
    """L with a = L L^T, from a's lower triangle (`a(i, j)` for i >= j)."""
    alg = ctx.alg
    L = [[zero] * n for _ in range(n)]
    for j in range(n):
        d = alg.subtract(
            a(j, j), _sum(ctx, zero, (alg.multiply(L[j][k], L[j][k]) for k in range(j)))
        )
        L[j][j] = np.asarray(alg.unary("sqrt", d))
        for i in range(j + 1, n):
            s = _sum(ctx, zero, (alg.multiply(L[i][k], L[j][k]) for k in range(j)))
            L[i][j] = np.asarray(alg.divide(alg.subtract(a(i, j), s), L[j][j]))
    return L


@op("stablehlo.cholesky")
def cholesky(ctx, a):
    t = ctx.result_type
    a = np.asarray(a)
    n = a.shape[-1]
    lower = bool(ctx.attr("lower", False))
    zero = _zero(ctx, t)
    if _concrete_floats(ctx, a):
        return _cholesky_batched(ctx, a, n, lower, zero)
    out = []
    for b in np.ndindex(*a.shape[:-2]):
        m = a[b]
        L = _cholesky_lower(
            ctx, (lambda i, j, m=m: np.asarray(m[i, j]) if lower else np.asarray(m[j, i])), n, zero
        )
        # a failed factorisation (a NaN or infinite entry anywhere) is NaN everywhere: 0 * s
        # is non-finite exactly where s is
        guard = ctx.alg.multiply(
            zero, _sum(ctx, zero, (L[i][j] for i in range(n) for j in range(i + 1)))
        )
        for i in range(n):
            for j in range(n):
                v = L[i][j] if lower else L[j][i]
                if (j <= i) == lower or i == j:
                    out.append(np.asarray(ctx.alg.add(v, guard)))
                else:
                    out.append(np.asarray(ctx.alg.add(zero, guard)))
    return assemble(t.shape, out)


def _concrete_floats(ctx, *xs) -> bool:
    """Concrete real values: the recurrences run on whole arrays over the batch dimensions
    (the same scalar operations in the same order per batch element, done once for all)."""
    return not any(ctx.alg.is_symbolic(x) for x in xs) and all(x.dtype.kind == "f" for x in xs)


def _cholesky_batched(ctx, a, n: int, lower: bool, zero) -> np.ndarray:
    """cholesky's per-matrix recurrence and NaN guard, each entry an array over the batch."""
    L = _cholesky_lower(
        ctx, (lambda i, j: a[..., i, j]) if lower else (lambda i, j: a[..., j, i]), n, zero
    )
    guard = ctx.alg.multiply(
        zero, _sum(ctx, zero, (L[i][j] for i in range(n) for j in range(i + 1)))
    )
    entries = {}
    for i in range(n):
        for j in range(n):
            v = L[i][j] if lower else L[j][i]
            keep = (j <= i) == lower or i == j
            entries[i, j] = np.asarray(ctx.alg.add(v if keep else zero, guard))
    out = np.empty(a.shape, dtype=np.result_type(*entries.values()))
    for (i, j), v in entries.items():
        out[..., i, j] = v
    return out


def _triangular_solve_batched(ctx, a, b, left, m_lower, transpose, unit, one) -> np.ndarray:
    """triangular_solve's substitution, each row an array over the batch and columns."""
    alg = ctx.alg
    n = a.shape[-1]

    def coef(i, j):  # op(a)[i, j] over the batch, against a row of the right-hand side
        if i == j and unit:
            return one
        return (a[..., j, i] if transpose else a[..., i, j])[..., None]

    get, r = (coef, b) if left else ((lambda i, j: coef(j, i)), np.swapaxes(b, -1, -2))
    order = range(n) if m_lower else range(n - 1, -1, -1)
    x = [None] * n
    for i in order:
        acc = r[..., i, :]
        for j in range(i) if m_lower else range(i + 1, n):
            acc = alg.subtract(acc, alg.multiply(get(i, j), x[j]))
        x[i] = np.asarray(acc if unit else alg.divide(acc, get(i, i)))
    sol = np.stack(x, axis=-2)  # [..., n, cols]
    return sol if left else np.swapaxes(sol, -1, -2)


@op("stablehlo.triangular_solve")
def triangular_solve(ctx, a, b):
    """x with op(a) x = b (left_side) or x op(a) = b, op(a) the `lower` (or upper) triangle
    of a, with ones on the diagonal if `unit_diagonal`, transposed if `transpose_a` is
    TRANSPOSE or ADJOINT (the same for reals)."""
    a, b = np.asarray(a), np.asarray(b)
    t = ctx.result_type
    left = bool(ctx.attr("left_side"))
    lower = bool(ctx.attr("lower"))
    unit = bool(ctx.attr("unit_diagonal"))
    tr = str(getattr(ctx.attr("transpose_a"), "value", ctx.attr("transpose_a"))).upper()
    if tr not in ("NO_TRANSPOSE", "TRANSPOSE", "ADJOINT"):
        raise ctx.unsupported(f"transpose_a = {tr}")
    transpose = tr != "NO_TRANSPOSE"  # ADJOINT is TRANSPOSE for reals
    n = a.shape[-1]
    one = np.asarray(ctx.alg.constant(np.ones(()), TensorType((), t.dtype)))
    alg = ctx.alg
    if _concrete_floats(ctx, a, b):
        m_lower = lower != transpose if left else lower == transpose
        sol = _triangular_solve_batched(ctx, a, b, left, m_lower, transpose, unit, one)
        return sol.astype(np.float64)
    out = np.empty(t.shape, dtype=object)
    for bi in np.ndindex(*a.shape[:-2]):
        m, rhs = a[bi], b[bi]

        def coef(i, j, m=m):  # op(a)[i, j], inside its triangle
            if i == j and unit:
                return one
            return np.asarray(m[j, i] if transpose else m[i, j])

        # M x = r with M = op(a) (left) or M = op(a)^T, r = b^T (right): x op(a) = b
        if left:
            get, r = coef, rhs
            m_lower = lower != transpose
        else:
            get, r = (lambda i, j, coef=coef: coef(j, i)), rhs.T
            m_lower = lower == transpose
        order = range(n) if m_lower else range(n - 1, -1, -1)
        x = [None] * n
        for i in order:
            acc = r[i]
            for j in range(i) if m_lower else range(i + 1, n):
                acc = alg.subtract(acc, alg.multiply(get(i, j), x[j]))
            x[i] = np.asarray(acc if unit else alg.divide(acc, get(i, i)))
        sol = np.stack([np.asarray(v) for v in x])  # [n, cols]
        out[bi] = sol if left else sol.T
    if all(isinstance(v, (float, int, np.floating, np.integer)) for v in out.reshape(-1)):
        return out.astype(np.float64)
    return out
