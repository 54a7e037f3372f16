"""Manual values at a pre-partition module's boundary, lifted to a pair with global values.

A module that goes into XLA's SPMD partitioner may take or return values that are already
per-device: `{manual}` (each device its own value of the declared shape) or partially manual
(`devices=[2,1,2]... last_tile_dims={manual}`: the devices fall into manual *instances*, each
instance its own value of the declared shape, laid out over the instance's devices by the
other tile dimensions). Such a module is itself an SPMD program and has no single-device
meaning, so `tv check BEFORE AFTER` cannot compare it as it compares a global module.

Here the pair is lifted to one whose values are global:

- every manual boundary value becomes a *stacked* value, one row per instance: shape
  [instances] + declared shape, instances numbered in the order of their first device;
- the spec becomes one `sdy.manual_computation` over a mesh `["i"=instances, "r"=devices per
  instance]` (device ids: the instances' devices, instance by instance) whose body is the
  module's own body: each device gets its instance's whole row of a stacked argument and the
  whole value of a global one (through a `@Sharding` annotation with the argument's
  sharding, which `@SPMDFullToShardShape` reads), and runs the module in lockstep with the
  other devices (partition id, collectives, GSPMD shard_map regions as the SPMD interpreter
  runs them). A stacked result's row is its instance's value, and every device of the
  instance must compute the same one (the interpreter's replica check); a global result
  must be the same on every device;
- the implementation gets a leading dimension of 1 on those arguments and results (a
  device's slot of the stacked value), and each device holds row `instance` of the stacked
  value, cut within the row as the sharding's other tile dimensions say.

Reading a partially manual value as its whole instance value on every device of the
instance is XLA's reading for ops that compute on each instance's value alone. For ops that
talk between devices it holds only in part, so where an instance has several devices the
spec may use `all_reduce` and `collective_permute` whose groups join devices of distinct
instances at the same place within their instances, and no `partition_id` / `replica_id`
(a device's own id is no instance's value); anything else is unsupported, never guessed.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tv_ir.errors import Unsupported
from tv_ir.ir.attrs import SdyAxis, SdyMesh, SdySharding
from tv_ir.ir.program import Block, Function, Module, Op, Region, TensorType, Value, walk
from tv_ir.passes.inline_calls import clone_block
from tv_ir.prover.placement import Placement
from tv_ir.semantics.layout import Layout

MESH_AXES = ("i", "r")  # instance, device within the instance
ELEMENTWISE_COLLECTIVES = ("stablehlo.all_reduce", "stablehlo.collective_permute")
DEVICE_IDS = ("stablehlo.partition_id", "stablehlo.replica_id")
GSPMD_MANUAL = ("SPMDFullToShardShape", "SPMDShardToFullShape")


def has_gspmd_regions(module: Module) -> bool:
    """Whether `module` holds GSPMD manual regions (`@SPMDFullToShardShape` /
    `@SPMDShardToFullShape`): it has a meaning only on devices."""
    return any(
        op.name == "stablehlo.custom_call" and op.attrs.get("call_target_name") in GSPMD_MANUAL
        for fn in module.functions.values()
        for op in walk(fn.body)
    )


def is_manual(sharding: str | None) -> bool:
    """Whether an HloSharding string is manual, fully or in part."""
    return bool(sharding) and "manual" in sharding


def lift_manual_boundary(
    spec: Module, impl: Module, arg_shardings: list[str], out_shardings: list[str], n: int
) -> tuple[Module, Module, Placement]:
    """(spec, impl, placement) with every manual boundary value stacked by instance (module
    docstring). `spec` and `impl` are not changed."""
    s_main = spec.main
    arg_lays = [_layout(s, t, n) for s, t in zip(arg_shardings, s_main.arg_types, strict=True)]
    res_lays = [_layout(s, t, n) for s, t in zip(out_shardings, s_main.result_types, strict=True)]
    types = list(s_main.arg_types) + list(s_main.result_types)
    for lay, t in zip(arg_lays + res_lays, types, strict=True):
        if lay.manual and not isinstance(t, TensorType):
            raise Unsupported(f"a manual {t} at the boundary (only tensors stack by instance)")
    instances = _instances([lay for lay in arg_lays + res_lays if lay.manual], n)
    per_instance = len(instances[0])
    _refuse_unreadable(spec, arg_shardings + out_shardings, n)
    ids = tuple(d for inst in instances for d in inst)
    mesh = SdyMesh(
        ((MESH_AXES[0], len(instances)), (MESH_AXES[1], per_instance)),
        None if ids == tuple(range(n)) else ids,
    )
    placement = _stacked_placement(arg_lays, res_lays, instances, n)
    lifted_spec = _lift_spec(spec, arg_lays, res_lays, arg_shardings, mesh, len(instances))
    lifted_impl = _lift_impl(impl, [lay.manual != () for lay in arg_lays], res_lays)
    return lifted_spec, lifted_impl, placement


def stacked_placement(
    arg_types: list, result_types: list, arg_shardings: list[str], out_shardings: list[str], n: int
) -> Placement:
    """Where each device's arguments and results live once manual boundary values are
    stacked by instance (global values keep their layouts): what the lifted pair is
    checked with, and what a replay on XLA cuts the stacked inputs by."""
    arg_lays = [_layout(s, t, n) for s, t in zip(arg_shardings, arg_types, strict=True)]
    res_lays = [_layout(s, t, n) for s, t in zip(out_shardings, result_types, strict=True)]
    instances = _instances([lay for lay in arg_lays + res_lays if lay.manual], n)
    return _stacked_placement(arg_lays, res_lays, instances, n)


def _stacked_placement(arg_lays, res_lays, instances, n: int) -> Placement:
    row_of = {d: i for i, inst in enumerate(instances) for d in inst}
    rows = len(instances)
    return Placement(
        1,
        n,
        [_stacked(lay, row_of, rows) if lay.manual else lay for lay in arg_lays],
        [_stacked(lay, row_of, rows) if lay.manual else lay for lay in res_lays],
    )


def _layout(sharding: str, t, n: int) -> Layout:
    shape = tuple(t.shape) if isinstance(t, TensorType) else ()  # a token: no elements
    lay = Layout.from_hlo_sharding(sharding, shape, n)
    if isinstance(lay, list):
        raise Unsupported(f"tuple sharding {sharding} at the boundary")
    if lay.manual and (lay.unreduced or lay.maximal is not None):
        raise Unsupported(f"manual sharding {sharding} with partial sums or one device")
    return lay


def _instances(manual: list[Layout], n: int) -> tuple[tuple[int, ...], ...]:
    """The manual instances (device groups) every manual boundary value shares, ordered by
    first device; one instance of every device when no boundary value is manual."""
    if not manual:
        return (tuple(range(n)),)
    found = {tuple(sorted(tuple(sorted(g)) for g in lay.manual)) for lay in manual}
    if len(found) != 1:
        shown = "; ".join(lay.desc for lay in manual)
        raise Unsupported(f"manual boundary values on different device groups ({shown})")
    groups = found.pop()
    if len({len(g) for g in groups}) != 1:
        raise Unsupported(f"manual instances of different sizes: {list(groups)}")
    return groups


def _stacked(lay: Layout, row_of: dict[int, int], rows: int) -> Layout:
    """The layout of the stacked value: device d holds row (its instance) of it, cut within
    the row as `lay` cuts the instance's value."""
    boxes = tuple(((row_of[d], row_of[d] + 1), *lay.boxes[d]) for d in range(lay.num_devices))
    return Layout(
        (rows, *lay.global_shape),
        lay.num_devices,
        boxes,
        (1, *lay.tile_shape),
        desc=f"one row per manual instance of {lay.desc}",
    )


