"""Decoded StableHLO attribute records (the op table reads these, never MLIR objects)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class DotDims:
    lhs_batch: tuple[int, ...]
    rhs_batch: tuple[int, ...]
    lhs_contract: tuple[int, ...]
    rhs_contract: tuple[int, ...]


@dataclass(frozen=True)
class GatherDims:
    offset_dims: tuple[int, ...]
    collapsed_slice_dims: tuple[int, ...]
    operand_batching_dims: tuple[int, ...]
    start_indices_batching_dims: tuple[int, ...]
    start_index_map: tuple[int, ...]
    index_vector_dim: int


@dataclass(frozen=True)
class ScatterDims:
    update_window_dims: tuple[int, ...]
    inserted_window_dims: tuple[int, ...]
    input_batching_dims: tuple[int, ...]
    scatter_indices_batching_dims: tuple[int, ...]
    scattered_dims_to_operand_dims: tuple[int, ...]
    index_vector_dim: int


@dataclass(frozen=True)
class ConvDims:
    input_batch: int
    input_feature: int
    input_spatial: tuple[int, ...]
    kernel_input_feature: int
    kernel_output_feature: int
    kernel_spatial: tuple[int, ...]
    output_batch: int
    output_feature: int
    output_spatial: tuple[int, ...]


@dataclass(frozen=True)
class ChannelHandle:
    handle: int
    type: int


@dataclass(frozen=True)
class MeshAxesGroups:
    """`#stablehlo.replica_group_mesh_axes`: groups given by mesh axes of a named mesh."""

    mesh: str
    axes: tuple[str, ...]


@dataclass(frozen=True)
class EnumAttr:
    """A StableHLO enum attribute (comparison direction, precision, ...) by its value name."""

    kind: str
    value: str

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class OpaqueAttr:
    """An attribute tv does not decode; kept as its printed form."""

    text: str


@dataclass(frozen=True)
class SdyAxis:
    """A Shardy axis reference: a whole mesh axis, or its sub-axis `"x":(pre_size)size`.

    A sub-axis splits axis `x` (size n) row-major into [pre_size, size, n // (pre_size * size)]
    and takes the middle factor.
    """

    name: str
    pre_size: int = 1
    size: int | None = None  # None: the whole axis

    def __str__(self) -> str:
        sub = "" if self.size is None else f":({self.pre_size}){self.size}"
        return f'"{self.name}"{sub}'


@dataclass(frozen=True)
class SdyMesh:
    """`#sdy.mesh<["data"=2, "model"=4], device_ids=[...]>`; devices row-major over axes."""

    axes: tuple[tuple[str, int], ...]
    device_ids: tuple[int, ...] | None = None  # None: iota order

    @property
    def devices(self) -> int:
        """How many devices the mesh has (the product of its axis sizes)."""
        return math.prod(size for _, size in self.axes)

    def __str__(self) -> str:
        axes = ", ".join(f'"{n}"={s}' for n, s in self.axes)
        ids = (
            ""
            if self.device_ids is None
            else f", device_ids=[{', '.join(map(str, self.device_ids))}]"
        )
        return f"<[{axes}]{ids}>"


@dataclass(frozen=True)
class SdySharding:
    """`#sdy.sharding<@mesh, [{"data"}, {}], replicated={..}, unreduced={..}>`.

    `dims[i]` lists the axes dimension i is split over, major to minor. `open_dims` holds the
    dimensions marked `?` (open to further sharding by propagation); `priorities` the `p<n>`
    of each dimension (None when absent, empty when no dimension has one).
    """

    mesh: str | SdyMesh  # a mesh symbol name (without "@") or an inline mesh
    dims: tuple[tuple[SdyAxis, ...], ...]
    replicated: tuple[SdyAxis, ...] = ()
    unreduced: tuple[SdyAxis, ...] = ()
    open_dims: tuple[int, ...] = ()
    priorities: tuple[int | None, ...] = ()

    def __str__(self) -> str:
        mesh = f"@{self.mesh}" if isinstance(self.mesh, str) else f"mesh{self.mesh}"
        dims = []
        for i, axes in enumerate(self.dims):
            items = [str(a) for a in axes] + (["?"] if i in self.open_dims else [])
            prio = self.priorities[i] if i < len(self.priorities) else None
            dims.append("{" + ", ".join(items) + "}" + ("" if prio is None else f"p{prio}"))
        text = f"<{mesh}, [{', '.join(dims)}]"
        for key, axes in (("replicated", self.replicated), ("unreduced", self.unreduced)):
            if axes:
                text += f", {key}={{{', '.join(str(a) for a in axes)}}}"
        return text + ">"
