"""Control flow and calls: while, case, if, func.call, composite, custom_call.

Loops run (unrolled) when their predicates fold to constants; a loop predicate that depends
on symbolic inputs is unsupported. A `case` / `if` whose branch index or predicate depends
on the inputs runs every branch and selects among their results by it, when no branch
holds a collective (running every branch is then the same function as running the chosen
one; `tv_ir.semantics.interpreters.spmd` also allows collectives when every device decides on
the same term).
"""

from __future__ import annotations

import contextvars

import numpy as np

from tv_ir.errors import Unsupported
from tv_ir.ir.structure import reads_from_outside, region_signature
from tv_ir.semantics import terms as T
from tv_ir.semantics.ops.registry import COLLECTIVES, GLOBAL_VIEW, PROCESS_OPS, op
from tv_ir.semantics.run_tables import run_table

MAX_TRIP_COUNT = 1_000_000
# the most iterations a loop may run in this evaluation (a simulation on extreme integers
# lowers it: a counter starting from -2^31 would run for hours)
TRIP_LIMIT = contextvars.ContextVar("trip_limit", default=MAX_TRIP_COUNT)


class LoopTooLong(Unsupported):
    """A loop ran more iterations than TRIP_LIMIT allows, or would run forever."""

    def __init__(self, name: str = "stablehlo.while", loc=None, never: bool = False) -> None:
        why = (
            "loop never terminates from these inputs (its body leaves its state unchanged)"
            if never
            else f"loop did not terminate within {TRIP_LIMIT.get()} iterations"
        )
        super().__init__(f"{name}: {why}", op=name, loc=loc)


@op("stablehlo.while")
def while_(ctx, *operands):
    values = list(operands)
    for _ in range(TRIP_LIMIT.get()):
        go_on = known_truth(ctx.alg, ctx.run_region(0, values)[0])
        if go_on is None:
            return opaque_loop(ctx, values)
        if not go_on:
            return values
        before, values = values, ctx.run_region(1, values)
        if _unchanged(before, values):  # the predicate holds again: it never ends
            raise LoopTooLong(ctx.name, ctx.loc, never=True)
    raise LoopTooLong(ctx.name, ctx.loc)


def _unchanged(before: list, after: list) -> bool:
    """Numbers the body left as they were (the first value, most often a counter, is
    compared first)."""
    for a, b in zip(before, after, strict=True):
        if a is b:  # passed on as it was (a loop's invariants)
            continue
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype == object or b.dtype == object or not np.array_equal(a, b):
            return False
    return True


# ops a loop's regions may hold for its result to be a function of its state alone: not
# collectives or device ids (other devices' values, this device's place), nor calls (whose
# bodies the loop's structure does not show), nor random numbers or I/O
_NOT_A_FUNCTION_OF_THE_STATE = frozenset(
    (
        "func.call",
        "stablehlo.composite",
        "stablehlo.rng",
        "stablehlo.rng_bit_generator",
        "stablehlo.infeed",
        "stablehlo.outfeed",
        "stablehlo.send",
        "stablehlo.recv",
        "sdy.manual_computation",
    )
)
# annotations for the partitioner: no part of an op's meaning
_ANNOTATIONS = frozenset(("mhlo.sharding", "mhlo.frontend_attributes", "sdy.sharding"))
MAX_OPAQUE_LOOP_STATE = 4096  # elements of state a loop's opaque function may take