def _refuse_unreadable(spec: Module, boundary: list[str], n: int) -> None:
    """What the whole-instance reading does not cover (module docstring): device ids where
    some value is partially manual, collectives outside manual values, and collectives on
    partially manual values other than all_reduce / collective_permute joining devices of
    distinct instances at the same place in them."""
    ops = [op for fn in spec.functions.values() for op in walk(fn.body)]
    texts = boundary + [op.attrs.get("mhlo.sharding") for op in ops]
    partial = any(isinstance(t, str) and is_partially_manual(t) for t in texts)
    for op in ops:
        if op.name in DEVICE_IDS and partial:
            raise Unsupported(
                f"{op.name} in a module with partially manual values (a device's id is no "
                "instance's value)",
                op=op.name,
                loc=op.loc,
            )
        if _is_collective(op):
            _check_collective(op, n)


def is_partially_manual(sharding: str) -> bool:
    """Manual over some tile dimensions only (`last_tile_dims={manual}`)."""
    return is_manual(sharding) and "last_tile_dim" in sharding


def _is_collective(op: Op) -> bool:
    from tv_ir.semantics.ops.registry import COLLECTIVES

    return op.name in COLLECTIVES


def _check_collective(op: Op, n: int) -> None:
    sharding = op.attrs.get("mhlo.sharding")
    t = op.results[0].type if op.results else None
    if not isinstance(sharding, str) or not is_manual(sharding) or not isinstance(t, TensorType):
        raise Unsupported(
            f"{op.name} on a value that is not manual (sharding {sharding}): a collective "
            "before partitioning has a meaning only in a manual region",
            op=op.name,
            loc=op.loc,
        )
    if not is_partially_manual(sharding):
        return  # every device its own value: the collective as it runs
    lay = Layout.from_hlo_sharding(sharding, t, n)
    if isinstance(lay, list):
        raise Unsupported(f"{op.name} with a tuple sharding", op=op.name, loc=op.loc)
    if op.name not in ELEMENTWISE_COLLECTIVES:
        raise Unsupported(
            f"{op.name} on a partially manual value (only all_reduce and collective_permute "
            "keep each instance's value whole)",
            op=op.name,
            loc=op.loc,
        )
    instance_of = {d: i for i, g in enumerate(lay.instances()) for d in g}
    if op.name == "stablehlo.all_reduce":
        if not op.attrs.get("use_global_device_ids"):
            raise Unsupported(f"{op.name} on a partially manual value without global device ids")
        members = [list(g) for g in np.asarray(op.attrs.get("replica_groups"))]
    else:
        members = [list(p) for p in np.asarray(op.attrs.get("source_target_pairs"))]
    for group in members:
        devices = [int(d) for d in group if int(d) >= 0]
        insts = [instance_of[d] for d in devices]
        boxes = {lay.boxes[d] for d in devices}
        if len(set(insts)) != len(insts) or len(boxes) != 1:
            raise Unsupported(
                f"{op.name} group {devices} joins devices of one manual instance or at "
                "different places in their instances",
                op=op.name,
                loc=op.loc,
            )


