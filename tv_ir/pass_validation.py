"""`tv passes`: translation validation of XLA's pass pipeline, one pass at a time.

Each snapshot of the compilation (`tv_ir.xla.dumps`) is proved equal to a snapshot already
proved equal to the input, so the first snapshot that is refuted names the pass that changed
the program's meaning:

- a global snapshot (before SPMD partitioning) is checked against the latest proved global
  snapshot as single-device programs (the sharding annotations are hints, not meaning);
- a per-device snapshot (the partitioner's output and every pass after it) is checked against
  the latest proved global snapshot, whose annotations give the arguments' layouts, as
  `tv check BEFORE AFTER` does. Results take their layouts from, in order: the snapshot's own
  attributes, the global snapshot's annotations, XLA's executable (when tv compiled the
  module itself), `--out-shardings`, and else `{replicated}` when the per-device result has
  the global shape (XLA chose it; the proof then says every device holds the whole value).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tv_ir.report.result import EQUIVALENT, NOT_EQUIVALENT, UNKNOWN, Report
from tv_ir.xla.dumps import Snapshot, read_dump

from .errors import BadInput, TvError, one_line

UNCHANGED = "unchanged"
BAD_INPUT = "bad_input"


@dataclass
class Step:
    """One snapshot's check: against which proved snapshot, and with what verdict."""

    snapshot: Snapshot
    against: Snapshot | None
    verdict: str
    detail: str = ""
    seconds: float = 0.0
    report: Report | None = field(default=None, repr=False)


@dataclass
class PassValidation:
    """Every step, and the first refuted one (the pass that changed the meaning)."""

    module: str
    steps: list[Step]

    @property
    def first_refuted(self) -> Step | None:
        return next((s for s in self.steps if s.verdict == NOT_EQUIVALENT), None)

    @property
    def exit_code(self) -> int:
        if self.first_refuted is not None:
            return 1
        if any(s.verdict not in (EQUIVALENT, UNCHANGED) for s in self.steps):
            return 2
        return 0

    def suspects(self, step: Step) -> list[Snapshot]:
        """The snapshots after the last one proved equal to the input, up to `step`: the
        passes one of which changed the meaning (just `step`'s when every step before it was
        proved; an unchanged snapshot is as proved as the one before it)."""
        i = self.steps.index(step)
        proved = 0
        for k in range(1, i):
            verdict = self.steps[k].verdict
            if verdict == EQUIVALENT or (verdict == UNCHANGED and proved == k - 1):
                proved = k
        return [s.snapshot for s in self.steps[proved + 1 : i + 1]]


def validate_passes(
    directory: str | Path,
    module: str | None = None,
    keep_going: bool = False,
    out_shardings: list[str | None] | None = None,
    on_step: Callable[[Step], None] | None = None,
    **check_options,
) -> PassValidation:
    """Check every snapshot of `module` in an XLA dump directory (module doc). Stops at the
    first refuted snapshot unless `keep_going`. `check_options` go to `tv_ir.check`
    (timeout, time_limit per step, memory_limit, seed, reduce_shapes)."""
    snaps = read_dump(directory, module)
    steps = [Step(snaps[0], None, EQUIVALENT, "the input")]
    if on_step is not None:
        on_step(steps[0])
    reference, last_text = snaps[0], snaps[0].text()
    for snap in snaps[1:]:
        text = snap.text()
        if text == last_text:
            step = Step(snap, steps[-1].snapshot, UNCHANGED)
        else:
            step = _check_step(reference, snap, out_shardings, check_options)
            if step.verdict == EQUIVALENT and not snap.per_device:
                reference = snap
        last_text = text
        steps.append(step)
        if on_step is not None:
            on_step(step)
        if step.verdict == NOT_EQUIVALENT and not keep_going:
            break
    name = snaps[0].path.name.removesuffix(".before_optimizations.txt")
    return PassValidation(name, steps)


