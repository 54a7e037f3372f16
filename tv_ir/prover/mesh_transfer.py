"""Mesh reduction in a check: choose the reduced mesh on the real pair, apply the same
sizes to every pair the check runs (the shape-reduced pair, its witnesses, the real-size
replay), and name a counterexample's device by the real device it stands for."""

from __future__ import annotations

from tv_ir.passes.mesh_reduction import MeshReduction, reduce_mesh

from .placement import Placement


def plan(spec, impl, placement) -> MeshReduction:
    """The mesh reduction of the real pair (`reduced` False when no axis shrinks)."""
    return reduce_mesh(spec, impl, placement)


def on_reduced_mesh(mesh: MeshReduction, spec, impl, placement):
    """(spec, impl, placement) of a pair on `mesh`'s reduced mesh, None when the pair
    cannot be read that way. Ops nothing reads are dropped (`dce`): a dead broadcast no
    axis splits keeps the real batch, 94 of a 126-layer witness's 95 million elements at
    TrainVerify's 7,168-device plan, and the witness was "too large to run"."""
    from tv_ir.passes import dce

    found = reduce_mesh(spec, impl, placement, sizes=mesh.reduced_mesh.sizes)
    if not found.reduced:
        return None
    spec, impl = dce.run(found.spec), dce.run(found.impl)
    return spec, impl, reduced_placement(found)


def reduced_placement(mesh: MeshReduction) -> Placement:
    """Where the reduced pair's arguments and results live: whole on every device (a
    shard_map program), or split as on the real mesh (a per-device program)."""
    if mesh.layouts is None:
        return Placement.replicated(mesh.spec.main, mesh.reduced_mesh.devices)
    return Placement(1, mesh.reduced_mesh.devices, *mesh.layouts)


def name_real_device(report, mesh: MeshReduction) -> None:
    """A counterexample found on the reduced mesh, named by the real device it stands for."""
    ce = report.counterexample
    if ce is None or ce.device is None:
        return
    device, coords = mesh.real_device(ce.device)
    reduced = dict(zip(mesh.reduced_mesh.names, mesh.reduced_mesh.coords(ce.device), strict=True))
    report.notes.append(
        f"found on the reduced mesh of {mesh.reduced_mesh.devices} devices at device "
        f"{ce.device} ({_coords(reduced)}), which stands for device {device} "
        f"({_coords(coords)}) of the real {mesh.real_mesh.devices}"
    )
    ce.device, ce.mesh_coords = device, coords


def runs_on_real_mesh(spec, impl, placement) -> bool:
    """Whether the real pair fits to run on every device of its mesh (`REPLAY_LIMIT`
    elements, the impl's counted once per device)."""
    from tv_ir.ir.program import elements

    from .real_size import REPLAY_LIMIT

    return elements(spec) + placement.num_devices * elements(impl) <= REPLAY_LIMIT


def differs_on_real_mesh(spec, impl, placement, seed: int = 0):
    """The real pair run on random inputs on every device of its mesh: a difference
    (`refutation(...)`'s result) or None. It does not depend on the proof on the reduced
    mesh, so a check computes it beside that proof."""
    from .real_size import _differs

    return _differs(spec, impl, placement, seed)


NOT_RUN = object()  # `confirm_on_real_mesh`'s `found` when nothing ran it beforehand


def confirm_on_real_mesh(
    report, mesh: MeshReduction, spec, impl, placement, seed: int = 0, found=NOT_RUN
):
    """A verdict on the reduced mesh, run concretely on every device of the real one when
    that fits (`runs_on_real_mesh`): a proof whose programs differ there is refuted there; a
    refutation whose programs agree there on random inputs is `unknown` (the caller then
    checks the real mesh as given). `found`: `differs_on_real_mesh`'s result, when it was
    computed beside the proof."""
    from tv_ir.report.result import EQUIVALENT, NOT_EQUIVALENT, UNKNOWN, Report

    from .real_size import refuted_by_replay

    if report.verdict not in (EQUIVALENT, NOT_EQUIVALENT):
        return report
    if not runs_on_real_mesh(spec, impl, placement):
        report.notes.append(
            f"the real mesh ({mesh.real_mesh.devices} devices) is too large to run concretely: "
            "the verdict rests on the mesh reduction's template (docs/equivalence.md)"
        )
        return report
    if found is NOT_RUN:
        found = differs_on_real_mesh(spec, impl, placement, seed)
    if report.verdict == EQUIVALENT and found is None:
        report.notes.append("checked concretely on every device of the real mesh too")
        return report
    if report.verdict == NOT_EQUIVALENT:
        replayed = _replayed(report, mesh, spec, impl, placement)
        if replayed is not None or found is not None:
            report.counterexample, report.location, report.outputs = replayed or found
            report.notes.append(
                "replayed on every device of the real mesh ("
                + (
                    "the reduced counterexample, each device's block from the reduced device "
                    "standing for it)"
                    if replayed is not None
                    else "random inputs)"
                )
            )
            return report
    if found is not None:  # proved on the reduced mesh, but the real one differs
        return refuted_by_replay(
            found,
            report,
            "proved on the reduced mesh, but the programs differ on the real one: the mesh "
            "reduction does not carry over for this pair (replayed on the real mesh)",
        )
    out = Report(
        UNKNOWN,
        stats=report.stats,
        reason="mesh reduction: refuted on the reduced "
        "mesh, but the programs agree on the real mesh on random inputs",
    )
    out.notes.append(out.reason)
    return out


def _replayed(report, mesh: MeshReduction, spec, impl, placement):
    """The reduced counterexample blown up to the real mesh, localised there, or None."""
    from .localise import refutation

    ce = report.counterexample
    if ce is None or len(ce.inputs) != len(mesh.arg_axes):
        return None
    try:
        inputs = [
            mesh.blown_up(x, axes) if axes else x
            for x, axes in zip(ce.inputs.values(), mesh.arg_axes, strict=True)
        ]
        if any(
            getattr(x, "shape", None) != tuple(t.shape)
            for x, t in zip(inputs, spec.main.arg_types, strict=True)
        ):
            return None
        return refutation(spec, impl, placement, inputs)
    except (ValueError, IndexError):
        return None


def _coords(c: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in c.items())