def _sharding(mesh: SdyMesh, rank: int, stacked: bool) -> SdySharding:
    first = (SdyAxis(MESH_AXES[0]),) if stacked else ()
    dims = ((first,) if stacked else ((),)) + tuple(() for _ in range(rank - 1))
    return SdySharding(mesh, dims if rank else ())


def _lift_spec(spec: Module, arg_lays, res_lays, arg_shardings, mesh: SdyMesh, rows: int):
    main = spec.main
    outer_args, inner_args, body_ops, mapping = [], [], [], {}
    in_shardings, out_shardings = [], []
    for v, lay, s in zip(main.args, arg_lays, arg_shardings, strict=True):
        t = v.type
        if lay.manual:
            outer_args.append(Value(TensorType((rows, *t.shape), t.dtype), v.name))
            inner = Value(TensorType((1, *t.shape), t.dtype), v.name)
            op = _produce(v, "stablehlo.reshape", inner, {})
            in_shardings.append(_sharding(mesh, len(t.shape) + 1, True))
        elif not isinstance(t, TensorType):  # a token: each device its own
            outer_args.append(Value(t, v.name))
            inner = Value(t, v.name)
            in_shardings.append(_sharding(mesh, 0, False))
            inner_args.append(inner)
            mapping[v.id] = inner
            continue
        else:
            outer_args.append(Value(t, v.name))
            inner = Value(t, v.name)
            # the argument's sharding, where @SPMDFullToShardShape reads it
            attrs = {"call_target_name": "Sharding", "mhlo.sharding": s}
            op = _produce(v, "stablehlo.custom_call", inner, attrs)
            in_shardings.append(_sharding(mesh, len(t.shape), False))
        inner_args.append(inner)
        body_ops.append(op)
        mapping[v.id] = op.results[0]
    body = clone_block(main.body, mapping)  # the spec as given stays as it was
    body_ops += body.ops
    inner_results, outer_results = [], []
    for r, lay in zip(body.results, res_lays, strict=True):
        t = r.type
        if lay.manual:
            row = Value(TensorType((1, *t.shape), t.dtype))
            body_ops.append(Op("stablehlo.reshape", [r], [row], loc=_loc(r)))
            row.owner = body_ops[-1]
            inner_results.append(row)
            outer_results.append(Value(TensorType((rows, *t.shape), t.dtype)))
            out_shardings.append(_sharding(mesh, len(t.shape) + 1, True))
        else:
            inner_results.append(r)
            outer_results.append(Value(t))
            out_shardings.append(_sharding(mesh, len(getattr(t, "shape", ())), False))
    region = Region(Block(inner_args, body_ops, inner_results))
    mc = Op(
        "sdy.manual_computation",
        list(outer_args),
        outer_results,
        {
            "in_shardings": in_shardings,
            "out_shardings": out_shardings,
            "manual_axes": MESH_AXES,
        },
        [region],
    )
    for k, v in enumerate(outer_results):
        v.owner, v.index = mc, k
    lifted = Function(
        main.name,
        Block(outer_args, [mc], list(outer_results)),
        [v.type for v in outer_results],
        [{} for _ in outer_args],
        [{} for _ in outer_results],
        list(main.arg_names),
        main.visibility,
    )
    return _with_main(spec, lifted)


