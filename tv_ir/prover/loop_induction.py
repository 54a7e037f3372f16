"""Loops proved once, by induction over the iterations (docs/equivalence.md, "Loops").

When the spec and the implementation each run the same sequence of top-level fixed-trip
loops (a `jax.lax.scan` over stacked layers), the pair is split (passes/loop_cut.py) into
obligations that are checked like any other pair:

- the *rest*: both programs with their loops cut out, the loops' results as extra inputs and
  their initial operands as extra outputs, each with the layout `L` the positions keep;
- one *body* per loop pair: one iteration, carries in and out under `L`, each stacked
  input's layer and each stacked output's layer under `L` without the stacked dimension,
  and the counter as an input when the body still reads it (a symbolic counter).

All equivalent: by induction over the iterations the loops' results correspond under `L`,
so the programs are equivalent for every trip count the loops run. The layouts `L` and which
positions pair up come from one concrete run of both programs (as cut-points do); a wrong
guess only makes an obligation fail. Any precondition or obligation that fails is no
verdict: the caller then checks the programs unrolled, as before (a refutation always
comes from that check, replayed on the whole programs).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tv_ir.ir.program import Module
from tv_ir.passes import run_pipeline
from tv_ir.passes.loop_cut import (
    CARRIED,
    COUNTER,
    DERIVED,
    INVARIANT,
    STACKED_IN,
    STACKED_OUT,
    LoopParts,
    body_function,
    loop_parts,
    rest_function,
    top_level_loops,
    with_main,
)
from tv_ir.passes.loop_shorten import backwards, shortened, shortened_copy
from tv_ir.passes.unroll import unroll_static_loops
from tv_ir.report.result import EQUIVALENT, NOT_EQUIVALENT, Report
from tv_ir.semantics.layout import Layout

from . import workers
from .correspond import box_index, tiles
from .placement import Placement
from .simulate import random_inputs, run_traced, run_traced_devices

CheckPair = Callable[[Module, Module, Placement], Report]
INPUT_KINDS = (CARRIED, INVARIANT, STACKED_IN)
PAIRING_TRIPS = 2  # iterations each loop runs in the run that pairs positions up
OUTPUT_KINDS = (CARRIED, STACKED_OUT)


@dataclass
class NotProved:
    """Why the loops were not proved by induction. When a body obligation was refuted,
    `iterations` is how many iterations of each loop reach the iteration its counterexample
    names (a place to look for a counterexample of the whole programs: `loops_cut`)."""

    reason: str
    iterations: int | None = None
    loops: tuple[list[LoopParts], list[LoopParts]] = ([], [])

    def __str__(self) -> str:
        return self.reason


@dataclass
class _LoopPair:
    spec: LoopParts
    impl: LoopParts
    pairs: list[tuple[int, int, Layout]]  # (spec position, impl position, layout), no counter


def prove_loops_by_induction(
    spec: Module, impl: Module, placement: Placement, check_pair: CheckPair, seed: int = 0
) -> Report | NotProved | str:
    """The pair proved through its loops (an equivalent report), or why that did not work."""
    t0 = time.perf_counter()
    spec_loops, impl_loops = top_level_loops(spec), top_level_loops(impl)
    if not spec_loops or len(spec_loops) != len(impl_loops):
        return f"the spec runs {len(spec_loops)} top-level loops, the impl {len(impl_loops)}"
    loops = []
    for s_loop, i_loop in zip(spec_loops, impl_loops, strict=True):
        s_parts, i_parts = loop_parts(spec, s_loop), loop_parts(impl, i_loop)
        for role, parts in (("spec", s_parts), ("impl", i_parts)):
            if isinstance(parts, str):
                return f"a {role} loop at {s_loop.loc if role == 'spec' else i_loop.loc}: {parts}"
        if (s_parts.trips, s_parts.counter_start) != (i_parts.trips, i_parts.counter_start):
            return (
                f"loops run {s_parts.trips} and {i_parts.trips} times, counting from "
                f"{s_parts.counter_start} and {i_parts.counter_start}"
            )
        loops.append((s_parts, i_parts))
    paired = _pair_positions(spec, impl, placement, loops, seed)
    if isinstance(paired, str):  # positions differ within the pairing run's iterations
        found = ([s for s, _ in loops], [i for _, i in loops])
        return NotProved(paired, PAIRING_TRIPS, found)
    obligations = [_rest_obligation(spec, impl, placement, paired)]
    for k, lp in enumerate(paired):
        obligations.append(_body_obligation(spec, impl, placement.num_partitions, lp, k))
    built = next((k for k, ob in enumerate(obligations) if isinstance(ob, str)), None)
    checks = obligations[:built]  # what runs before the first that could not be built

    def check(k: int) -> Report:
        _, s_mod, i_mod, place = checks[k]
        return check_pair(s_mod, i_mod, place)

    reports: list[Report] = []
    timing: dict = {}
    with contextlib.closing(workers.decided(check, list(range(len(checks))), timing)) as done:
        for k, report in enumerate(done):
            if isinstance(report, workers.Failed):
                raise report.error
            outcome = _judged(k, report, checks[k], paired, reports)
            if outcome is not None:
                return outcome
    if built is not None:
        return obligations[built]
    out = _combined(reports, len(spec.main.result_types), paired, time.perf_counter() - t0)
    if "pool" in timing:
        out.stats.seconds["induction obligations in workers"] = timing["pool"]
    return out


def _judged(k: int, report: Report, ob, paired, reports: list) -> NotProved | None:
    """Obligation `k`'s report, judged as the proof goes: None when it is proved (kept in
    `reports`), else why the loops are not proved by induction."""
    name, _, i_mod, _ = ob
    if report.verdict != EQUIVALENT:
        why = report.reason or report.verdict.replace("_", " ")
        iterations = None
        if report.verdict == NOT_EQUIVALENT:  # the rest: any number of iterations shows it
            iterations = (
                1 if k == 0 else _iterations_to(paired[k - 1], report, len(i_mod.main.args))
            )
        cut = ([lp.spec for lp in paired], [lp.impl for lp in paired])
        return NotProved(f"the {name} obligation was not proved ({why})", iterations, cut)
    reports.append(report)
    return None


def _iterations_to(lp: _LoopPair, report: Report, body_args: int) -> int | None:
    """How many iterations (first ones, or last ones for a backward loop) reach the one a
    refuted body's counterexample names: 1 when the body does not read the counter."""
    ce = report.counterexample
    inputs = list(ce.inputs.values()) if ce is not None else []
    if len(inputs) != body_args:
        return None
    with_counter = len(inputs) > sum(lp.spec.kinds[k] in INPUT_KINDS for k, _, _ in lp.pairs)
    if not with_counter:
        return 1
    step = int(np.asarray(inputs[-1]).reshape(())) - lp.spec.counter_start
    if not 0 <= step < lp.spec.trips:
        return None  # an iteration the loops never run
    return lp.spec.trips - step if backwards(lp.spec) else step + 1


