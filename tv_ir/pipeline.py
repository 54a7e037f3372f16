"""The pipeline behind `tv check` and `tv_ir.check`: import, normalise, compare, prove."""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
from collections.abc import Callable
from functools import partial

from tv_ir.ir.importer import load
from tv_ir.ir.program import Module, elements, walk
from tv_ir.prover.boundary_layouts import per_device_evidence
from tv_ir.report.result import EQUIVALENT, NOT_EQUIVALENT, UNKNOWN, Report
from tv_ir.semantics.run_tables import run_scope

from .errors import BadInput, Unsupported
from .limits import (
    OutOfMemoryBudget,
    OutOfTime,
    TooDeep,
    check_time,
    deadline,
    enforced_limits,
    past_deadline,
    refuse_oversized,
    refuse_unaffordable,
    release_freed_memory,
    run_deep,
    run_memory_budget,
    time_left,
    time_limit_reason,
    too_deep_reason,
)
from .prover import machine_load
from .prover.engine import Options, StageProver
from .prover.mesh_transfer import reduced_placement
from .prover.placement import Placement
from .prover.smt import SolverError
from .prover.workers import Relayed, use_workers


def prepare(source, role: str, unroll: bool = True) -> Module:
    """Import, inline calls, unroll fixed-trip-count loops (unless `unroll` is False: loop
    induction reads the loops), merge repeated computations."""
    from tv_ir.passes import run_pipeline

    from .passes.unroll import unroll_static_loops

    if isinstance(source, Module):
        return source
    try:
        module = load(source)
    except BadInput as e:
        raise BadInput(f"{role}: {e}") from None
    check_time()
    module = run_pipeline(module)
    check_time()
    if not unroll:
        return module
    module = unroll_static_loops(module)
    check_time()
    # unrolled loop bodies bring their calls to the top level: inline them too
    return run_pipeline(module)


# seconds past the time limit the real-size replay of a refutation found just before it may
# take (the watchdog steps in at 2 s): a bug found at the limit is reported, not `unknown`
REPLAY_GRACE_S = 1.0


def check_signatures(spec: Module, impl: Module, placement: Placement | None = None) -> None:
    """Same arity and element types; shapes equal, or (distributed) equal to the layouts'."""
    s, i = spec.main, impl.main
    if placement is not None and placement.distributed:
        _check_local_shapes(s, i, placement)
        return
    if len(s.arg_types) != len(i.arg_types):
        raise BadInput(
            f"signatures differ: spec takes {len(s.arg_types)} arguments, impl {len(i.arg_types)}"
        )
    for k, (a, b) in enumerate(zip(s.arg_types, i.arg_types, strict=True)):
        if a != b:
            raise BadInput(f"signatures differ: argument {k} is {a} in spec but {b} in impl")
    if len(s.result_types) != len(i.result_types):
        raise BadInput(
            f"signatures differ: spec returns {len(s.result_types)} results, "
            f"impl {len(i.result_types)}"
        )
    for k, (a, b) in enumerate(zip(s.result_types, i.result_types, strict=True)):
        if a != b:
            raise BadInput(f"signatures differ: result {k} is {a} in spec but {b} in impl")


def _check_local_shapes(s, i, placement: Placement) -> None:
    shard_map = any(op.name == "sdy.manual_computation" for op in i.body.ops)
    for what, stypes, itypes, layouts in (
        ("argument", s.arg_types, i.arg_types, placement.args),
        ("result", s.result_types, i.result_types, placement.results),
    ):
        if len(stypes) != len(itypes):
            raise BadInput(f"signatures differ: spec has {len(stypes)} {what}s, impl {len(itypes)}")
        for k, (a, b, lay) in enumerate(zip(stypes, itypes, layouts, strict=True)):
            if getattr(a, "dtype", None) != getattr(b, "dtype", None):
                raise BadInput(f"signatures differ: {what} {k} is {a} in spec but {b} in impl")
            local = tuple(getattr(b, "shape", ()))
            if local != tuple(lay.tile_shape) and shard_map:  # its boundary is global
                raise BadInput(f"signatures differ: {what} {k} is {a} in spec but {b} in impl")
            if local != tuple(lay.tile_shape):
                raise BadInput(
                    f"impl {what} {k} is {b} per device, but its layout {lay} holds "
                    f"{list(lay.tile_shape)} (missing or wrong mhlo.sharding?)"
                )


def progress_callback(progress) -> Callable[[str], None] | None:
    """`progress=` as users pass it: a callable taking one line, True (lines to stderr),
    or None/False (quiet); anything else is bad input, not a traceback mid-proof."""
    if progress is None or progress is False:
        return None
    if isinstance(progress, Relayed):
        return progress
    if progress is True:
        return Relayed(lambda line: print(line, file=sys.stderr, flush=True))
    if callable(progress):
        return Relayed(progress)  # lines from worker processes too
    raise BadInput(f"progress must be a callable, True or False, not {type(progress).__name__}")


def check(
    spec,
    impl,
    timeout: float = 10.0,
    seed: int = 0,
    progress=None,
    placement=None,
    time_limit: float | None = None,
    memory_limit: float | None = None,
    reduce_shapes: bool = True,
    layouts=None,
    reduce_mesh: bool = True,
    workers: int | None = None,
) -> Report:
    """Prove `impl` equal to `spec` (modules as text, bytes, paths or ir.Module).

    `impl` may be a per-device program: its argument/result layouts come from `placement`,
    else from its own `mhlo.sharding` / XLA SPMD module attributes, the spec's annotations
    (a pre-partition spec), then `layouts` (`tv_ir.prover.boundary_layouts.GivenLayouts`); single
    device when nothing says it is per-device.
    `time_limit` bounds the whole run (import, unrolling, simulation, proof): when it runs
    out the verdict is unknown. `memory_limit` (MB) bounds the process's resident memory,
    polled between steps: going over it makes the verdict unknown (None: most of the memory
    available when the run starts, `limits.run_memory_budget`). `reduce_shapes` proves
    the pair at reduced shapes when every op allows it (docs/equivalence.md, "Shape
    reduction"); False checks the programs at their real sizes. `reduce_mesh` proves a
    shard_map program, or XLA's per-device program of a jit with shardings, on a smaller
    mesh when its structure allows it (docs/equivalence.md, "Mesh reduction"); False
    simulates every device of its mesh. `workers`: processes for
    the check's independent obligations (tv_ir.prover.workers; None: the idle cores once the
    obligations have taken a second, or $TV_WORKERS); the report is one worker's.
    """
    progress = progress_callback(progress)
    with run_scope(), run_memory_budget(memory_limit), use_workers(workers):
        return run_deep(
            _bounded,
            _check,
            time_limit,
            spec,
            impl,
            timeout,
            seed,
            progress,
            placement,
            reduce_shapes,
            layouts,
            True,
            reduce_mesh,
        )


