"""Decoded StableHLO attribute records (the op table reads these, never MLIR objects)."""

from __future__ import annotations

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