def opaque_loop(ctx, values: list) -> list:
    """A loop whose predicate depends on the inputs, from state `values` on: its final state
    as opaque functions of `values` (terms.opaque_elements), one per loop meaning (`_loop_key`).
    Two loops of one meaning run from equal states end in equal states, however many times
    they go round: that is all this says of the loop, and all a spec and an implementation
    running the same loop need (docs/equivalence.md, "Loops whose trip count depends on the
    inputs, and other opaque functions")."""
    why = "its predicate depends on the inputs"
    if any(reads_from_outside(r.block) for r in ctx.regions):
        raise ctx.unsupported(f"{why} and its regions read values from outside the loop")
    stack = [r.block for r in ctx.regions]
    while stack:
        block = stack.pop()
        for inner in block.ops:
            name = inner.name
            if (
                name in COLLECTIVES
                or name in PROCESS_OPS
                or name in GLOBAL_VIEW
                or name in _NOT_A_FUNCTION_OF_THE_STATE
                or name == "stablehlo.custom_call"
                and inner.attrs.get("call_target_name") not in ("Sharding", "mhlo.sharding")
            ):
                raise ctx.unsupported(f"{why} and it holds {name}")
            stack.extend(r.block for r in inner.regions)
    types = ctx.operand_types
    if any(not hasattr(t, "shape") or getattr(t, "is_complex", False) for t in types):
        raise ctx.unsupported(f"{why} and its state holds tokens, tuples or complex numbers")
    arrays = [np.asarray(v) for v in values]
    if sum(a.size for a in arrays) > MAX_OPAQUE_LOOP_STATE:
        raise ctx.unsupported(f"{why} and its state has more than {MAX_OPAQUE_LOOP_STATE} elements")
    key = _loop_key(ctx)
    if key not in T.OPAQUE_RUNNERS:
        T.OPAQUE_RUNNERS[key] = _numeric_runner(ctx)
    state = tuple(T.lift(x) for a in arrays for x in a.reshape(-1))
    out = []
    for k, t in enumerate(types):
        kind = "pred" if t.is_bool else "float" if t.is_float else "int"
        flat = T.opaque_elements(key, k, range(int(np.prod(t.shape))), state, kind)
        arr = np.empty(len(flat), dtype=object)
        arr[:] = flat
        out.append(arr.reshape(tuple(t.shape)))
    return out


_LOOP_KEYS: dict[tuple, str] = run_table({})  # a loop's meaning -> its key


def _loop_key(ctx) -> str:
    """A name for what the loop computes: its condition and body evaluated on symbols of
    its state, as normal forms (two loops XLA wrote differently, constants shared or
    converts dropped, agree there); when they cannot be evaluated so, its ops themselves
    (their structure, less the partitioner's annotations). Equal keys: equal conditions and
    bodies on every state, so equal loops."""
    types = [str(t) for t in ctx.operand_types]
    try:
        state = [
            T.symbol_array(T.Key("loop_state", k, t.dtype, f"state{k}"), tuple(t.shape))
            for k, t in enumerate(ctx.operand_types)
        ]
        meaning = (
            "terms",
            tuple(types),
            _terms(ctx.run_region(0, state)),
            _terms(ctx.run_region(1, state)),
        )
    except Unsupported:
        meaning = (
            "ops",
            tuple(types),
            tuple(region_signature(r.block, _ANNOTATIONS) for r in ctx.regions),
        )
    return _LOOP_KEYS.setdefault(meaning, f"loop:{len(_LOOP_KEYS)}")


def _terms(values: list) -> tuple:
    """Arrays of numbers and terms as a tuple of terms per array."""
    out = []
    for v in values:
        a = np.asarray(v)
        lift = T.lift_bool if a.dtype == bool else T.lift
        out.append(tuple(x if isinstance(x, (T.Poly, T.Bool)) else lift(x) for x in a.reshape(-1)))
    return tuple(out)


def _numeric_runner(ctx):
    """The loop on numbers: its initial state's element values (flat, state value by state
    value) -> its final state's, as Python numbers."""
    run, types = ctx.run_numeric, list(ctx.operand_types)
    if run is None:
        raise ctx.unsupported("its predicate depends on the inputs, here it cannot run")

    def runner(state: tuple) -> list[list]:
        values, at = [], 0
        for t in types:
            n = int(np.prod(t.shape))
            elems = state[at : at + n]
            at += n
            if not t.is_float:
                elems = [int(round(x)) for x in elems]
            values.append(np.array(elems).astype(t.numpy_dtype).reshape(tuple(t.shape)))
        for _ in range(TRIP_LIMIT.get()):
            if not bool(np.asarray(run(0, values)[0])):
                return [_flat_numbers(v, t) for v, t in zip(values, types, strict=True)]
            values = run(1, values)
        raise LoopTooLong(ctx.name, ctx.loc)

    return runner