def _lift_impl(impl: Module, stacked_args: list[bool], res_lays) -> Module:
    main = impl.main
    args, ops, mapping = [], [], {}
    for v, stacked in zip(main.args, stacked_args, strict=True):
        if not stacked:
            slot = Value(v.type, v.name)
            mapping[v.id] = slot
            args.append(slot)
            continue
        slot = Value(TensorType((1, *v.type.shape), v.type.dtype), v.name)
        op = _produce(v, "stablehlo.reshape", slot, {})
        ops.append(op)
        mapping[v.id] = op.results[0]
        args.append(slot)
    body = clone_block(main.body, mapping)  # the program as given stays as it was
    ops += body.ops
    results = []
    for r, lay in zip(body.results, res_lays, strict=True):
        if not lay.manual:
            results.append(r)
            continue
        slot = Value(TensorType((1, *r.type.shape), r.type.dtype))
        ops.append(Op("stablehlo.reshape", [r], [slot], loc=_loc(r)))
        slot.owner = ops[-1]
        results.append(slot)
    lifted = Function(
        main.name,
        Block(args, ops, results),
        [v.type for v in results],
        [{} for _ in args],
        [{} for _ in results],
        list(main.arg_names),
        main.visibility,
    )
    return _with_main(impl, lifted)


def _produce(v: Value, name: str, operand: Value, attrs: dict) -> Op:
    """An op computing (a new value standing for) block argument `v` from `operand`."""
    op = Op(name, [operand], [], dict(attrs))
    op.results.append(Value(v.type, v.name, op, 0))
    return op


def _loc(v: Value):
    from tv_ir.ir.program import UNKNOWN_LOC

    return v.owner.loc if v.owner is not None else UNKNOWN_LOC


def _with_main(module: Module, main: Function) -> Module:
    functions = dict(module.functions)
    functions[module.main.name] = main
    note = "manual boundary values stacked by instance"
    return dataclasses.replace(module, functions=functions, source=f"{module.source} ({note})")