def _bounded(run, time_limit, *args) -> Report:
    """`run(*args)` within the time limit; running out of time, memory or stack depth makes
    the verdict unknown (never a crash, never a pass)."""
    t0 = time.perf_counter()
    machine_load.start_window()  # whether a core is free for a child: measured from here
    with deadline(time_limit):
        try:
            with enforced_limits():
                return run(*args)
        except (OutOfTime, TooDeep, OutOfMemoryBudget) as e:
            reason = str(e)
        except RecursionError:
            reason = too_deep_reason()
        except MemoryError:
            reason = "out of memory"
        except SolverError as e:  # the solver's own failures (smt.py turns them into
            reason = f"z3 failed: {e}"  # unknown outcomes; this is the backstop)
    report = Report(UNKNOWN, reason=reason)
    report.stats.seconds["total"] = time.perf_counter() - t0
    return report


def _check(
    spec,
    impl,
    timeout,
    seed,
    progress,
    placement,
    reduce_shapes,
    layouts,
    induction=True,
    reduce_mesh=True,
    aside=None,
) -> Report:
    """`aside`: a `workers.ChecksBeside` whose child takes this check's concrete
    confirmation too (the caller's checks beside the same proof); else one of its own."""
    from .prover.workers import ChecksBeside

    if aside is None:
        with ChecksBeside() as own:
            return _check(
                spec, impl, timeout, seed, progress, placement, reduce_shapes, layouts,
                induction, reduce_mesh, own,
            )  # fmt: skip
    xla: dict[str, float] = {}
    report = _check_pair(
        spec, impl, timeout, seed, progress, placement, reduce_shapes, layouts, induction,
        reduce_mesh, aside, xla,
    )  # fmt: skip
    report.stats.seconds.update(xla)
    return report


def _check_pair(
    spec, impl, timeout, seed, progress, placement, reduce_shapes, layouts, induction,
    reduce_mesh, aside, xla: dict,
) -> Report:  # fmt: skip
    """`_check` with its `aside`; `xla` gets the seconds of XLA's partitioning, when XLA
    partitioned the pair here (part of the import phase, shown on its own)."""
    t0 = time.perf_counter()
    spec_m = prepare(spec, "spec", unroll=False)
    impl_m = prepare(impl, "impl", unroll=False)
    if placement is None and _pre_partition(spec_m, impl_m):
        # an annotated module (jit with shardings, torch_xla mark_sharding): what runs is
        # XLA's partitioning of it, so that is what is verified
        meshes = impl_m.attrs.get("sdy.meshes")
        impl_m, placement, xla["xla partition"] = _partitioned(impl, spec_m, unroll=False)
        _name_mesh(impl_m, meshes)
    lifted = None
    if placement is None:
        try:
            lifted = _manual_boundary(spec_m, impl_m, layouts)
        except Unsupported as e:
            report = Report(UNKNOWN, unsupported=[e.op] if e.op else [], reason=str(e))
            report.stats.seconds["total"] = time.perf_counter() - t0
            return report
        if lifted is not None:
            spec_m, impl_m, placement = lifted
            # checked at the real sizes and on every device: shape and mesh reduction do
            # not read the lifted spec (one manual computation over a mesh of its own)
            reduce_shapes = reduce_mesh = False
        else:
            placement = _boundary_placement(spec_m, impl_m, layouts)
    check_signatures(spec_m, impl_m, placement)
    from tv_ir.passes import reciprocal_constants

    reciprocal_constants.run(spec_m, impl_m)  # `x * (1/n)` for `x / n` (XLA's folding)
    induction_note = None
    if induction:
        found = _by_induction(spec_m, impl_m, placement, timeout, seed, progress, reduce_shapes)
        if isinstance(found, Report):
            if found.verdict == NOT_EQUIVALENT:
                found = _unless_order_dependent(found, spec_m, impl_m, placement)
            if found.verdict == NOT_EQUIVALENT:
                found = _unless_device_order_lost(found, impl_m)
            found.stats.seconds["total"] = time.perf_counter() - t0
            found.spec_name, found.impl_name = spec_m.source, impl_m.source
            return found
        induction_note = str(found) if found is not None else None
    if reduce_shapes and _has_loops(spec_m, impl_m):
        options = Options(timeout, seed, progress, None)
        found = _by_layer_reduction(spec_m, impl_m, placement, options, reduce_mesh)
        if isinstance(found, Report):
            if found.verdict == NOT_EQUIVALENT:
                found = _unless_order_dependent(found, spec_m, impl_m, placement)
            if found.verdict == NOT_EQUIVALENT:
                found = _unless_device_order_lost(found, impl_m)
            if induction_note:
                found.notes.append(f"loops not proved by induction: {induction_note}")
            found.stats.seconds["total"] = time.perf_counter() - t0
            found.spec_name, found.impl_name = spec_m.source, impl_m.source
            return found
        if found is not None:
            induction_note = f"{induction_note}; {found}" if induction_note else found
    try:
        return _check_unrolled(
            spec_m, impl_m, placement, timeout, seed, progress, reduce_shapes, reduce_mesh,
            aside, t0, induction_note,
        )  # fmt: skip
    except (OutOfTime, OutOfMemoryBudget) as e:
        if not induction_note:
            raise
        # the unrolled check ran out: say why the loops were not proved first
        raise type(e)(f"{e}; loops checked unrolled, not by induction: {induction_note}") from e


