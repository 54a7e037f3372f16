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
    cannot be read that way."""
    found = reduce_mesh(spec, impl, placement, sizes=mesh.reduced_mesh.sizes)
    if not found.reduced:
        return None
    return found.spec, found.impl, Placement.replicated(found.spec.main, found.reduced_mesh.devices)


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


def _coords(c: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in c.items())