def _check_step(reference: Snapshot, snap: Snapshot, out_shardings, options) -> Step:
    from tv_ir.prover.boundary_layouts import GivenLayouts

    from .pipeline import check, prepare
    from .prover.placement import Placement

    t0 = time.perf_counter()
    try:
        spec = prepare(str(reference.path), "reference snapshot")
        impl = prepare(str(snap.path), "snapshot")
        if snap.per_device:
            given = GivenLayouts(out_shardings=_result_layouts(spec, impl, out_shardings))
            report = check(spec, impl, layouts=given if given.any else None, **options)
        else:
            placement = Placement.single_device(spec.main)
            report = check(spec, impl, placement=placement, **options)
    except BadInput as e:
        return Step(snap, reference, BAD_INPUT, one_line(e, 300), time.perf_counter() - t0)
    except TvError as e:
        return Step(snap, reference, UNKNOWN, one_line(e, 300), time.perf_counter() - t0)
    detail = report.reason
    if report.verdict == NOT_EQUIVALENT and report.location and report.location.impl:
        detail = f"differs at {report.location.impl}"
    return Step(snap, reference, report.verdict, detail, time.perf_counter() - t0, report)


def _result_layouts(spec, impl, given: list[str | None] | None) -> list[str | None] | None:
    """`given`, else `{replicated}` for each per-device result of the global shape."""
    if given is not None:
        return list(given)
    guessed = [
        "{replicated}" if tuple(i.shape) == tuple(s.shape) else None
        for s, i in zip(spec.main.result_types, impl.main.result_types, strict=False)
    ]
    return guessed if any(guessed) else None


def step_line(step: Step) -> str:
    mark = {EQUIVALENT: "ok  ", UNCHANGED: "same", NOT_EQUIVALENT: "FAIL"}.get(step.verdict, "??  ")
    where = "per-device" if step.snapshot.per_device else "global"
    detail = f": {step.detail}" if step.detail and step.verdict != EQUIVALENT else ""
    label = step.snapshot.label
    return f"{mark} {step.verdict:<14} {step.seconds:6.2f} s  {where:<10} {label}{detail}"


def render(result: PassValidation) -> str:
    """The verdict on the pipeline: the pass that broke it, or that every pass was proved."""
    bad = result.first_refuted
    undecided = [
        s for s in result.steps if s.verdict not in (EQUIVALENT, UNCHANGED, NOT_EQUIVALENT)
    ]
    checked = sum(s.verdict != UNCHANGED for s in result.steps[1:])
    if bad is not None:
        suspects = result.suspects(bad)
        culprit = bad.snapshot.label
        if bad.snapshot.per_device and not _previous(result, bad).per_device:
            culprit = f"XLA's SPMD partitioner (its output first dumped at {culprit})"
        lines = [
            f"NOT EQUIVALENT: {culprit} changes the meaning of {result.module}",
            f"  its output ({bad.snapshot.path.name}) differs from "
            f"{bad.against.path.name if bad.against else 'the input'}, which was proved equal "
            "to the input",
        ]
        if len(suspects) > 1:
            lines.append(
                "  the change is in one of these passes (steps between them were not decided): "
                + ", ".join(s.label for s in suspects)
            )
        if bad.report is not None:
            lines += ["", str(bad.report)]
        return "\n".join(lines)
    if undecided:
        first = undecided[0]
        return (
            f"UNKNOWN: {len(undecided)} of {checked} changed snapshots of {result.module} were not "
            f"decided (this is not a pass); first: {first.snapshot.label}: {first.detail}"
        )
    return f"EQUIVALENT: all {checked} passes that changed {result.module} preserve its meaning"


def _previous(result: PassValidation, step: Step) -> Snapshot:
    i = result.steps.index(step)
    return result.steps[max(i - 1, 0)].snapshot


def to_json(result: PassValidation) -> dict:
    bad = result.first_refuted
    return {
        "module": result.module,
        "verdict": {0: EQUIVALENT, 1: NOT_EQUIVALENT, 2: UNKNOWN}[result.exit_code],
        "first_refuted": bad.snapshot.label if bad else None,
        "steps": [
            {
                "snapshot": s.snapshot.path.name,
                "pass": s.snapshot.label,
                "per_device": s.snapshot.per_device,
                "against": s.against.path.name if s.against else None,
                "verdict": s.verdict,
                "detail": s.detail,
                "seconds": round(s.seconds, 3),
                "report": s.report.to_dict() if s.report is not None else None,
            }
            for s in result.steps
        ],
    }