def _check_unrolled(
    spec_m, impl_m, placement, timeout, seed, progress, reduce_shapes, reduce_mesh, aside, t0,
    induction_note,
) -> Report:  # fmt: skip
    """The pair checked with its loops unrolled (shape and mesh reduction, the proof, its
    confirmation, replay), `induction_note` saying why the loops were not proved as loops."""
    spec_m, impl_m = _unrolled(spec_m), _unrolled(impl_m)
    real = (spec_m, impl_m, placement)
    t_plan = time.perf_counter()
    plan, mesh_note = _mesh_plan(real, reduce_mesh)
    t_plan = time.perf_counter() - t_plan
    reduction, report, t_import, mesh = _reduce_and_prove(
        real, reduce_shapes, True, t0, Options(timeout, seed, progress, None), plan, aside=aside
    )
    limited = report.reason.startswith(("time limit of ", "memory limit of "))
    generalised = reduction is not None and reduction.generalised and not limited
    if generalised and report.verdict != EQUIVALENT:
        # tables or scales stood for any values: a difference may need their own values
        note = f"with {reduction.standing()} standing for any values the verdict was "
        again = "the tables" if reduction.standing() == "constant tables" else "them"
        note += f"{report.verdict}; checked again with {again} kept"
        generalised = (reduction, report)
        walk_below = LOCATE_GROWTH * reduction.reduced_elements if reduction.reduced else None
        reduction, report, _, mesh = _reduce_and_prove(
            real, True, False, t0, Options(timeout, seed, progress, None), plan, walk_below
        )
        report.notes.append(note)
        _locate_on_generalised(report, *generalised)
    whole_mesh = real
    if mesh is not None:  # the real sizes on the reduced mesh: what replays and confirms
        real = (mesh.spec, mesh.impl, reduced_placement(mesh))
    if report.verdict == UNKNOWN and report.reason.startswith("time limit of "):
        # the prover was given what import left of the limit: name the user's limit
        report.reason = time_limit_reason(report.reason.split(" reached", 1)[-1].strip())
    report.stats.seconds["import"] = t_import
    if reduction is not None:
        t1 = time.perf_counter()
        report.reduction = reduction.to_json()
        if reduction.failed:
            report.notes.append(reduction.failed)
        if reduction.reduced and report.verdict == NOT_EQUIVALENT:
            from .prover.real_size import replay_at_real_size

            with past_deadline(REPLAY_GRACE_S):  # a refutation found at the limit is replayed
                stands = replay_at_real_size(report, *real, reduction, seed=seed)
            if isinstance(stands, str):  # too large to run, and a larger reduction agrees
                report = Report(UNKNOWN, stats=report.stats, reason=stands)
                report.reduction = reduction.to_json()
            elif not stands:  # the real programs fit: check them as they are
                options = Options(timeout, seed, progress, time_left())
                report = _prove(real[0], real[1], real[2], options)
                report.notes.append(
                    "a counterexample at reduced shapes did not carry over to the real sizes; "
                    "the programs were checked at their real sizes"
                )
        elif reduction.reduced and report.verdict == EQUIVALENT:
            from .prover.real_size import confirm_proof

            agreed = aside.result("confirm") if aside.confirms is reduction else None
            report = confirm_proof(report, reduction, *real, seed=seed, agreed=agreed)
            report.reduction = reduction.to_json()
        report.stats.seconds["confirm"] = time.perf_counter() - t1
    if report.verdict == NOT_EQUIVALENT:
        report = _unless_order_dependent(report, *real)
    if report.verdict == NOT_EQUIVALENT:
        report = _unless_device_order_lost(report, whole_mesh[1])
    if mesh is not None:
        from .prover.mesh_transfer import NOT_RUN, confirm_on_real_mesh, name_real_device

        t1 = time.perf_counter()
        if report.verdict == NOT_EQUIVALENT:
            name_real_device(report, mesh)
        found = larger = NOT_RUN
        if aside.real_mesh is whole_mesh and report.verdict in (EQUIVALENT, NOT_EQUIVALENT):
            found = aside.result(REAL_MESH)
        if aside.larger_mesh is whole_mesh and report.verdict in (EQUIVALENT, NOT_EQUIVALENT):
            larger = aside.result(LARGER_MESH)
        if reduction is not None and reduction.reduced:
            proved_on = (reduction.spec, reduction.impl, reduction.placement)
        else:
            proved_on = (mesh.spec, mesh.impl, reduced_placement(mesh))
        report = confirm_on_real_mesh(
            report,
            mesh,
            *whole_mesh,
            seed=seed,
            found=found,
            larger=larger,
            reduced=proved_on,
        )
        if report.verdict == UNKNOWN and report.reason.startswith("mesh reduction"):
            options = Options(timeout, seed, progress, time_left())
            notes = report.notes
            report = _prove(*whole_mesh, options)  # check every device, as given
            report.notes += notes
        report.mesh_reduction = mesh.to_json()
        report.stats.seconds["mesh plan"] = t_plan
        report.stats.seconds["mesh confirm"] = time.perf_counter() - t1
    if mesh_note:
        report.notes.append(mesh_note)
    if induction_note:
        report.notes.append(f"loops checked unrolled, not by induction: {induction_note}")
    report.stats.seconds["total"] = time.perf_counter() - t0
    report.spec_name = spec_m.source
    report.impl_name = impl_m.source
    return report


def _locate_on_generalised(report: Report, reduction, first: Report) -> None:
    """A refutation with the tables kept whose diverging op was not found (the walk ran out
    of time or memory on the larger pair, or was not made: LOCATE_GROWTH) gets the op where
    the pair with tables standing for any values parts ways on its own counterexample: the
    same ops and source lines, a smaller pair. Said in a note: that difference may need
    table values the real programs do not hold, so the op is a lead, not a proof."""
    loc = report.location
    if report.verdict != NOT_EQUIVALENT or (loc is not None and loc.impl is not None):
        return
    if first.verdict != NOT_EQUIVALENT or first.counterexample is None or not reduction.reduced:
        return
    from .prover.localise import refutation

    why = loc.note if loc is not None else "not searched"
    inputs = list(first.counterexample.inputs.values())
    try:
        found = refutation(reduction.spec, reduction.impl, reduction.placement, inputs)
    except (OutOfMemoryBudget, OutOfTime) as e:
        # the refutation stands (replayed with the tables kept); only where is not known
        report.notes.append(
            f"the diverging op was looked for on the pair with the constant tables standing "
            f"for any values too, and the walk stopped: {e} (with the tables kept: {why})"
        )
        return
    finally:
        # the walk's index (gigabytes at 56 devices: the 405B-shaped step on 7,168) is
        # garbage now, but still resident: the next check of the memory limit would stop
        # the run for it
        release_freed_memory()
    if found is None or found[1] is None or found[1].impl is None:
        note = found[1].note if found is not None and found[1] is not None else ""
        report.notes.append(
            "the diverging op was looked for on the pair with the constant tables standing "
            f"for any values too, and not found there either{': ' + note if note else ''} "
            f"(with the tables kept: {why})"
        )
        return
    report.location = found[1]
    report.notes.append(
        "the diverging op was found on the pair with the constant tables standing for any "
        f"values, on its counterexample (same ops and source lines); with the tables kept: {why}"
    )


def _has_loops(*modules: Module) -> bool:
    return any(op.name == "stablehlo.while" for m in modules for op in walk(m.main.body))


