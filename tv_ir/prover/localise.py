"""Replay a candidate counterexample concretely, and find where the programs part ways.

The diverging op is the earliest op (in program order, within the cone of the differing
output) whose operands all have a numerically equal counterpart in the other program but
whose result has none. Constants count: a mask built with the wrong offset diverges at the
op that builds it, not where it is applied.
"""

from __future__ import annotations

import numpy as np

from ..ir import Module, Op, TensorType
from ..report import NOT_EQUIVALENT, Counterexample, Location, OpSite, OutputResult
from .correspond import TileIndex, mesh_groups
from .simulate import close, first_difference, run_traced, run_traced_devices


def refutation(spec: Module, impl: Module, placement, inputs: list):
    """(counterexample, location, per-output results) if `inputs` shows a difference."""
    spec_tr = run_traced(spec, inputs)
    impl_tr = run_traced_devices(
        impl, placement.shard_inputs(inputs), placement.num_replicas, placement.num_partitions
    )
    impl_outs = placement.assemble_outputs(
        [
            [impl_tr.outputs[k][d] for k in range(len(impl_tr.outputs))]
            for d in range(placement.num_devices)
        ]
    )
    outputs = []
    differing = None
    for i, (a, b) in enumerate(zip(spec_tr.outputs, impl_outs, strict=True)):
        same = close(a, b)
        # one replay proves a difference, not an equality
        outputs.append(OutputResult(i, "unknown" if same else NOT_EQUIVALENT))
        if not same and differing is None:
            differing = i
    if differing is None:
        return None
    a = np.asarray(spec_tr.outputs[differing])
    b = np.asarray(impl_outs[differing])
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
        device=_holder(placement.results[differing], idx) if placement.distributed else None,
        max_abs_diff=float(np.nanmax(diff)) if diff.size else 0.0,
    )
    index = _spec_tiles(spec, spec_tr)
    impl_site, matched_spec = _impl_site(impl, impl_tr, index, differing)
    loc = Location(impl=impl_site, spec=_spec_site(spec, matched_spec, differing))
    return ce, loc, outputs


def _holder(layout, idx) -> int | None:
    """The first device whose box holds element `idx` of a result."""
    for d in range(layout.num_devices):
        if all(a <= i < b for i, (a, b) in zip(idx, layout.box(d), strict=True)):
            return d
    return None


def _scalar(x):
    x = np.asarray(x)
    return x.item()


def _spec_tiles(spec: Module, spec_tr) -> TileIndex:
    shapes, order = {}, {}
    values = list(spec.main.args) + [v for op in spec.main.body.ops for v in op.results]
    for v in values:
        if isinstance(v.type, TensorType):
            shapes[v.id] = v.type.shape
            order[v.id] = len(order)
    return TileIndex([spec_tr], shapes, order)


def _impl_site(impl: Module, tr, index: TileIndex, output: int):
    """Earliest impl op whose operands all have spec counterparts but whose result has none;
    also the set of spec values that some impl value corresponds to."""
    main = impl.main
    cone = _cone(main.body.results[output])
    matched: dict[int, bool] = {v.id: True for v in main.args}
    spec_seen: set[int] = set()

    def is_matched(v) -> bool:
        if v.id not in matched:
            if not isinstance(v.type, TensorType) or v.id not in tr.values:
                matched[v.id] = True
            else:
                found = index.candidates([[x] for x in tr.values[v.id]], limit=0)
                spec_seen.update(c.spec_value for c in found)
                matched[v.id] = bool(found) or _partial_sum(tr.values[v.id], index)
        return matched[v.id]

    site = None
    for op in _execution_order(main):
        if not op.operands:  # constants and iotas: where they are used is what matters
            matched.update((r.id, True) for r in op.results)
            continue
        for r in op.results:
            is_matched(r)  # every value, so the spec side knows what has a counterpart
        if site is not None or not any(r.id in cone for r in op.results):
            continue
        if all(is_matched(v) for v in op.operands) and not all(is_matched(r) for r in op.results):
            site = _site(op)
    if site is None:
        producer = main.body.results[output].owner
        site = _site(producer) if producer is not None else None
    return site, spec_seen


def _partial_sum(per_device: list, index: TileIndex) -> bool:
    """Do the devices hold partial sums of a spec value, over the groups of some mesh axes?"""
    n = len(per_device)
    if n == 1 or np.asarray(per_device[0]).dtype.kind != "f":
        return False
    for groups in mesh_groups(n):
        summed: list = [None] * n
        for g in groups:
            total = sum(np.asarray(per_device[d], dtype=np.float64) for d in g)
            for d in g:
                summed[d] = total
        if index.candidates([[x] for x in summed], limit=1):
            return True
    return False


def _spec_site(spec: Module, matched: set[int], output: int) -> OpSite | None:
    """Earliest spec op whose operands all have impl counterparts but whose result has none."""
    main = spec.main
    cone = _cone(main.body.results[output])
    ok = {v.id for v in main.args} | matched
    for op in main.body.ops:
        if not op.operands:  # constants and iotas: where they are used is what matters
            ok.update(r.id for r in op.results)
            continue
        if not any(r.id in cone for r in op.results):
            continue
        if all(v.id in ok for v in op.operands) and not all(r.id in ok for r in op.results):
            return _site(op)
    producer = main.body.results[output].owner
    return _site(producer) if producer is not None else None


def _execution_order(fn):
    """Top-level ops in program order, with the body of each shard_map region
    (`sdy.manual_computation`, whose body values the simulation records) before the op."""
    for op in fn.body.ops:
        if op.name == "sdy.manual_computation" and op.regions:
            yield from op.regions[0].block.ops
        yield op


def _cone(value) -> set[int]:
    """Values `value` depends on (through shard_map bodies too)."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if v.id in seen:
            continue
        seen.add(v.id)
        if v.owner is not None:
            stack.extend(v.owner.operands)
            if v.owner.name == "sdy.manual_computation" and v.owner.regions:
                stack.extend(v.owner.regions[0].block.results)
    return seen


def _site(op: Op) -> OpSite:
    loc = op.loc
    return OpSite(op=op.name, file=loc.file, line=loc.line, name=loc.name, function=loc.function)
