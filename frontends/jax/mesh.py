"""Meshes and shardings given to `verify`: a `jax.sharding.Mesh` or a {axis: size} dict, and
PartitionSpecs turned into NamedShardings on that mesh."""

from __future__ import annotations

from typing import Any

from tv_ir.errors import BadInput


def resolve_mesh(mesh: Any):
    """A `Mesh`, or None. Accepts a Mesh, a {name: size} dict or a ((sizes), (names)) pair."""
    import jax
    from jax.sharding import AxisType, Mesh

    if mesh is None or isinstance(mesh, Mesh):
        return mesh
    if isinstance(mesh, dict):
        names, sizes = tuple(mesh), tuple(mesh.values())
    elif isinstance(mesh, (tuple, list)) and len(mesh) == 2:
        sizes, names = tuple(mesh[0]), tuple(mesh[1])
    else:
        raise BadInput(f"mesh must be a jax.sharding.Mesh or a {{axis: size}} dict, not {mesh!r}")
    if len(sizes) != len(names) or not all(isinstance(s, int) and s > 0 for s in sizes):
        raise BadInput(f"mesh {mesh!r}: need one positive size per axis name")
    need = 1
    for s in sizes:
        need *= s
    have = len(jax.devices())
    if need > have:
        raise BadInput(
            f"mesh {dict(zip(names, sizes, strict=True))} needs {need} devices but JAX has "
            f"{have} (set XLA_FLAGS=--xla_force_host_platform_device_count={need} before "
            "importing jax)"
        )
    # Auto axes (not make_mesh's Explicit default): shardings are annotations for XLA
    auto = (AxisType.Auto,) * len(names)
    return jax.make_mesh(sizes, names, axis_types=auto, devices=jax.devices()[:need])


def named(shardings: Any, mesh) -> Any:
    """Replace the PartitionSpecs in a pytree of shardings by NamedShardings on `mesh`."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    if shardings is None:
        return None

    def one(s):
        if isinstance(s, PartitionSpec):
            if mesh is None:
                raise BadInput(f"sharding {s} is a PartitionSpec: pass mesh= as well")
            try:
                return NamedSharding(mesh, s)
            except ValueError as e:  # an axis the mesh lacks, an axis used twice
                why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise BadInput(f"sharding {s} on mesh {dict(mesh.shape)}: {why}") from None
        return s

    return jax.tree_util.tree_map(
        one, shardings, is_leaf=lambda s: s is None or isinstance(s, PartitionSpec)
    )