def loops_cut(module: Module, loops: list[LoopParts], iterations: int) -> Module:
    """`module` with its loops run `iterations` times at most, unrolled and normalised."""
    return _normalised(shortened_copy(module, loops, iterations))


def _pair_positions(spec, impl, placement, loops, seed) -> list[_LoopPair] | str:
    """Which impl position holds which spec position, and its layout, from one run."""
    rng = np.random.default_rng(seed)
    inputs = random_inputs(spec.main, rng)
    with shortened(spec, [s for s, _ in loops], PAIRING_TRIPS):
        s_trace = run_traced(spec, inputs)
    with shortened(impl, [i for _, i in loops], PAIRING_TRIPS):
        i_trace = run_traced_devices(
            impl, placement.shard_inputs(inputs), placement.num_replicas, placement.num_partitions
        )
    out = []
    # spec value -> the impl value known to hold it (arguments; earlier loops' results), so a
    # loop reading an earlier loop's results pairs them as that loop did (duplicate values,
    # e.g. a residual saved twice, would otherwise pair either way)
    held = {a.id: b.id for a, b in zip(spec.main.args, impl.main.args, strict=True)}
    for s_parts, i_parts in loops:
        pairs, taken = [], set()
        for k, kind in enumerate(s_parts.kinds):
            if kind in (COUNTER, DERIVED):
                continue
            found = None
            want = held.get(s_parts.loop.operands[k].id)
            order = sorted(
                range(len(i_parts.kinds)), key=lambda j: i_parts.loop.operands[j].id != want
            )
            for j in order:
                ikind = i_parts.kinds[j]
                if j in taken or ikind != kind:
                    continue
                if s_parts.layer_order.get(k) != i_parts.layer_order.get(j):
                    continue
                lay = _layout_of(s_parts, k, s_trace, i_parts, j, i_trace, placement.num_devices)
                if lay is not None:
                    found = (k, j, lay)
                    break
            if found is None:
                where = s_parts.loop.loc
                return f"no impl position of the loop at {where} holds its position {k} ({kind})"
            taken.add(found[1])
            pairs.append(found)
            held[s_parts.loop.results[k].id] = i_parts.loop.results[found[1]].id
        left = [j for j, kind in enumerate(i_parts.kinds) if kind not in (COUNTER, DERIVED)]
        left = [j for j in left if j not in taken]
        if left:
            where = i_parts.loop.loc
            return f"impl positions {left} of the loop at {where} hold no spec position"
        out.append(_LoopPair(s_parts, i_parts, pairs))
    return out


