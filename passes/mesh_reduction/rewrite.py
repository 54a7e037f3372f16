"""The shard_map program instantiated on a smaller mesh: the same ops, each site of the
template (`template.Site`) at the reduced sizes, the mesh and the partition count reduced,
and @main's arguments and results (whole tensors) shrunk along the dimensions the shrunk
axes split; the shard_map's body keeps every tile's shape."""

from __future__ import annotations

import dataclasses

import numpy as np

from tv_ir.ir.attrs import SdyMesh
from tv_ir.ir.program import Block, Module, Op, Region, TensorType, Value

from .template import TABLES, Mesh, Template, instantiate


def whole_factor(axes: tuple[int, ...], real: Mesh, reduced: Mesh) -> int:
    """How much a dimension split over `axes` shrinks."""
    f = 1
    for a in axes:
        f *= real.sizes[a] // reduced.sizes[a]
    return f


def shrunk_type(t, axes: list[tuple[int, ...]], real: Mesh, reduced: Mesh):
    if not isinstance(t, TensorType):
        return t
    shape = tuple(n // whole_factor(ax, real, reduced) for n, ax in zip(t.shape, axes, strict=True))
    return TensorType(shape, t.dtype)


def remapped(t: Template, vmap: dict) -> Template:
    """`t` with its sites on a copy of its program (`vmap`: each value's copy)."""

    def copy(op: Op) -> Op:
        return vmap[op.results[0].id].owner

    sites = [dataclasses.replace(s, op=copy(s.op)) for s in t.sites]
    return dataclasses.replace(t, sites=sites, manual=t.manual and copy(t.manual))


def reduced_impl(impl: Module, t: Template, reduced: Mesh, reshaped: bool = False) -> Module:
    """`impl` on the `reduced` mesh (`t` is its template); `reshaped`: its shapes are already
    those of the reduced mesh (body_shapes.py), only its sites change."""
    sites = {id(s.op): s for s in t.sites if s.kind in ("groups", "pairs", "relabel")}
    constants = {}
    for s in t.sites:
        if s.kind in ("stride", "size", "last", "mark", "whole") + TABLES:
            constants.setdefault(id(s.op), []).append(s)
    vmap: dict[int, Value] = {}

    def copy_block(b: Block) -> Block:
        args = []
        for a in b.args:
            na = Value(a.type, a.name)
            vmap[a.id] = na
            args.append(na)
        ops: list[Op] = []
        for op in b.ops:
            ops.extend(copy_op(op))
        return Block(args, ops, [vmap[v.id] for v in b.results])

    def copy_op(op: Op, result_types=None) -> list[Op]:
        before = []
        operands = [vmap[v.id] for v in op.operands]
        for s in constants.get(id(op), []):
            old = op.operands[s.operand]
            value = np.asarray(instantiate(s, reduced)).astype(old.owner.attrs["value"].dtype)
            ty = old.type
            if s.kind in TABLES:  # one entry per device (per position): its length changes
                ty = TensorType(value.shape, old.type.dtype)
            c = Op("stablehlo.constant", [], [], {"value": value.reshape(ty.shape)}, [], op.loc)
            c.results = [Value(ty, None, c, 0)]
            before.append(c)
            operands[s.operand] = c.results[0]
        attrs = dict(op.attrs)
        s = sites.get(id(op))
        if s is not None:
            key = "replica_groups" if s.kind == "groups" else "source_target_pairs"
            attrs[key] = instantiate(s, reduced)
            if op.name == "stablehlo.all_to_all":  # one block per member of a group
                attrs["split_count"] = int(attrs[key].shape[-1])
        new = Op(op.name, operands, [], attrs, [], op.loc)
        new.regions = [Region(copy_block(r.block)) for r in op.regions]
        types = result_types or [r.type for r in op.results]
        new.results = []
        for i, (r, ty) in enumerate(zip(op.results, types, strict=True)):
            nv = Value(ty, r.name, new, i)
            vmap[r.id] = nv
            new.results.append(nv)
        return before + [new]

    main = impl.main
    args = []

    def on_reduced(ty, axes):
        # a per-device program (no shard_map) takes and gives tiles: they keep their shapes
        if reshaped or t.manual is None:
            return ty
        return shrunk_type(ty, axes, t.mesh, reduced)

    for a, axes in zip(main.args, t.arg_axes, strict=True):
        na = Value(on_reduced(a.type, axes), a.name)
        vmap[a.id] = na
        args.append(na)
    out_axes = []
    if t.manual is not None:
        out_axes = [
            [()] * len(r.type.shape) if isinstance(r.type, TensorType) else []
            for r in t.manual.results
        ]
        index = {n: i for i, n in enumerate(t.mesh.names)}
        for k, s in enumerate(t.manual.attrs["out_shardings"]):
            out_axes[k] = [tuple(index[ax.name] for ax in dim) for dim in s.dims]
    ops: list[Op] = []
    for op in main.body.ops:
        if op is t.manual:
            types = [on_reduced(r.type, ax) for r, ax in zip(op.results, out_axes, strict=True)]
            ops.extend(copy_op(op, types))
        else:
            ops.extend(copy_op(op))
    body = Block(args, ops, [vmap[v.id] for v in main.body.results])
    fn = dataclasses.replace(main, body=body, result_types=[v.type for v in body.results])
    functions = {k: (fn if f is main else f) for k, f in impl.functions.items()}
    attrs = dict(impl.attrs)
    meshes = dict(attrs.get("sdy.meshes") or {})
    meshes[t.mesh_name] = SdyMesh(tuple(zip(reduced.names, reduced.sizes, strict=True)))
    attrs["sdy.meshes"] = meshes
    attrs["mhlo.num_partitions"] = reduced.devices
    return dataclasses.replace(impl, functions=functions, attrs=attrs)
