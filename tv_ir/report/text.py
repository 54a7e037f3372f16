"""Human-readable rendering of a Report: verdict first, then the evidence."""

from __future__ import annotations

import numpy as np

from tv_ir.report.verdicts import EQUIVALENT, NOT_EQUIVALENT, SEMANTICS_NOTE, UNKNOWN

SMALL = 16  # tensors with at most this many elements are printed in full
# a hang's related sites (tv_ir.errors.ProgramHangs.sites after the branch op)
HANG_SITES = ("waiting at", "the decision comes from")


def render(r) -> str:
    lines = []
    s = r.stats
    timing = f"{s.seconds.get('total', sum(s.seconds.values())):.2f} s"
    if r.verdict == EQUIVALENT:
        lines.append(f"EQUIVALENT: {r.impl_name} computes the same function as {r.spec_name}")
        lines.append(f"  ({SEMANTICS_NOTE})")
        plural = "s" if s.stages != 1 else ""
        lines.append(
            f"  {s.stages} stage{plural} proved ({s.proved_by_normal_form} by normal form, "
            f"{s.proved_by_z3} by Z3, {s.cache_hits} by reusing the proof of an identical "
            f"stage, {s.repeated_stages} matched by the form of an earlier stage, "
            f"{s.mirrored_stages} mirroring a spec op, "
            f"{s.expansions} cut-point expansions) in {timing}"
        )
    elif r.verdict == NOT_EQUIVALENT:
        ce = r.counterexample
        if ce.hang is not None:
            lines.append(
                "NOT EQUIVALENT: on these inputs the implementation never returns (the spec "
                f"does): {_device(ce)} waits at a collective for devices that never reach it"
            )
            lines.append(f"  {ce.hang}")
        else:
            idx = list(ce.index)
            lines.append(f"NOT EQUIVALENT: output {ce.output} differs at index {idx}{_holder(ce)}")
            lines.append(f"  expected (spec): {_num(ce.expected)}")
            lines.append(f"  actual   (impl): {_num(ce.actual)}")
            lines.append(f"  largest difference in that output: {ce.max_abs_diff:.6g}")
        if r.location is not None:
            if r.location.impl is not None and ce.hang is not None:
                lines.append(f"  the devices part ways at: {r.location.impl}")
                for label, site in zip(HANG_SITES, r.location.related, strict=False):
                    lines.append(f"    {label}: {site}")
            elif r.location.impl is not None:
                lines.append(f"  first diverging op in impl: {r.location.impl}")
                if r.location.used_at is not None:
                    lines.append(f"    used as a whole at: {r.location.used_at}")
                for site in r.location.related:
                    lines.append(f"    its inputs come from: {site}")
            if r.location.spec is not None:
                lines.append(f"  where the spec parts ways:  {r.location.spec}")
            if r.location.note:
                lines.append(f"  location: {r.location.note}")
        lines.append("  counterexample inputs (replayed concretely in float64):")
        for name, value in ce.inputs.items():
            lines.append(f"    {name}: {_tensor(value)}")
    else:
        lines.append("UNKNOWN: tv could neither prove nor refute equivalence (this is not a pass)")
        if r.reason:
            lines.append(f"  reason: {r.reason}")
        if r.unsupported:
            lines.append(f"  unsupported: {', '.join(sorted(set(r.unsupported)))}")
        lines.append(f"  {s.stages} stages were proved before stopping; {timing}")
    if r.mesh_reduction and r.mesh_reduction.get("reduced"):
        lines.append("  " + r.mesh_reduction["summary"].replace("\n", "\n  "))
    if r.reduction and r.reduction.get("reduced"):
        lines.append("  " + r.reduction["summary"].replace("\n", "\n  "))
    elif (
        r.reduction
        and r.verdict == UNKNOWN
        and any(c["kept"] for c in r.reduction.get("classes", []))
    ):
        # nothing shrank: why each class kept its size (what an unknown at a limit cost)
        lines.append("  " + r.reduction["summary"].replace("\n", "\n  "))
    for note in r.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def _holder(ce) -> str:
    """ ", held by device 5 (data=1, model=1)": the device and its mesh coordinates."""
    return "" if ce.device is None else f", held by {_device(ce)}"


def _device(ce) -> str:
    """ "device 5 (data=1, model=1)" """
    coords = ce.mesh_coords or {}
    at = f" ({', '.join(f'{axis}={i}' for axis, i in coords.items())})" if coords else ""
    return f"device {ce.device}{at}"


def _num(v) -> str:
    return f"{v:.9g}" if isinstance(v, float) else str(v)


def _tensor(a) -> str:
    if a is None:
        return "(token)"
    a = np.asarray(a)
    kind = {"f": "f64", "b": "bool"}.get(a.dtype.kind, str(a.dtype))
    head = f"{kind}{list(a.shape)}"
    if a.size <= SMALL:
        body = np.array2string(a, precision=6, separator=", ", max_line_width=200)
        return f"{head} {' '.join(body.split())}"
    if a.dtype.kind == "b":
        return f"{head} ({int(a.sum())} true of {a.size})"
    return (
        f"{head} min {a.min():.6g}, max {a.max():.6g}, mean {a.mean():.6g} "
        "(use --json for every value)"
    )