def _by_layer_reduction(spec: Module, impl: Module, placement, options: Options, reduce_mesh: bool):
    """The pair with its layer loops (scans over stacked layers) at fewer layers: the layer
    count is a dimension class of shape reduction (passes/shape_reduction/layer_stacks.py).
    The pair at its real sizes with only the layer counts reduced is unrolled and checked as
    any pair is (shape and mesh reduction, confirmation, replay). A proof stands only if the
    pair also agrees concretely at the real layer count and at a larger one (every other
    class reduced); a refutation only if it replays at the real layer count (blown up, or on
    random inputs with the other classes reduced when the real programs are too large to
    run). Else why not (a string: the caller checks the programs unrolled, as before), or
    None when no layer loop shrank."""
    from tv_ir.passes.shape_reduction import reduce_pair

    from .passes.inline_calls import run_in_loops
    from .prover.real_size import REPLAY_LIMIT, differs_on_random_inputs, replay_blown_up
    from .prover.workers import ChecksBeside

    t0 = time.perf_counter()
    try:
        spec, impl = run_in_loops(spec), run_in_loops(impl)
        red = reduce_pair(spec, impl, placement, layers_only=True)
        if red.fewer_layers is None:
            return None
        f_spec, f_impl, f_place = red.fewer_layers.build()
        f_spec, f_impl = _unrolled(f_spec), _unrolled(f_impl)
    except (OutOfTime, TooDeep, OutOfMemoryBudget, MemoryError, RecursionError):
        raise
    except Exception as e:  # a program the layer reduction misreads: unrolled, as before
        return f"layer reduction: {type(e).__name__}: {e}"
    t_layers = time.perf_counter() - t0
    # the concrete checks at the real layer count do not depend on the proof: with an idle
    # core they run beside it in a forked child (a proof with a layer singled out is not
    # used, so they are not made for it)
    with ChecksBeside() as checks:
        if not red.singled_out:
            plan = _LayerCheckMesh((f_spec, f_impl, f_place) if reduce_mesh else None)
            parts = [partial(_layer_check, w, options.seed, plan) for w in red.layer_witnesses]
            checks.add_parts("layers", parts, _first_reason)
            checks.start()  # begun now: the pair's reduction and its checks come later
        report = _check(
            f_spec,
            f_impl,
            options.timeout,
            options.seed,
            options.progress,
            f_place,
            True,
            None,
            induction=False,
            reduce_mesh=reduce_mesh,
            aside=checks,
        )
        t1 = time.perf_counter()
        layers = ", ".join(f"{w} {n} -> {k}" for w, n, k in red.layer_loops if k < n)
        if report.verdict == EQUIVALENT and red.singled_out:
            # the layers are not one function repeated: fewer of them say nothing of N
            return f"proved at fewer layers, but not used: {'; '.join(red.singled_out)}"
        if report.verdict == EQUIVALENT:
            why_not = checks.result("layers")
            if why_not is not None:
                return why_not
            report.notes.append(
                f"layer loops proved at fewer layers ({layers}); checked concretely at the "
                "real layer count and a larger one too (other classes reduced)"
            )
    if report.verdict == NOT_EQUIVALENT and report.counterexample is not None:
        if elements(spec) + elements(impl) <= REPLAY_LIMIT:
            found = replay_blown_up(report, spec, impl, placement, f_spec.main.arg_types)
            if found is None:
                return "refuted at fewer layers, but not at the real layer count"
            report.counterexample, _, report.outputs = found
            report.notes.append(
                f"refuted with the layer loops at fewer layers ({layers}); the counterexample "
                "replayed at the real layer count (each layer's inputs repeated over the "
                "layers it stands for)"
            )
        else:
            try:
                w_spec, w_impl, w_place = red.layer_witnesses[0].build()
            except Exception as e:  # shapes an op forbids: this check cannot be made
                return f"refuted at fewer layers, but at the real layer count: {e}"
            if not differs_on_random_inputs(
                w_spec, w_impl, w_place, options.seed, outputs_first=False
            ):
                return "refuted at fewer layers, but at the real layer count the programs agree"
            report.notes.append(
                f"refuted with the layer loops at fewer layers ({layers}), counterexample "
                "replayed there; the real programs are too large to run, and at the real layer "
                "count (other classes reduced) they differ too"
            )
    elif report.verdict != EQUIVALENT:
        return f"at fewer layers the verdict was {report.verdict} ({report.reason})"
    report.reduction = {**(report.reduction or {}), "layer_loops": red.to_json()["layer_loops"]}
    report.stats.seconds["layers"] = t_layers
    report.stats.seconds["layers confirm"] = time.perf_counter() - t1
    return report


class _LayerCheckMesh:
    """The mesh the layer checks run on: the one the pair at fewer layers reduces to (made
    once per process, in whichever process makes a check first), or the real one."""

    def __init__(self, fewer):
        self.fewer = fewer
        self.plan = None

    def on_it(self, spec: Module, impl: Module, placement):
        """(spec, impl, placement) on the reduced mesh, or as given when the mesh does not
        shrink or a permute runs in a loop (its reach is the trip count's, which the plan
        of the unrolled pair at fewer layers did not see)."""
        if self.fewer is None or _permutes_in_loops(impl):
            return spec, impl, placement
        from .prover.mesh_transfer import on_reduced_mesh, plan

        if self.plan is None:
            self.plan = plan(*self.fewer)
        if not self.plan.reduced:
            return spec, impl, placement
        return on_reduced_mesh(self.plan, spec, impl, placement) or (spec, impl, placement)


def _permutes_in_loops(m: Module) -> bool:
    for op in walk(m.main.body):
        if op.name == "stablehlo.while" and any(
            inner.name == "stablehlo.collective_permute"
            for r in op.regions
            for inner in walk(r.block)
        ):
            return True
    return False


def _layer_check(w, seed: int, mesh: _LayerCheckMesh | None = None) -> str | None:
    """One of the concrete checks a proof at fewer layers needs (docs/equivalence.md, "Why
    it is not enough"): the pair at the real layer count, or at a larger one, every other
    class reduced (`w`), agrees on random inputs (on the mesh the pair at fewer layers was
    proved on). None when it does, else why the proof is not used."""
    from .prover.real_size import LAYER_WITNESS_LIMIT, differs_on_random_inputs

    try:
        w_spec, w_impl, w_place = w.build()
        if mesh is not None:
            w_spec, w_impl, w_place = mesh.on_it(w_spec, w_impl, w_place)
    except Exception as e:  # shapes an op forbids: this check cannot be made
        return f"proved at fewer layers, but {w.name} at {w.larger}: {e}"
    if elements(w_spec) + elements(w_impl) > LAYER_WITNESS_LIMIT:
        return f"proved at fewer layers, but with {w.name} at {w.larger} too large to run"
    # one run: random inputs show a difference of these small programs, or none is there
    # to show (the real layer count unrolled costs what depth costs)
    if differs_on_random_inputs(w_spec, w_impl, w_place, seed, runs=1):
        return (
            f"proved with {w.name} at {w.reduced}, but at {w.larger} (other classes "
            "reduced) the programs differ"
        )
    return None


