"""Where a device sits on the mesh a program names (for reports: `device 6 (data=1,
model=2)`)."""

from __future__ import annotations

import numpy as np

from tv_ir.ir.program import Module


def mesh_coords(module: Module, device: int, num_partitions: int) -> dict[str, int] | None:
    """Coordinates (axis name -> index) of a device on the module's Shardy mesh of
    `num_partitions` devices, None when it names no such mesh. Devices lie row-major over the
    mesh axes unless the mesh lists its device ids (a device is its partition id: one
    replica)."""
    mesh = _device_mesh(module, num_partitions)
    if mesh is None or device >= num_partitions:
        return None
    ids = list(mesh.device_ids) if mesh.device_ids else list(range(num_partitions))
    if device not in ids:
        return None
    names = [name for name, _ in mesh.axes]
    sizes = [size for _, size in mesh.axes]
    pos = np.unravel_index(ids.index(device), sizes) if sizes else ()
    return {name: int(i) for name, i in zip(names, pos, strict=True)}


def _device_mesh(module: Module, n: int):
    """The mesh of n devices that the program's shard_maps (else its module) use."""
    meshes = dict(module.attrs.get("sdy.meshes") or {})
    used = []
    for op in module.main.body.ops:
        if op.name == "sdy.manual_computation":
            for s in list(op.attrs.get("in_shardings") or []) + list(
                op.attrs.get("out_shardings") or []
            ):
                mesh = meshes.get(s.mesh) if isinstance(s.mesh, str) else s.mesh
                if mesh is not None:
                    used.append(mesh)
    for mesh in used + list(meshes.values()):
        if mesh.axes and int(np.prod([size for _, size in mesh.axes])) == n:
            return mesh
    return None
