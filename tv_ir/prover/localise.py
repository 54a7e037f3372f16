"""Replay a candidate counterexample concretely, and find where the programs part ways.

The diverging op is the earliest op (in program order, within the cone of the differing
output) whose operands all have a numerically equal counterpart in the other program but
whose result has none. Constants count: a mask built with the wrong offset diverges at the
op that builds it, not where it is applied.
"""

from __future__ import annotations

import numpy as np

from ..ir import Module, Op, TensorType
from ..report import EQUIVALENT, NOT_EQUIVALENT, Counterexample, Location, OpSite, OutputResult
from .simulate import ValueIndex, close, first_difference, run_traced


def refutation(spec: Module, impl: Module, inputs: list):
    """(counterexample, location, per-output results) if `inputs` shows a difference."""
    spec_tr = run_traced(spec, inputs)
    impl_tr = run_traced(impl, inputs)
    outputs = []
    differing = None
    for i, (a, b) in enumerate(zip(spec_tr.outputs, impl_tr.outputs, strict=True)):
        same = close(a, b)
        outputs.append(OutputResult(i, EQUIVALENT if same else NOT_EQUIVALENT))
        if not same and differing is None:
            differing = i
    if differing is None:
        return None
    a = np.asarray(spec_tr.outputs[differing])
    b = np.asarray(impl_tr.outputs[differing])
    idx = first_difference(a, b) or (0,) * a.ndim
    with np.errstate(all="ignore"):
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    names = spec.main.arg_names
    ce = Counterexample(
        inputs={
            (names[k] if k < len(names) and names[k] else f"arg{k}"): x
            for k, x in enumerate(inputs)
        },
        output=differing,
        index=tuple(idx),
        expected=_scalar(a[idx]),
        actual=_scalar(b[idx]),
        max_abs_diff=float(np.nanmax(diff)) if diff.size else 0.0,
    )
    # only outputs that are not marked EQUIVALENT by this single replay are known to differ
    for o in outputs:
        if o.verdict == EQUIVALENT:
            o.verdict = "unknown"
    loc = Location(
        impl=_diverging_site(impl, impl_tr, spec, spec_tr, differing),
        spec=_diverging_site(spec, spec_tr, impl, impl_tr, differing),
    )
    return ce, loc, outputs


def _scalar(x):
    x = np.asarray(x)
    return x.item()


def _diverging_site(mod: Module, tr, other: Module, other_tr, output: int) -> OpSite | None:
    """Earliest op in `mod` whose operands all match values of `other` but whose result doesn't."""
    shapes, order = {}, {}
    values = list(other.main.args) + [v for op in other.main.body.ops for v in op.results]
    for v in values:
        if isinstance(v.type, TensorType):
            shapes[v.id] = v.type.shape
            order[v.id] = len(order)
    index = ValueIndex([other_tr], shapes, order)

    main = mod.main
    out_value = main.body.results[output]
    cone = _cone(main, out_value)
    matched: dict[int, bool] = {v.id: True for v in main.args}

    def is_matched(v) -> bool:
        if v.id not in matched:
            if not isinstance(v.type, TensorType) or v.id not in tr.values:
                matched[v.id] = True
            else:
                matched[v.id] = bool(index.candidates(v.type.shape, [tr.values[v.id]], limit=1))
        return matched[v.id]

    last = None
    for op in main.body.ops:
        if not any(r.id in cone for r in op.results):
            continue
        last = op
        if not op.operands:  # constants and iotas: where they are used is what matters
            for r in op.results:
                matched[r.id] = True
            continue
        if all(is_matched(v) for v in op.operands) and not all(is_matched(r) for r in op.results):
            return _site(op)
    producer = out_value.owner
    return _site(producer) if producer is not None else (_site(last) if last else None)


def _cone(fn, value) -> set[int]:
    seen: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if v.id in seen:
            continue
        seen.add(v.id)
        if v.owner is not None:
            stack.extend(v.owner.operands)
    return seen


def _site(op: Op) -> OpSite:
    loc = op.loc
    return OpSite(op=op.name, file=loc.file, line=loc.line, name=loc.name, function=loc.function)