def _first_reason(reasons: list) -> str | None:
    """The first of the layer checks' reasons not to use the proof (None: none)."""
    return next((r for r in reasons if r is not None), None)


def _unrolled(module: Module) -> Module:
    """`module` with its fixed-trip loops unrolled (what `prepare` does by default)."""
    from tv_ir.passes import run_pipeline

    from .passes import stack_writes
    from .passes.unroll import unroll_static_loops

    if not any(op.name == "stablehlo.while" for op in walk(module.main.body)):
        return module
    module = unroll_static_loops(module)
    check_time()
    module = run_pipeline(module)  # unrolled loop bodies bring their calls to the top level
    return stack_writes.run(module)  # a stack written layer by layer: no copy per layer


def _by_induction(spec, impl, placement, timeout, seed, progress, reduce_shapes):
    """The pair proved through its loops (tv_ir.prover.loop_induction), else why not (None:
    no loops to prove that way). Never a refutation: failures fall back to unrolling."""
    from .passes.loop_cut import loop_parts, top_level_loops
    from .passes.reroll import run as rerolled
    from .passes.shard_map_program import per_device_program
    from .prover.loop_induction import NotProved, prove_loops_by_induction

    # the programs as given: a refutation is replayed on them, not only on their rewrites
    given = (spec, impl, placement)
    # a Python-for stack arrives unrolled: its isomorphic blocks rerolled into loops (the
    # implementation's preferring the spec's trip counts)
    try:
        spec = rerolled(spec)
        trips = {getattr(loop_parts(spec, op), "trips", None) for op in top_level_loops(spec)}
    except (OutOfTime, TooDeep, OutOfMemoryBudget, MemoryError, RecursionError):
        raise
    except Exception as e:  # a program the rerolling misreads: unroll, as before
        return f"rerolling: {type(e).__name__}: {e}"
    trips.discard(None)
    if not top_level_loops(spec):
        return None
    if not top_level_loops(impl):  # a shard_map's loops are in its body
        flat = per_device_program(impl)
        if flat is not None:
            impl = flat.module
            placement = Placement(1, flat.num_devices, flat.args, flat.results)
            check_signatures(spec, impl, placement)
        try:
            impl = rerolled(impl, trips)
        except (OutOfTime, TooDeep, OutOfMemoryBudget, MemoryError, RecursionError):
            raise
        except Exception as e:
            return f"rerolling: {type(e).__name__}: {e}"
        if not top_level_loops(impl):
            return None

    def check_pair(s, i, place):
        return _check(s, i, timeout, seed, progress, place, reduce_shapes, None, induction=False)

    try:
        found = prove_loops_by_induction(spec, impl, placement, check_pair, seed)
        if isinstance(found, NotProved) and found.iterations is not None:
            refuted = _refuted_in_fewer_iterations(spec, impl, placement, found, check_pair, given)
            return refuted or found
        return found
    except (OutOfTime, TooDeep, OutOfMemoryBudget, MemoryError, RecursionError):
        raise
    except Exception as e:  # a program the induction step misreads: unroll, as before
        return f"{type(e).__name__}: {e}"


def _refuted_in_fewer_iterations(spec, impl, placement, failed, check_pair, given) -> Report | None:
    """A loop body was refuted at some iteration: check the programs with their loops cut to
    the iterations that reach it (unrolled), and replay that check's counterexample on the
    whole programs as given (`given`: spec, impl, placement before any rerolling or
    flattening), loops run in full. A difference there is the refutation (located where
    the shortened programs part ways: the same ops, the same source lines); None otherwise
    (the caller then checks the programs unrolled in full)."""
    from .prover.localise import refutation
    from .prover.loop_induction import loops_cut

    k = failed.iterations
    short = check_pair(
        loops_cut(spec, failed.loops[0], k), loops_cut(impl, failed.loops[1], k), placement
    )
    if short.verdict != NOT_EQUIVALENT or short.counterexample is None:
        return None
    try:
        # located where the shortened programs part ways (below): only the difference here
        found = refutation(*given, list(short.counterexample.inputs.values()), locate=False)
    except (OutOfTime, TooDeep, OutOfMemoryBudget, MemoryError, RecursionError):
        raise
    except Exception:  # e.g. a counterexample that stayed at reduced shapes
        return None
    if found is None:
        return None
    counterexample, _, outputs = found
    report = Report(
        NOT_EQUIVALENT,
        outputs=outputs,
        counterexample=counterexample,
        location=short.location,
        stats=short.stats,
        notes=list(short.notes),
    )
    report.notes.append(
        f"{failed.reason}; the programs with their loops cut to {k} iteration(s) differ, "
        "located there; the counterexample is replayed on the whole programs"
    )
    return report


def _mesh_plan(real, reduce_mesh: bool):
    """(the real pair on a reduced mesh (`passes/mesh_reduction`) or None when no axis
    shrinks, and then why not when the mesh has an axis that could: a note for the report,
    so a user whose 8,192 devices are all simulated learns what kept them)."""
    if not reduce_mesh:
        return None, None
    from .passes.mesh_reduction import NO_MESH, NOT_A_SHARD_MAP, NOT_DISTRIBUTED
    from .prover.mesh_transfer import plan

    mesh = plan(*real)
    if mesh.reduced:
        return mesh, None
    if mesh.failed in (NOT_A_SHARD_MAP, NOT_DISTRIBUTED, NO_MESH):
        return None, None  # nothing a user expects reduced
    if mesh.failed:
        return None, f"every device simulated: mesh reduction not applied ({mesh.failed})"
    kept = [str(a) for a in mesh.axes if a.kept and a.real > 2]
    if not kept:
        return None, None
    return None, f"every device simulated; mesh reduction: {'; '.join(kept)}"


