"""Reductions whose result depends on the order the elements are combined in.

XLA combines the elements of a `reduce` (and `reduce_window`, `scatter`, `all_reduce`,
`reduce_scatter`) in an order of its choosing; the result is defined only when the body is
commutative and associative. tv reads the spec's reductions in sequential order, so when
a body is not (an argmax by a strict `>` that keeps the right operand on ties), a
difference tv finds may be one of order, which XLA is free to change: such a refutation is
reported as unknown (`order_dependent_reductions`), never as not_equivalent.

A body is tested on small integers (ties are likely), concretely: finding a pair or a
triple on which it is not commutative or associative is certain; finding none is not a
proof, and then nothing changes.
"""

from __future__ import annotations

import numpy as np

from tv_ir.ir.program import Module, TensorType, walk

REDUCING_OPS = (
    "stablehlo.reduce",
    "stablehlo.reduce_window",
    "stablehlo.scatter",
    "stablehlo.all_reduce",
    "stablehlo.reduce_scatter",
)
TRIALS = 64


def order_dependent_reductions(module: Module) -> list[str]:
    """'op at loc: why' for each reduction whose body is seen not to be commutative or
    associative."""
    found = []
    for fn in module.functions.values():
        for op in walk(fn.body):
            if op.name not in REDUCING_OPS or not op.regions:
                continue
            if op.name == "stablehlo.scatter" and op.attrs.get("unique_indices"):
                continue  # each position updated once (`.at[i].set`): no order to choose
            why = _order_dependence(module, op.regions[0].block)
            if why:
                found.append(f"{op.name} at {op.loc}: its body is not {why}")
    return found


def _order_dependence(module: Module, block) -> str | None:
    from tv_ir.semantics.algebra import NumpyAlgebra
    from tv_ir.semantics.interpreters.evaluator import BlockEvaluator

    args = list(block.args)
    if len(args) % 2 or not args or not all(_scalar(a.type) for a in args):
        return None
    k = len(args) // 2
    dtypes = [np.dtype(a.type.numpy_dtype) for a in args[:k]]
    run = BlockEvaluator(module, NumpyAlgebra())
    rng = np.random.default_rng(0)

    def body(x, y):
        out = run._block(block, [*x, *y], top=False)
        return tuple(np.asarray(v).item() for v in out)

    def draw():
        return [np.asarray(rng.integers(0, 3), dtype=t) for t in dtypes]

    try:
        for _ in range(TRIALS):
            a, b, c = draw(), draw(), draw()
            if body(a, b) != body(b, a):
                return "commutative"
            ab = [np.asarray(v, dtype=t) for v, t in zip(body(a, b), dtypes, strict=True)]
            bc = [np.asarray(v, dtype=t) for v, t in zip(body(b, c), dtypes, strict=True)]
            if body(ab, c) != body(a, bc):
                return "associative"
    except Exception:  # a body tv cannot run concretely: no evidence either way
        return None
    return None


def _scalar(t) -> bool:
    return isinstance(t, TensorType) and t.shape == ()
