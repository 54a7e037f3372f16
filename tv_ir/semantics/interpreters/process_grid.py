"""The StableHLO process grid: `num_replicas` x `num_partitions` processes and the spec's
strategies for splitting it into process groups ("Parallel execution" / "Collective ops").

A process is a `Device(replica_id, partition_id, device_id)`, its device id being the spec's
flattened id `replica_id * num_partitions + partition_id`. Replica groups arrive decoded by
the importer: dense arrays (padded with -1), empty (= every id of the strategy's kind), or
`MeshAxesGroups` over a mesh from `module.attrs["sdy.meshes"]` or an inlined
`#stablehlo.mesh`. Meshes are still `OpaqueAttr`s after import, so this module reads their
printed form itself (`parse_mesh`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tv_ir.errors import BadInput, Unsupported
from tv_ir.ir.attrs import ChannelHandle, MeshAxesGroups


@dataclass(frozen=True)
class Device:
    """One process of the grid (the spec's `process_id`, plus its flattened id)."""

    replica_id: int
    partition_id: int
    device_id: int


ProcessGroups = list[list[Device]]

# ops whose groups follow the all_reduce table / the all_to_all table (spec, per op section)
_REDUCE_LIKE = {"all_reduce", "all_gather", "reduce_scatter"}
# ragged_all_to_all (XLA's HLO op, `custom_call @ragged_all_to_all` from JAX) groups as all_to_all
_PERMUTE_LIKE = {"all_to_all", "collective_permute", "collective_broadcast", "ragged_all_to_all"}


def channel_id(attrs: dict[str, Any]) -> int:
    """The op's `channel_id`: `channel_handle.handle`, 0 when absent.

    mhlo ops (e.g. the tuple form of `mhlo.all_to_all`) keep `#mhlo.channel_handle<...>` as an
    `OpaqueAttr`; its handle is read from the text.
    """
    h = attrs.get("channel_handle")
    if h is None:
        return 0
    if isinstance(h, ChannelHandle):
        return h.handle
    m = re.search(r"handle\s*=\s*(-?\d+)", str(getattr(h, "text", h)))
    if m is None:
        raise BadInput(f"cannot read channel_handle {h}")
    return int(m.group(1))


def strategy(op_name: str, channel: int, use_global_device_ids: bool) -> str:
    """The spec's choice of process-group strategy for a collective (stack.md §9).

    all_reduce / all_gather / reduce_scatter: `cross_replica` if channel_id <= 0,
    `cross_replica_and_partition` if channel_id > 0, `flattened_ids` if in addition
    use_global_device_ids. all_to_all / collective_permute / collective_broadcast:
    `cross_replica` if channel_id <= 0, else `cross_partition`.
    """
    short = op_name.split(".", 1)[-1]
    if short in _REDUCE_LIKE:
        if use_global_device_ids:
            if channel <= 0:
                raise BadInput(f"{op_name}: use_global_device_ids needs channel_id > 0 (C5)")
            return "flattened_ids"
        return "cross_replica" if channel <= 0 else "cross_replica_and_partition"
    if short in _PERMUTE_LIKE:
        return "cross_replica" if channel <= 0 else "cross_partition"
    raise Unsupported(f"no process-group rule for {op_name}", op=op_name)


class ProcessGrid:
    """`num_replicas` x `num_partitions` processes and the spec's group strategies."""

    def __init__(self, num_replicas: int, num_partitions: int, meshes: dict | None = None):
        if num_replicas < 1 or num_partitions < 1:
            raise BadInput("the process grid needs at least one replica and one partition")
        self.num_replicas = num_replicas
        self.num_partitions = num_partitions
        self.meshes = dict(meshes or {})  # mesh name (no @) -> mesh attribute
        self.devices = [
            Device(r, p, r * num_partitions + p)
            for r in range(num_replicas)
            for p in range(num_partitions)
        ]

    @property
    def num_processes(self) -> int:
        return len(self.devices)

    def process(self, replica_id: int, partition_id: int) -> Device:
        if not (0 <= replica_id < self.num_replicas and 0 <= partition_id < self.num_partitions):
            raise BadInput(
                f"process ({replica_id}, {partition_id}) outside the "
                f"{self.num_replicas}x{self.num_partitions} process grid"
            )
        return self.devices[replica_id * self.num_partitions + partition_id]

    # -- the spec's four strategies ----------------------------------------------------------
    def cross_replica(self, replica_groups: Sequence[Sequence[int]]) -> ProcessGroups:
        """Each replica group, once per partition id."""
        return [
            [self.process(r, p) for r in group]
            for group in replica_groups
            for p in range(self.num_partitions)
        ]

    def cross_partition(self, partition_groups: Sequence[Sequence[int]]) -> ProcessGroups:
        """Each partition group, once per replica id."""
        return [
            [self.process(r, p) for p in group]
            for group in partition_groups
            for r in range(self.num_replicas)
        ]

    def cross_replica_and_partition(self, replica_groups: Sequence[Sequence[int]]) -> ProcessGroups:
        """Each replica group times all partition ids, ordered replica-major as XLA orders them.

        The spec's pseudo-code (and the reference interpreter) order the members
        partition-major (`for partition_id: for replica_id in replica_group`); XLA
        (`GetParticipatingDevicesGroups`, checked on XLA:CPU in tests/test_collectives.py)
        orders them `for replica_id in replica_group: for partition_id`. The two agree unless
        num_replicas > 1 and a group holds several replicas; then the order decides
        all_gather's concatenation and reduce_scatter's parts, and tv follows XLA, which runs
        the programs it verifies.
        """
        return [
            [self.process(r, p) for r in group for p in range(self.num_partitions)]
            for group in replica_groups
        ]

    def flattened_ids(self, flattened_id_groups: Sequence[Sequence[int]]) -> ProcessGroups:
        """Groups of flattened ids `replica_id * num_partitions + partition_id`."""
        n = self.num_partitions
        return [[self.process(i // n, i % n) for i in group] for group in flattened_id_groups]

    # -- from an op's attributes -------------------------------------------------------------
    def groups(self, op_name: str, attrs: dict[str, Any]) -> ProcessGroups:
        """The process groups of a collective op, from its attributes (spec rule per op).

        collective_permute's `source_target_pairs` are groups of two (source, target).
        """
        how = strategy(op_name, channel_id(attrs), bool(attrs.get("use_global_device_ids")))
        if op_name.split(".", 1)[-1] == "collective_permute":
            pairs = np.asarray(attrs.get("source_target_pairs", []), dtype=np.int64)
            return getattr(self, how)(pairs.reshape(-1, 2).tolist())  # no pairs: no groups
        return getattr(self, how)(self.dense_groups(attrs.get("replica_groups"), how))

    def dense_groups(self, groups: Any, how: str) -> list[list[int]]:
        """Replica groups as lists of ids: -1 padding dropped; empty = one group of every id
        the strategy ranges over; mesh axes expanded (`mesh_axes_groups`)."""
        if isinstance(groups, MeshAxesGroups):
            return mesh_axes_groups(self._mesh(groups.mesh), groups.axes)
        arr = np.zeros((0, 0), np.int64) if groups is None else np.asarray(groups)
        if arr.size == 0:
            size = {
                "cross_replica": self.num_replicas,
                "cross_replica_and_partition": self.num_replicas,
                "cross_partition": self.num_partitions,
                "flattened_ids": self.num_processes,
            }[how]
            return [list(range(size))]
        if arr.ndim != 2:
            raise BadInput(f"replica groups must be 2-dimensional, got shape {arr.shape}")
        return [[int(i) for i in row if i != -1] for row in arr.tolist()]

    def _mesh(self, ref: str):
        if ref.startswith("@"):
            if ref[1:] not in self.meshes:
                raise BadInput(f"replica groups name mesh {ref}, which the module does not define")
            return self.meshes[ref[1:]]
        return ref  # an inlined #stablehlo.mesh

    # -- exchanging values -------------------------------------------------------------------
    @staticmethod
    def rendezvous(group: list[Device], per_device: Sequence[Any]) -> list[Any]:
        """Every member's values, in group order (all devices run in lockstep here, so the
        barrier of the reference interpreter is a lookup)."""
        return [per_device[d.device_id] for d in group]


# -- meshes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mesh:
    """A mesh: named axes with sizes, and the device id at each coordinate (row-major)."""

    axes: tuple[tuple[str, int], ...]
    device_ids: tuple[int, ...]


_SDY_AXIS = re.compile(r'"([^"]+)"\s*=\s*(\d+)')
_SHLO_AXIS = re.compile(r'name\s*=\s*"([^"]+)"\s*,\s*size\s*=\s*(\d+)')
_DEVICE_IDS = re.compile(r"device_ids\s*=\s*(?:dense<)?\[([^\]]*)\]")
_AXIS_REF = re.compile(
    r'name\s*=\s*"(?P<name>[^"]+)"(?:\s*,\s*sub_axis_info\s*=\s*\((?P<pre>\d+)\)(?P<size>\d+))?'
)


def parse_mesh(mesh: Any) -> Mesh:
    """`#sdy.mesh<["a"=2, "b"=4], device_ids=[...]>` or `#stablehlo.mesh<axes=[<name = "a",
    size = 2>, ...], device_ids=dense<[...]>>` (from an `OpaqueAttr` or a string)."""
    if isinstance(mesh, Mesh):
        return mesh
    text = str(getattr(mesh, "text", mesh))
    ids_match = _DEVICE_IDS.search(text)
    body = text[: ids_match.start()] if ids_match else text
    pattern = _SHLO_AXIS if "stablehlo.mesh" in body else _SDY_AXIS
    axes = tuple((n, int(s)) for n, s in pattern.findall(body))
    size = int(np.prod([s for _, s in axes], dtype=np.int64))
    if ids_match:
        ids = tuple(int(i) for i in ids_match.group(1).replace(" ", "").split(",") if i)
        if len(ids) != size:
            raise BadInput(f"mesh {text}: {len(ids)} device ids for {size} devices")
    else:
        ids = tuple(range(size))
    return Mesh(axes, ids)


def mesh_axes_groups(mesh: Any, axis_refs: Sequence[str]) -> list[list[int]]:
    """`#stablehlo.replica_group_mesh_axes` as dense groups: one group per coordinate of the
    axes not listed, members ordered by the listed axes (row-major in the listed order).

    A sub-axis `name:(pre)size` of an axis of size n is the middle factor of n = pre * size *
    (n / (pre * size)), coordinates row-major. Device ids are the mesh's `device_ids`.
    """
    m = parse_mesh(mesh)
    sizes = dict(m.axes)
    refs = []  # (axis index, stride, size): the listed coordinate is (k // stride) % size
    for ref in axis_refs:
        r = _AXIS_REF.search(str(getattr(ref, "text", ref)))
        if r is None or r.group("name") not in sizes:
            raise BadInput(f"replica groups name axis {ref}, not in mesh {m.axes}")
        axis = [n for n, _ in m.axes].index(r.group("name"))
        n = sizes[r.group("name")]
        pre, size = (int(r.group("pre")), int(r.group("size"))) if r.group("pre") else (1, n)
        if n % (pre * size):
            raise BadInput(f"sub-axis {ref} does not divide axis of size {n}")
        refs.append((axis, n // (pre * size), size))
    groups: dict[tuple, list[tuple[tuple, int]]] = {}
    for flat, coords in enumerate(itertools.product(*[range(s) for _, s in m.axes])):
        listed = tuple((coords[a] // stride) % size for a, stride, size in refs)
        rest = list(coords)
        for (a, stride, _), c in zip(refs, listed, strict=True):
            rest[a] -= c * stride
        groups.setdefault(tuple(rest), []).append((listed, m.device_ids[flat]))
    return [[d for _, d in sorted(members)] for _, members in sorted(groups.items())]