def _reduce_and_prove(
    real,
    reduce_shapes: bool,
    tables: bool,
    t0: float,
    options: Options,
    mesh=None,
    walk_below: int | None = None,
    aside=None,
):
    """(reduction or None, report at the reduced shapes, seconds from t0 to the proof, the
    mesh reduction used or None). Shapes shrink first, on the real mesh; the shape-reduced
    pair then shrinks its mesh to `mesh`'s sizes (constants unchanged both times). A reduced
    pair of `walk_below` elements or more is not walked to localise a refutation (the
    caller looks on a smaller pair)."""
    spec_m, impl_m, placement = real
    reduction = None
    if reduce_shapes:
        from tv_ir.passes.shape_reduction import reduce_pair

        reduction = reduce_pair(spec_m, impl_m, placement, tables)
        if reduction.reduced:
            spec_m, impl_m, placement = reduction.spec, reduction.impl, reduction.placement
        elif reduction.failed and options.progress:
            options.progress(reduction.failed)
    if mesh is not None:
        from .prover.mesh_transfer import on_reduced_mesh

        small = on_reduced_mesh(mesh, spec_m, impl_m, placement)
        if small is not None:
            spec_m, impl_m, placement = small
            if reduction is not None and reduction.reduced:
                reduction.spec, reduction.impl, reduction.placement = small
                _witnesses_on_reduced_mesh(reduction, mesh)
                # what confirms the proof at the real sizes is the real pair on this mesh
                reduction.run_elements = elements(mesh.spec) + elements(mesh.impl)
        elif _simulated(mesh.spec, mesh.impl, mesh.reduced_mesh.devices) < _simulated(
            spec_m, impl_m, placement.num_devices
        ):
            # shape reduction took what the mesh needed to shrink (offsets of one block):
            # the real shapes on the reduced mesh cost less than the reduced ones on all
            reduction = None
            spec_m, impl_m, placement = mesh.spec, mesh.impl, reduced_placement(mesh)
        else:
            mesh = None
    if spec_m is not real[0]:
        # the rewritten pair: ops nothing reads are not simulated (a broadcast no class
        # ties to the batch keeps its real batch through shape and mesh reduction)
        from .passes import dce

        spec_m, impl_m = dce.run(spec_m), dce.run(impl_m)
    for role, m in (("spec", spec_m), ("impl", impl_m)):
        try:  # tv evaluates what it checks on concrete arrays: they must fit
            refuse_oversized(m, m.source)
        except BadInput as e:
            raise BadInput(f"{role}: {e}") from None
    refuse_unaffordable(_simulation_mb(spec_m, impl_m, placement), _simulation_what(reduction))
    if aside is not None:
        worth_it = _worth_a_child(spec_m, impl_m)
        if reduction is not None and reduction.reduced and worth_it:
            _confirm_beside(aside, reduction, mesh, real, options.seed)
        if mesh is not None and worth_it:
            _real_mesh_beside(aside, real, mesh, options.seed)
        aside.start()
    t_import = time.perf_counter() - t0
    left = time_left()  # what import left of the time limit is the prover's
    if left is not None and left <= 0:
        raise OutOfTime(time_limit_reason("while importing"))
    options = dataclasses.replace(options, time_limit=left)
    too_large = walk_below is not None and reduction is not None and reduction.reduced
    too_large = too_large and reduction.reduced_elements >= walk_below
    if reduction is not None and (reduction.generalised or too_large):
        # a verdict other than `equivalent` is checked again with the tables kept (`_check`):
        # a refutation here is replayed, but where it parts ways would be thrown away; or the
        # pair with tables kept is too large to walk (looked for on the other, `_check`)
        from .prover.localise import without_location

        if reduction.symbol_uses and _scales_matter(spec_m, impl_m, placement, options.seed):
            why = "the reduced programs differ with their scales at their own values"
            return reduction, Report(UNKNOWN, reason=why), t_import, mesh
        with without_location():
            return reduction, _prove(spec_m, impl_m, placement, options), t_import, mesh
    return reduction, _prove(spec_m, impl_m, placement, options), t_import, mesh


def _scales_matter(spec: Module, impl: Module, placement, seed: int) -> bool:
    """Do the reduced programs, their scales standing for symbols read at their own values,
    differ on a random input? A proof for every value of the scales would then fail, and
    mostly not fast (no cut-point matches past the first difference): the caller checks
    the pair with the scales' classes kept instead."""
    from .prover.real_size import differs_on_random_inputs

    return differs_on_random_inputs(spec, impl, placement, seed, runs=1)


def _confirm_beside(aside, reduction, mesh, real, seed: int) -> None:
    """The concrete confirmation of a proof at `reduction`'s shapes (`confirm_proof`: the
    real sizes, or each class larger) does not depend on the proof: it joins the checks
    computed beside it. On the pair `_check` confirms on (the real sizes on the reduced
    mesh when the mesh shrinks)."""
    from .prover.real_size import agreement_of, agreement_parts

    if aside.confirms is not None:
        return  # one confirmation beside the proof (the first reduction's)
    if mesh is not None:
        real = (mesh.spec, mesh.impl, reduced_placement(mesh))
    aside.confirms = reduction
    parts = agreement_parts(reduction, *real, seed=seed)
    aside.add_parts("confirm", parts, lambda outcomes: agreement_of(reduction, outcomes))


REAL_MESH = "real mesh"  # the check beside the proof that runs the real pair on every device
LARGER_MESH = "larger mesh"  # the one that runs it on a larger reduced mesh instead


def _real_mesh_beside(aside, real, mesh, seed: int) -> None:
    """The run of the real pair on every device of the real mesh (`confirm_on_real_mesh`'s,
    when it fits), or on a larger reduced mesh when it does not, does not depend on the proof
    on the reduced mesh: it joins the checks computed beside it."""
    from .prover.mesh_transfer import (
        differs_on_larger_mesh,
        differs_on_real_mesh,
        runs_on_real_mesh,
    )

    if aside.real_mesh is None and runs_on_real_mesh(*real):
        aside.real_mesh = real
        aside.add(REAL_MESH, lambda: differs_on_real_mesh(*real, seed=seed))
    elif aside.larger_mesh is None and not runs_on_real_mesh(*real):
        aside.larger_mesh = real
        aside.add(LARGER_MESH, lambda: differs_on_larger_mesh(mesh, *real, seed=seed))


# a proof of fewer top-level ops than this takes about what a child costs (a fork, its
# answer): its confirmation is made after it, in the same process
BESIDE_MIN_OPS = 1000


def _worth_a_child(spec: Module, impl: Module) -> bool:
    from tv_ir.ir.program import walk

    ops = itertools.chain(walk(spec.main.body), walk(impl.main.body))
    return next(itertools.islice(ops, max(BESIDE_MIN_OPS - 1, 0), None), None) is not None


# a pair with its constant tables kept more than this many times larger than with them
# standing for any values is not walked for the diverging op (its walk would hold an index
# of every tile of every value: the 405B-shaped step at 126 layers, 17.5 million elements
# against 0.85 million, ran out of memory there); the smaller pair's walk names it
LOCATE_GROWTH = 10


def _simulated(spec: Module, impl: Module, devices: int) -> int:
    """Elements a simulation of the pair evaluates: the spec once, the impl per device."""
    from tv_ir.ir.program import elements

    return elements(spec) + devices * elements(impl)


def _witnesses_on_reduced_mesh(reduction, mesh) -> None:
    """Shape reduction's witness pairs (one class larger) run on the reduced mesh too."""
    from .prover.mesh_transfer import on_reduced_mesh

    seen: set[int] = set()
    for w in [m for g in reduction.witnesses for m in [g, *g.members]]:
        if id(w) in seen:
            continue
        seen.add(id(w))

        def build(real_build=w.build):
            pair = real_build()
            return on_reduced_mesh(mesh, *pair) or pair

        w.build = build