def _flat_numbers(v, t) -> list:
    """A state value's elements as Python floats (float types) or ints (the others)."""
    return np.asarray(v).astype(np.float64 if t.is_float else np.int64).reshape(-1).tolist()


@op("stablehlo.case")
def case(ctx, index):
    n = len(ctx.regions)
    i = ctx.alg.known_index(index)
    if i is not None:
        return ctx.run_region(i if 0 <= i < n else n - 1, [])
    refuse_collective_branches(ctx.regions, "a case index", ctx.loc)
    return select_case(ctx.alg, index, [ctx.run_region(k, []) for k in range(n)])


@op("stablehlo.if")
def if_(ctx, pred):
    decided = known_truth(ctx.alg, pred)
    if decided is not None:
        return ctx.run_region(0 if decided else 1, [])
    refuse_collective_branches(ctx.regions, "an if predicate", ctx.loc)
    return select_results(ctx.alg, pred, ctx.run_region(0, []), ctx.run_region(1, []))


def known_truth(alg, pred) -> bool | None:
    """A predicate's truth, or None when it depends on the inputs."""
    try:
        return alg.truth(pred)
    except Unsupported as e:
        if "depends on the inputs" not in str(e):
            raise
        return None


def select_case(alg, index, results: list[list]) -> list:
    """`case` as a choice among every branch's results (an index out of range: the last)."""
    chosen = results[-1]
    index = np.asarray(index)
    for k in reversed(range(len(results) - 1)):
        is_k = alg.compare("EQ", index, np.asarray(k, dtype=index.dtype))
        chosen = select_results(alg, is_k, results[k], chosen)
    return chosen


def select_results(alg, pred, on_true: list, on_false: list) -> list:
    """Each result chosen by a scalar predicate."""
    out = []
    for a, b in zip(on_true, on_false, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        p = np.broadcast_to(np.asarray(pred, dtype=object), a.shape)
        out.append(np.asarray(alg.select(p, a, b)))
    return out


def collective_in(regions) -> str | None:
    """The name of a collective the regions (or regions nested in them) hold, or None."""
    stack = [r.block for r in regions]
    while stack:
        block = stack.pop()
        for inner in block.ops:
            if inner.name in COLLECTIVES:
                return inner.name
            stack.extend(r.block for r in inner.regions)
    return None


def refuse_collective_branches(
    regions, what: str, loc=None, why: str = "depends on the inputs"
) -> None:
    """Every branch may run only if none talks to other devices."""
    name = collective_in(regions)
    if name is not None:
        raise Unsupported(f"{what} {why} and a branch holds {name}", op=name, loc=loc)


@op("func.call")
def call(ctx, *args):
    return ctx.call(ctx.attr("callee"), list(args))


@op("stablehlo.composite")
def composite(ctx, *args):
    """Its semantics are its decomposition function's."""
    return ctx.call(ctx.attr("decomposition"), list(args))


@op("stablehlo.custom_call")
def custom_call(ctx, *args):
    target = ctx.attr("call_target_name")
    if target in ("Sharding", "mhlo.sharding") and len(args) == 1:
        return np.asarray(args[0])  # a sharding annotation: the identity on values
    raise Unsupported(
        f"custom_call @{target} has no known semantics",
        op=f"stablehlo.custom_call @{target}",
        loc=ctx.loc,
    )


@op("stablehlo.after_all")
def after_all(ctx, *tokens):
    """A token orders side effects and carries no value (tv's tokens are None); a program
    with no side effects has nothing for it to order."""
    return None
