"""Helpers shared by the torch_xla examples: the (2, 4) mesh, device groups of a mesh axis,
and an explicit all_reduce for manually sharded regions.

Import `tv_ir.frontends.torch_xla` before this module: it sets torch_xla's CPU runtime.
"""

from __future__ import annotations

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.spmd as xs


def mesh_2x4(names: tuple[str, str]) -> xs.Mesh:
    """Eight devices as a (2, 4) mesh."""
    return xs.Mesh(np.arange(8), (2, 4), names)


def axis_groups(mesh: xs.Mesh, axis: str) -> list[list[int]]:
    """Device groups along one mesh axis (one group per coordinate of the other axes)."""
    devices = np.asarray(mesh.get_logical_mesh())
    k = mesh.axis_names.index(axis)
    moved = np.moveaxis(devices, k, -1).reshape(-1, devices.shape[k])
    return [[int(d) for d in row] for row in moved]


def all_reduce(t: torch.Tensor, groups: list[list[int]], scale: float = 1.0) -> torch.Tensor:
    """Sum over each group, times `scale`. (`xm.all_reduce` is a no-op under SPMD unless
    XLA_ALWAYS_ALLREDUCE=1 is set; this emits the collective either way.)"""
    return torch_xla._XLAC._xla_all_reduce(xm.REDUCE_SUM, t, scale, groups, False)


def manual(t: torch.Tensor, spec: tuple, mesh: xs.Mesh) -> torch.Tensor:
    """Enter a manually sharded region: this device's shard of `t` by `spec`."""
    return xs.enable_manual_sharding(t, spec, mesh=mesh).global_tensor


def automatic(t: torch.Tensor, spec: tuple, shape: tuple, mesh: xs.Mesh) -> torch.Tensor:
    """Leave a manually sharded region: the shards form a `shape` tensor sharded by `spec`."""
    return xs.disable_manual_sharding(t, spec, shape, mesh=mesh).global_tensor