def _simulation_mb(spec: Module, impl: Module, placement) -> float:
    """What simulating the pair holds at once: every value of the spec and of each device's
    implementation, in float64, for each simulation run."""
    from tv_ir.ir.program import elements

    from .prover.engine import SIM_RUNS

    devices = placement.num_devices if placement is not None else 1
    return SIM_RUNS * 8 * (elements(spec) + devices * elements(impl)) / 2**20


def _simulation_what(reduction) -> str:
    if reduction is None or not reduction.reduced:
        return "simulating the programs at their real sizes"
    kept = [c for c in reduction.classes if c.kept and c.real > 1]
    if not kept:
        return "simulating the programs at their reduced sizes"
    return f"simulating the programs with {kept[0]} and {len(kept) - 1} more kept at real size"


def _unless_device_order_lost(report: Report, impl: Module) -> Report:
    """A refutation of a module whose collectives' device order jaxlib's conversion may have
    dropped (`boundary_layouts.lost_device_order`) may be the conversion's difference, not
    XLA's: unknown, saying so (the issue's standard: a refutation is a real miscompile)."""
    from tv_ir.prover.boundary_layouts import lost_device_order

    why = lost_device_order(impl)
    if why is None:
        return report
    where = report.counterexample.what()
    return _unknown_instead(report, f"the programs differ (on {where}), but {why}")


def _unknown_instead(report: Report, reason: str) -> Report:
    """`unknown` for `reason` in place of a refutation that does not stand, keeping the
    report's stats, reduction, notes and names."""
    out = Report(UNKNOWN, reason=reason)
    out.stats, out.reduction, out.notes = report.stats, report.reduction, list(report.notes)
    out.spec_name, out.impl_name = report.spec_name, report.impl_name
    return out


def _unless_order_dependent(report: Report, spec: Module, impl: Module, placement) -> Report:
    """A refutation where a reduction's body is not commutative or associative may be a
    difference of order, which XLA is free to choose: unknown
    (`tv_ir.semantics.reduction_order`), unless on the counterexample every such reduction
    gives one result whatever the order (then the difference is not one of order)."""
    from tv_ir.semantics.reduction_order import order_dependent_reductions

    dependent = [order_dependent_reductions(spec), order_dependent_reductions(impl)]
    if not any(dependent):
        return report
    c = report.counterexample
    if c is not None and c.hang is not None:
        return report  # a hang is no matter of the order values are combined in
    found = _order_dependent_at(dependent, spec, impl, placement, c)
    if not found:
        report.notes.append(
            "a reduction here has a body that is not commutative or associative, but on the "
            "counterexample each of its results is the same in every order: the difference "
            "is not one of order"
        )
        return report
    out = _unknown_instead(
        report,
        f"the programs differ, but {found[0]}: the order XLA combines elements in is its "
        "choice, so the difference may be one of order",
    )
    if c is not None:
        out.notes.append(
            f"not a refutation: output {c.output} at {list(c.index)} differs "
            f"(spec {c.expected}, impl {c.actual}); the order of reduction may explain it"
        )
    return out


def _order_dependent_at(dependent: list, spec: Module, impl: Module, placement, c) -> list[str]:
    """Of the order-dependent reductions of spec and impl (`dependent`: (op, description)
    lists, one per program), the descriptions of those the counterexample `c` does not show
    order-free (all of them when it cannot be run: no counterexample, or not of these
    programs)."""
    from tv_ir.prover.simulate import run_traced, run_traced_devices
    from tv_ir.semantics.liveness import live_results
    from tv_ir.semantics.reduction_order import order_free

    everything = [what for found in dependent for _, what in found]
    if c is None:
        return everything
    inputs = list(c.inputs.values())
    try:
        spec_run = run_traced(spec, inputs)
        impl_run = run_traced_devices(
            impl, placement.shard_inputs(inputs), placement.num_replicas, placement.num_partitions
        )
        values = [
            lambda v: [spec_run.values[v.id]] if v.id in spec_run.values else None,
            lambda v: impl_run.values.get(v.id),
        ]
        # where each top-level op's results reach the differing output, per device: a
        # reduction thrown away on a device has no order to choose there
        live = [
            live_results(m.main.body, {c.output}, value_of, n)
            for m, value_of, n in zip((spec, impl), values, (1, placement.num_devices), strict=True)
        ]
        return [
            what
            for module, found, value_of, used in zip(
                (spec, impl), dependent, values, live, strict=True
            )
            for op, what in found
            if not order_free(module, op, value_of, used.get(id(op)))
        ]
    except Exception:  # noqa: BLE001 - out of time or memory, inputs not of these programs
        return everything


def _boundary_placement(spec: Module, impl: Module, layouts) -> Placement:
    """Where `impl`'s arguments and results live (`tv_ir.prover.boundary_layouts`); a program that
    is not per-device runs on one device, a shard_map module on its mesh."""
    from tv_ir.prover.boundary_layouts import boundary_placement, says_per_device

    if says_per_device(spec, impl, layouts):
        return boundary_placement(spec, impl, layouts)
    return Placement.from_module(spec.main, impl)


def _manual_boundary(spec: Module, impl: Module, layouts):
    """(spec, impl, placement) lifted to global values when a boundary value of a per-device
    `impl` is manual, or the spec holds GSPMD manual regions (`@SPMDFullToShardShape`), which
    only run on devices (`tv_ir.prover.manual_boundary`); else None."""
    from tv_ir.prover.boundary_layouts import boundary_shardings, says_per_device
    from tv_ir.prover.manual_boundary import has_gspmd_regions, is_manual, lift_manual_boundary

    if not says_per_device(spec, impl, layouts):
        return None
    args, results, n = boundary_shardings(spec, impl, layouts)
    if not any(is_manual(s) for s in args + results) and not has_gspmd_regions(spec):
        return None
    return lift_manual_boundary(spec, impl, args, results, n)


def _prove(spec: Module, impl: Module, placement, options: Options) -> Report:
    try:
        return StageProver(spec, impl, options, placement).run()
    except Unsupported as e:
        return Report(UNKNOWN, unsupported=[e.op] if e.op else [], reason=str(e))


def _pre_partition(spec: Module, impl: Module) -> bool:
    """Global shapes, several partitions, sharding annotations on the arguments, and no sign
    of a per-device program (`per_device_evidence`)."""
    n = int(impl.attrs.get("mhlo.num_partitions", 1) or 1)
    if n <= 1 or spec.main.arg_types != impl.main.arg_types:
        return False
    if any(op.name == "sdy.manual_computation" for op in impl.main.body.ops):
        return False
    if not any(("sdy.sharding" in a or "mhlo.sharding" in a) for a in impl.main.arg_attrs):
        return False
    return per_device_evidence(spec, impl) is None


