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

On the values of one run (a counterexample's), such a reduction is order-free when every
order gives the same result there, instance by instance (`order_free`): a reduce's output
element, when its body is commutative and associative on the closure of the values it
combines (an argmax whose values have no ties); a scatter's position updated more than
once, when every sequence of its updates reaches the same value (each subset of them one
state, whatever the path). A difference then is not one of order.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tv_ir.ir.program import Block, Module, Op, TensorType, Value, walk
from tv_ir.limits import OutOfMemoryBudget, OutOfTime
from tv_ir.semantics.ops.registry import REGION_ON_ARRAYS

REDUCING_OPS = (
    "stablehlo.reduce",
    "stablehlo.reduce_window",
    "stablehlo.scatter",
    "stablehlo.all_reduce",
    "stablehlo.reduce_scatter",
)
TRIALS = 64
CLOSURE_LIMIT = 64  # values one instance's closure may reach before the check gives up
UPDATES_LIMIT = 10  # updates one scatter position may take (its 2^k partial states are walked)
INSTANCES_LIMIT = 4096  # instances of one op checked (output elements, positions written twice)

ValueOf = Callable[[Value], "list | None"]


def order_dependent_reductions(module: Module) -> list[tuple[Op, str]]:
    """(op, 'op at loc: why') for each reduction whose body is seen not to be commutative
    or associative."""
    found = []
    for fn in module.functions.values():
        for op in walk(fn.body):
            if op.name not in REDUCING_OPS or not op.regions:
                continue
            if op.name == "stablehlo.scatter" and op.attrs.get("unique_indices"):
                continue  # each position updated once (`.at[i].set`): no order to choose
            why = _order_dependence(module, op.regions[0].block)
            if why:
                found.append((op, f"{op.name} at {op.loc}: its body is not {why}"))
    return found


def order_free(module: Module, op: Op, value_of: ValueOf, live: list | None = None) -> bool:
    """Whether every order the reduction `op` may combine its elements in gives the same
    result on the values `value_of` gives its operands, on every device: at each instance,
    the body commutative and associative on the closure of the values combined (a reduce),
    or every sequence of a position's updates reaching the same value (a scatter). `live`
    (`liveness.live_results`): per device, the results that are used; a device using none
    is skipped, and a reduce is checked on the components those results depend on."""
    per_device = [value_of(v) for v in op.operands]
    if op.name not in _INSTANCES or any(x is None for x in per_device):
        return False
    body = _Body(module, op.regions[0].block)
    try:
        for d in range(len(per_device[0])):
            used = None if live is None or d >= len(live) else live[d]
            if used is not None and not used:
                continue  # computed and thrown away on this device
            operands = [np.asarray(x[d]) for x in per_device]
            if not _INSTANCES[op.name](body, op, operands, used):
                return False
    except (OutOfTime, OutOfMemoryBudget, MemoryError):
        raise
    except Exception:  # noqa: BLE001 - a body tv cannot run concretely: no evidence
        return False
    return True


def _components(op: Op, used) -> list[int]:
    """The reduce's components the `used` results depend on through its body (result j
    reads components i when the body's result j reads either operand of component i)."""
    block = op.regions[0].block
    k = len(block.results)
    arg_of = {v.id: i % k for i, v in enumerate(block.args)}
    reads: dict[int, set[int]] = {v.id: {arg_of[v.id]} for v in block.args}
    for inner in walk(block):
        deps = set().union(*(reads.get(v.id, set()) for v in inner.operands))
        for region in inner.regions:  # values a nested region reads count too
            for nested in walk(region.block):
                deps |= set().union(*(reads.get(v.id, set()) for v in nested.operands))
        for r in inner.results:
            reads[r.id] = deps
    need = set(used)
    while True:
        grown = need | set().union(*(reads.get(block.results[j].id, set(range(k))) for j in need))
        if grown == need:
            return sorted(need)
        need = grown


def _reduce_order_free(body: _Body, op: Op, operands: list, used=None) -> bool:
    """Each output element: the body commutative and associative on the closure of its
    lane's values and the init values (then every tree, in every order, agrees); only on
    the components the `used` results read (the others do not reach them)."""
    k = len(operands) // 2
    axes = tuple(op.attrs["dimensions"])
    rest = [d for d in range(operands[0].ndim) if d not in axes]
    lanes = [np.transpose(x, rest + list(axes)).reshape(-1, _size(x, axes)) for x in operands[:k]]
    inits = [np.asarray(i).reshape(1) for i in operands[k:]]
    if lanes[0].shape[0] > INSTANCES_LIMIT:
        return False
    keep = list(range(k)) if used is None else _components(op, used)
    run = body if len(keep) == k else _Projected(body, keep, inits)
    for lane in range(lanes[0].shape[0]):
        values = [np.concatenate([inits[i], lanes[i][lane]]) for i in keep]
        if not _commutative_semigroup(run, values):
            return False
    return True


def _scatter_order_free(body: _Body, op: Op, operands: list, used=None) -> bool:
    """Each operand position updated more than once: every sequence of its updates reaches
    the same value (each subset of them one state, on every path through the subsets).
    Every result counts (`used` is not read: a scatter's results share its positions)."""
    from tv_ir.semantics.ops.indexing import scatter_targets

    k = (len(operands) - 1) // 2
    inputs, indices, updates = operands[:k], operands[k], operands[k + 1 :]
    dn = op.attrs["scatter_dimension_numbers"]
    landing: dict[tuple, list[tuple]] = {}
    for update_index, at in scatter_targets(dn, indices, inputs[0].shape, updates[0].shape):
        landing.setdefault(at, []).append(update_index)
    if sum(len(which) > 1 for which in landing.values()) > INSTANCES_LIMIT:
        return False
    for at, which in landing.items():
        if len(which) < 2:
            continue  # one update: no order to choose
        if len(which) > UPDATES_LIMIT:
            return False
        start = [np.asarray(x[at]) for x in inputs]
        news = [[np.asarray(u[i]) for u in updates] for i in which]
        if not _confluent(body, start, news):
            return False
    return True


_INSTANCES = {"stablehlo.reduce": _reduce_order_free, "stablehlo.scatter": _scatter_order_free}


def _size(x: np.ndarray, axes: tuple) -> int:
    return int(np.prod([x.shape[d] for d in axes], dtype=np.int64))


def _commutative_semigroup(body: _Body, values: list[np.ndarray]) -> bool:
    """Whether the body is commutative and associative on the closure of `values` (one
    array per component, an element per position), the closure grown by applying the
    body to every pair until nothing new appears (at most CLOSURE_LIMIT elements)."""
    elems = _distinct(values)
    while True:
        n = len(elems[0])
        if n > CLOSURE_LIMIT:
            return False
        i, j = np.divmod(np.arange(n * n), n)
        ij = body([e[i] for e in elems], [e[j] for e in elems])
        ji = body([e[j] for e in elems], [e[i] for e in elems])
        if not _same(ij, ji):
            return False
        grown = _distinct([np.concatenate([e, r]) for e, r in zip(elems, ij, strict=True)])
        if len(grown[0]) == n:
            break
        elems = grown
    # associativity on the closed set: (a.b).c == a.(b.c) for every triple
    table = {key: m for m, key in enumerate(_keys(elems))}
    product = np.array([table[key] for key in _keys(ij)]).reshape(n, n)
    a, b, c = np.unravel_index(np.arange(n**3), (n, n, n))
    left = product[product[a, b], c]
    right = product[a, product[b, c]]
    return bool(np.all(left == right))


def _confluent(body: _Body, start: list, news: list[list]) -> bool:
    """Whether applying the updates `news` to `start` in any order gives one value: the
    state after each subset of them is the same on every path that reaches it."""
    states = {0: start}
    for _ in range(len(news)):
        nxt: dict[int, list] = {}
        for mask, state in states.items():
            for u, new in enumerate(news):
                if mask >> u & 1:
                    continue
                after = body([np.asarray(s) for s in state], new)
                seen = nxt.setdefault(mask | 1 << u, after)
                if seen is not after and not _same(seen, after):
                    return False
        states = nxt
    return True


def _keys(values: list) -> list[tuple]:
    """One hashable key per position: the components' bytes (so NaNs and signed zeros are
    told apart exactly as the bits are)."""
    flat = [np.ascontiguousarray(np.asarray(v).reshape(-1)) for v in values]
    return list(zip(*([a[m].tobytes() for m in range(a.shape[0])] for a in flat), strict=True))


def _distinct(values: list) -> list[np.ndarray]:
    """The positions of `values` with distinct keys, first occurrences in order."""
    flat = [np.asarray(v).reshape(-1) for v in values]
    seen: dict[tuple, int] = {}
    for m, key in enumerate(_keys(flat)):
        seen.setdefault(key, m)
    keep = np.array(list(seen.values()), dtype=np.int64)
    return [a[keep] for a in flat]


def _same(xs: list, ys: list) -> bool:
    """Equal bit for bit, component by component."""
    return _keys(xs) == _keys(ys)


class _Body:
    """A reduction body run element by element on arrays of equal shape (the whole arrays
    at once where its ops allow, as the sort's comparator is)."""

    def __init__(self, module: Module, block: Block):
        from tv_ir.semantics.algebra import NumpyAlgebra
        from tv_ir.semantics.interpreters.evaluator import BlockEvaluator

        self.run = BlockEvaluator(module, NumpyAlgebra())
        self.block = block
        self.dtypes = [np.dtype(v.type.numpy_dtype) for v in block.results]

    def __call__(self, xs: list, ys: list) -> list[np.ndarray]:
        args = [np.asarray(a) for a in (*xs, *ys)]
        shape = np.broadcast_shapes(*(a.shape for a in args))
        token = REGION_ON_ARRAYS.set(True)
        try:
            out = self.run._block(self.block, args, top=False)
            return [
                np.broadcast_to(np.asarray(o, dtype=t), shape)
                for o, t in zip(out, self.dtypes, strict=True)
            ]
        except (OutOfTime, OutOfMemoryBudget, MemoryError):
            raise
        except Exception:  # noqa: BLE001 - a body that needs scalars: element by element
            pass
        finally:
            REGION_ON_ARRAYS.reset(token)
        outs = [np.empty(shape, t) for t in self.dtypes]
        args = [np.broadcast_to(a, shape) for a in args]
        for m in np.ndindex(*shape):
            res = self.run._block(self.block, [np.asarray(a[m]) for a in args], top=False)
            for o, r in zip(outs, res, strict=True):
                o[m] = np.asarray(r)
        return outs


class _Projected:
    """A body on some of its components: the others are filled with their init values
    (which the kept components' results do not read)."""

    def __init__(self, body: _Body, keep: list[int], inits: list):
        self.body, self.keep, self.inits = body, keep, inits

    def __call__(self, xs: list, ys: list) -> list[np.ndarray]:
        shape = np.broadcast_shapes(*(np.shape(a) for a in (*xs, *ys)))
        full = [np.broadcast_to(i.reshape(()), shape) for i in self.inits]
        a, b = list(full), list(full)
        for m, i in enumerate(self.keep):
            a[i], b[i] = xs[m], ys[m]
        out = self.body(a, b)
        return [out[i] for i in self.keep]


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
