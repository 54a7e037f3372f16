"""The per-device program of a module that is one `jax.shard_map` over its whole mesh.

Before:  @main(%x: 8x16) { %r = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"data"}, {}]>]
                             manual_axes={"data", "model"} (%xl: 4x16) { body } ; return %r }
After:   @main(%xl: 4x16) { body }   with argument/result layouts from the shardings

Running the manual computation on the mesh is running its body on every device with the
operands split by `in_shardings` and the results assembled by `out_shardings`, so the body
is a per-device program with those boundary layouts. Loop induction
(tv_ir.prover.loop_induction) needs this form: the loops of a shard_map are in its body.
Only the plain case is rewritten: @main is the manual computation alone, over every axis of
its mesh, on @main's arguments in order, without partial sums.
"""

from __future__ import annotations

import dataclasses
import math

from tv_ir.ir.attrs import SdySharding
from tv_ir.ir.program import Function, Module, TensorType
from tv_ir.semantics.layout import Layout


@dataclasses.dataclass
class PerDeviceProgram:
    module: Module
    num_devices: int
    args: list[Layout]
    results: list[Layout]


def per_device_program(module: Module) -> PerDeviceProgram | None:
    """The body of @main's only op, a full-mesh `sdy.manual_computation`, as a per-device
    program with its boundary layouts; None when @main is not of that form."""
    main = module.main
    ops = main.body.ops
    if len(ops) != 1 or ops[0].name != "sdy.manual_computation":
        return None
    mc = ops[0]
    if [v.id for v in mc.operands] != [a.id for a in main.args]:
        return None
    if [v.id for v in main.body.results] != [r.id for r in mc.results]:
        return None
    meshes = module.attrs.get("sdy.meshes") or {}
    shardings = list(mc.attrs.get("in_shardings") or []) + list(mc.attrs.get("out_shardings") or [])
    if not shardings:
        return None
    mesh = (
        shardings[0].mesh
        if not isinstance(shardings[0].mesh, str)
        else meshes.get(shardings[0].mesh)
    )
    manual = tuple(mc.attrs.get("manual_axes") or ())
    if mesh is None or sorted(manual) != sorted(a for a, _ in mesh.axes):
        return None
    n = max(1, math.prod(size for _, size in mesh.axes))
    block = mc.regions[0].block
    ins = _layouts(mc.attrs.get("in_shardings") or [], mc.operands, block.args, meshes, n)
    outs = _layouts(mc.attrs.get("out_shardings") or [], mc.results, block.results, meshes, n)
    if ins is None or outs is None:
        return None
    fn = Function(
        main.name,
        block,
        [v.type for v in block.results],
        [{} for _ in block.args],
        [dict(a) for a in main.res_attrs],
        [a.name for a in block.args],
    )
    functions = dict(module.functions)
    functions[main.name] = fn
    attrs = dict(module.attrs)
    attrs["mhlo.num_partitions"] = n
    per_device = Module(functions, attrs, module.source, list(module.other_ops), module.entry)
    return PerDeviceProgram(per_device, n, ins, outs)


def _layouts(shardings, outer, inner, meshes, n: int) -> list[Layout] | None:
    if len(shardings) != len(outer):
        return None
    out = []
    for s, v, local in zip(shardings, outer, inner, strict=True):
        if not isinstance(s, SdySharding) or s.unreduced or not isinstance(v.type, TensorType):
            return None
        lay = Layout.from_sdy(s, meshes, tuple(v.type.shape), n)
        if lay.unreduced or lay.manual or tuple(lay.tile_shape) != tuple(local.type.shape):
            return None
        if any(lay.local_shape(d) != tuple(lay.tile_shape) for d in range(n)):
            return None  # ragged tiles: the body sees padding
        out.append(lay)
    return out