def _name_mesh(per_device: Module, meshes) -> None:
    """Give XLA's per-device program the annotated module's Shardy mesh (which it loses), so
    reports can name a device's mesh coordinates (device = partition id)."""
    if meshes and not per_device.attrs.get("sdy.meshes"):
        per_device.attrs["sdy.meshes"] = dict(meshes)


def _partitioned(impl, spec_m: Module, unroll: bool = True):
    from tv_ir.ir.importer import read_source
    from tv_ir.xla.partitioner import partition

    if hasattr(impl, "operation"):
        text, name = impl.operation.get_asm(enable_debug_info=True), "<ir.Module>"
    else:
        text, name = read_source(impl)
        if isinstance(text, bytes):
            raise BadInput(f"{name}: pass annotated modules as StableHLO text")
        if text.lstrip().startswith("HloModule"):  # XLA takes StableHLO: convert it
            from tv_ir.ir.importer import parse_mlir

            text = parse_mlir(text)[0].operation.get_asm(enable_debug_info=True)
    parted = partition(text)
    impl_m = prepare(parted.per_device_hlo, "partitioned impl", unroll)
    impl_m.source = f"XLA's SPMD partitioning of {name} ({parted.num_partitions} devices)"
    placement = Placement.from_shardings(
        spec_m.main, parted.arg_shardings, parted.out_shardings, parted.num_partitions
    )
    return impl_m, placement, parted.compile_seconds


# the options users pass through the front ends' `verify`: `partition_and_check`'s (a
# program XLA partitions here), and `check`'s, which adds the mesh reduction of shard_map
# programs
PARTITION_OPTIONS = (
    "timeout",
    "seed",
    "progress",
    "time_limit",
    "memory_limit",
    "reduce_shapes",
    "workers",
    "reduce_mesh",
)
CHECK_OPTIONS = PARTITION_OPTIONS


def partition_and_check(
    module,
    timeout: float = 10.0,
    seed: int = 0,
    progress=None,
    time_limit: float | None = None,
    memory_limit: float | None = None,
    reduce_shapes: bool = True,
    workers: int | None = None,
    reduce_mesh: bool = True,
) -> Report:
    """`tv partition`: run XLA's SPMD partitioner on an annotated module and prove its
    per-device output equal to the module's own (single-device) semantics. XLA partitions
    the module at its real sizes and on its real mesh; shape reduction then shrinks the
    partitioned program, and mesh reduction its mesh where the program is a template."""
    progress = progress_callback(progress)
    with run_scope(), run_memory_budget(memory_limit), use_workers(workers):
        return run_deep(
            _bounded,
            _partition_and_check,
            time_limit,
            module,
            timeout,
            seed,
            progress,
            time_limit,
            reduce_shapes,
            reduce_mesh,
        )


def _partition_and_check(
    module, timeout, seed, progress, time_limit, reduce_shapes, reduce_mesh
) -> Report:
    from tv_ir.ir.importer import read_source
    from tv_ir.xla.partitioner import partition

    data, name = read_source(module)
    if isinstance(data, bytes):
        raise BadInput(f"{name}: tv partition takes StableHLO text")
    spec_m = prepare(data, "module", unroll=False)
    parted = partition(data)
    impl_m = prepare(parted.per_device_hlo, "partitioned module", unroll=False)
    _name_mesh(impl_m, spec_m.attrs.get("sdy.meshes"))
    placement = Placement.from_shardings(
        spec_m.main, parted.arg_shardings, parted.out_shardings, parted.num_partitions
    )
    report = check(
        spec_m, impl_m, timeout, seed, progress, placement, time_limit,
        reduce_shapes=reduce_shapes, reduce_mesh=reduce_mesh,
    )  # fmt: skip
    report.spec_name = name
    report.impl_name = f"XLA's SPMD partitioning of {name} ({parted.num_partitions} devices)"
    report.stats.seconds["xla partition"] = parted.compile_seconds
    return report


def shardy_partition_and_check(
    module,
    function: str | None = None,
    spec=None,
    spec_function: str | None = None,
    pipeline: str = "partitioner",
    halo_exchange: bool = True,
    timeout: float = 10.0,
    seed: int = 0,
    progress=None,
    time_limit: float | None = None,
    memory_limit: float | None = None,
    reduce_shapes: bool = True,
    workers: int | None = None,
) -> Report:
    """`tv partition --shardy`: run Shardy's passes (jaxlib) on a Shardy-annotated module and
    prove the per-device program of `function` equal to `spec` (a module; its
    `spec_function`), by default to the function's own global (unsharded) meaning."""
    with run_scope(), run_memory_budget(memory_limit), use_workers(workers):
        return run_deep(
            _bounded,
            _shardy_partition_and_check,
            time_limit,
            module,
            function,
            spec,
            spec_function,
            pipeline,
            halo_exchange,
            timeout,
            seed,
            progress,
            time_limit,
            reduce_shapes,
        )


def _shardy_partition_and_check(
    module,
    function,
    spec,
    spec_function,
    pipeline,
    halo_exchange,
    timeout,
    seed,
    progress,
    time_limit,
    reduce_shapes,
) -> Report:
    from tv_ir.ir.importer import read_source
    from tv_ir.xla.shardy_passes import run_shardy

    data, name = read_source(module)
    if isinstance(data, bytes):
        raise BadInput(f"{name}: tv partition takes StableHLO text")
    annotated = prepare(data, "module", unroll=False)
    if function is not None:
        annotated = annotated.with_entry(function)
    entry = annotated.main.name
    impl_m = prepare(
        run_shardy(module, pipeline, halo_exchange), "partitioned module", unroll=False
    )
    impl_m = impl_m.with_entry(entry)
    if spec is None:
        spec_m, spec_name = annotated, f"@{entry} of {name}"
    else:
        spec_m = prepare(spec, "spec", unroll=False)
        spec_m = spec_m.with_entry(spec_function) if spec_function else spec_m
        spec_name = f"@{spec_m.main.name} of {getattr(spec_m, 'source', 'spec')}"
    if pipeline == "gather-scatter-batching":
        placement = Placement.single_device(spec_m.main)
    else:
        placement = Placement.from_sdy(spec_m.main, annotated)
    report = check(
        spec_m, impl_m, timeout, seed, progress, placement, time_limit, reduce_shapes=reduce_shapes
    )
    report.spec_name = spec_name
    report.impl_name = (
        f"Shardy's {pipeline} passes on @{entry} of {name} ({placement.num_devices} devices)"
    )
    return report
