"""cholesky and triangular_solve, written out over the element algebra (substitution and the
Cholesky-Banachiewicz recurrences), so symbolic evaluation gives ordinary terms: the
divisions by pivots and the square roots carry their definedness conditions.

Where the spec leaves results implementation-defined, these are XLA:CPU's (checked by the
conformance records): cholesky reads the triangle `lower` names, zeroes the other one, and
returns NaN everywhere when the factorisation fails (a non-positive pivot).

Written out, the terms of an n x n factorisation or solve grow exponentially with n (a
32 x 32 solve did not finish in minutes). On symbolic matrices larger than OPAQUE_N each
result element is instead an opaque function of the elements the op reads
(`terms.opaque_element`): the same op on equal operands gives equal results, which proves a
partitioned program that gathers the matrices and runs the op itself, and nothing more.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from tv_ir.ir.program import TensorType
from tv_ir.semantics import terms as T
from tv_ir.semantics.algebra import NumpyAlgebra
from tv_ir.semantics.ops.reduction import assemble
from tv_ir.semantics.ops.registry import op

OPAQUE_N = 8  # symbolic matrices larger than this are factorised / solved opaquely
_NUMBERS = SimpleNamespace(alg=NumpyAlgebra())  # a context whose algebra is numbers


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

        def read(i, j, m=m):  # the triangle `lower` names, as a lower one
            return np.asarray(m[i, j]) if lower else np.asarray(m[j, i])

        if n > OPAQUE_N:
            out.extend(_opaque_cholesky(read, n, lower, t.dtype))
            continue
        L = _cholesky_lower(ctx, read, n, zero)
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


def _lower_triangle(n: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(n) for j in range(i + 1)]


def _opaque_cholesky(read, n: int, lower: bool, dtype: str) -> list:
    """One matrix's result (row-major elements), L's entries opaque functions of the lower
    triangle read (see the module's docstring), all defined where the factorisation
    succeeds (an opaque condition of the same arguments: its last pivot is finite), NaN
    everywhere where it fails, as the recurrence's guard says."""
    key = f"cholesky:{n}:{dtype}"
    tri = _lower_triangle(n)
    if key not in T.OPAQUE_RUNNERS:

        def runner(values: tuple) -> list[list]:
            m = np.zeros((n, n))
            for (i, j), v in zip(tri, values, strict=True):
                m[i, j] = v
            with np.errstate(all="ignore"):
                L = _cholesky_lower(_NUMBERS, lambda i, j: m[i, j], n, np.zeros(()))
            return [[float(L[i][j]) for i, j in tri]]

        T.OPAQUE_RUNNERS[key] = runner
    args = tuple(T.lift(read(i, j)) for i, j in tri)
    entries = dict(zip(tri, T.opaque_elements(key, 0, range(len(tri)), args, "int"), strict=True))
    succeeds = T.Bool("finite_at", ("apply", entries[n - 1, n - 1]))
    out = []
    for i in range(n):
        for j in range(n):
            at = (i, j) if lower else (j, i)
            out.append(T.with_dom(entries.get(at, T.ZERO), succeeds))
    return out


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
    if n > OPAQUE_N:
        solve = _opaque_solve(n, left, lower, unit, transpose, t.dtype)
        for bi in np.ndindex(*a.shape[:-2]):
            out[bi] = solve(a[bi], b[bi])
        return out
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


def _opaque_solve(n: int, left: bool, lower: bool, unit: bool, transpose: bool, dtype: str):
    """(a, b) -> x for one matrix, each column of x (a row when not `left`) an opaque
    function of the triangle of a the op reads and that column of b (see the module's
    docstring): how b's columns are split does not change the function."""
    key = f"triangular_solve:{n}:{left}:{lower}:{unit}:{transpose}:{dtype}"
    tri = [
        (i, j)
        for i in range(n)
        for j in range(n)
        if (i > j if lower else i < j) or (i == j and not unit)
    ]
    m_lower = lower != transpose if left else lower == transpose
    if key not in T.OPAQUE_RUNNERS:

        def runner(values: tuple) -> list[list]:
            m = np.zeros((n, n))
            for (i, j), v in zip(tri, values[: len(tri)], strict=True):
                m[i, j] = v
            vec = np.asarray(values[len(tri) :], dtype=np.float64)
            rhs = vec[:, None] if left else vec[None, :]
            with np.errstate(all="ignore"):
                x = _triangular_solve_batched(
                    _NUMBERS, m, rhs, left, m_lower, transpose, unit, np.ones(())
                )
            return [np.asarray(x, dtype=np.float64).reshape(-1).tolist()]

        T.OPAQUE_RUNNERS[key] = runner

    def solve(a, b) -> np.ndarray:
        read = tuple(T.lift(a[i, j]) for i, j in tri)
        x = np.empty(b.shape, dtype=object)
        for c in range(b.shape[-1] if left else b.shape[0]):
            vec = b[:, c] if left else b[c, :]
            args = read + tuple(T.lift(v) for v in vec)
            elems = T.opaque_elements(key, 0, range(n), args, "float")
            for i, e in enumerate(elems):
                x[(i, c) if left else (c, i)] = e
        return x

    return solve