def _layout_of(s_parts, k, s_trace, i_parts, j, i_trace, n: int) -> Layout | None:
    """A layout under which impl position j holds spec position k both before and after the
    loop (whole tiles, no padding, no partial sums); stacked ones keep the stack whole."""
    s_vals = [
        s_trace.values.get(s_parts.loop.operands[k].id),
        s_trace.values.get(s_parts.loop.results[k].id),
    ]
    i_vals = [
        i_trace.values.get(i_parts.loop.operands[j].id),
        i_trace.values.get(i_parts.loop.results[j].id),
    ]
    if any(v is None for v in s_vals + i_vals):
        return None
    shape = tuple(np.shape(s_vals[0]))
    local = tuple(np.shape(i_vals[0][0]))
    boxes = tiles(shape, local)
    if boxes is None:
        return None
    chosen = []
    pairs = list(zip(s_vals, i_vals, strict=True))
    for d in range(n):
        box = next((b for b in boxes if all(_same(s[box_index(b)], i[d]) for s, i in pairs)), None)
        if box is None:
            return None
        chosen.append(box)
    if s_parts.kinds[k] in (STACKED_IN, STACKED_OUT) and any(b[0] != (0, shape[0]) for b in chosen):
        return None
    desc = "{boxes " + ", ".join(str(list(b)) for b in dict.fromkeys(chosen)) + "}"
    return Layout(shape, n, tuple(chosen), local, desc=desc)


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype.kind == "b" or b.dtype.kind == "b":
        return bool(np.array_equal(a, b))
    return bool(np.allclose(a, b, rtol=1e-7, atol=1e-9))


def _layer(lay: Layout) -> Layout:
    """The layout of one layer of a stacked value whose stack dimension is whole."""
    shape = (1, *lay.global_shape[1:])
    boxes = tuple(((0, 1), *b[1:]) for b in lay.boxes)
    return Layout(shape, lay.num_devices, boxes, (1, *lay.tile_shape[1:]), desc=lay.desc)


def _rest_obligation(spec, impl, placement: Placement, paired: list[_LoopPair]):
    s_fn, why = rest_function(
        spec, [lp.spec for lp in paired], [[k for k, _, _ in lp.pairs] for lp in paired]
    )
    if s_fn is None:
        return why
    i_fn, why = rest_function(
        impl, [lp.impl for lp in paired], [[j for _, j, _ in lp.pairs] for lp in paired]
    )
    if i_fn is None:
        return why
    extra = [lay for lp in paired for _, _, lay in lp.pairs]
    place = Placement(
        placement.num_replicas,
        placement.num_partitions,
        list(placement.args) + extra,
        list(placement.results) + extra,
    )
    s_mod = _normalised(with_main(spec, s_fn, f"{spec.source}, loops cut out"))
    i_mod = _normalised(with_main(impl, i_fn, f"{impl.source}, loops cut out"))
    return "rest", s_mod, i_mod, place


def _body_obligation(spec, impl, n: int, lp: _LoopPair, index: int):
    ins = [(k, j, lay) for k, j, lay in lp.pairs if lp.spec.kinds[k] in INPUT_KINDS]
    outs = [(k, j, lay) for k, j, lay in lp.pairs if lp.spec.kinds[k] in OUTPUT_KINDS]
    fns = []
    for counter in (None, True):
        s_fn = body_function(lp.spec, [k for k, _, _ in ins], [k for k, _, _ in outs], counter)
        i_fn = body_function(lp.impl, [j for _, j, _ in ins], [j for _, j, _ in outs], counter)
        for fn in (s_fn, i_fn):
            if isinstance(fn, str):
                return fn
        fns = [s_fn, i_fn]
        if len(s_fn.args) == len(i_fn.args):
            break
    s_fn, i_fn = fns
    with_counter = len(s_fn.args) > len(ins)

    def layout(k, lay):
        return _layer(lay) if lp.spec.kinds[k] in (STACKED_IN, STACKED_OUT) else lay

    args = [layout(k, lay) for k, _, lay in ins]
    if with_counter:
        args.append(Layout.replicated((), n))
    place = Placement(1, n, args, [layout(k, lay) for k, _, lay in outs])
    what = f"body of loop {index} ({lp.spec.trips} iterations)"
    s_mod = _normalised(with_main(spec, s_fn, f"{spec.source}, {what}"))
    i_mod = _normalised(with_main(impl, i_fn, f"{impl.source}, {what}"))
    return f"loop {index} body", s_mod, i_mod, place


def _normalised(module: Module) -> Module:
    """Nested fixed loops unrolled and calls inlined, as `prepare` leaves a program."""
    return run_pipeline(unroll_static_loops(run_pipeline(module)))


def _combined(reports: list[Report], outputs: int, paired, seconds: float) -> Report:
    rest = reports[0]
    out = Report(EQUIVALENT, outputs=rest.outputs[:outputs])
    for r in reports:
        out.stats.stages += r.stats.stages
        out.stats.proved_by_normal_form += r.stats.proved_by_normal_form
        out.stats.proved_by_z3 += r.stats.proved_by_z3
        out.stats.expansions += r.stats.expansions
        out.stats.cache_hits += r.stats.cache_hits
    out.stats.loops_by_induction = len(paired)
    out.stats.seconds["induction"] = seconds
    trips = ", ".join(str(lp.spec.trips) for lp in paired)
    out.notes.append(
        f"{len(paired)} loop(s) ({trips} iterations) proved by induction: each body proved "
        "once for any iteration, the rest with the loops' results as inputs "
        "(docs/equivalence.md, Loops)"
    )
    return out
