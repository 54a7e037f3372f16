"""Parallel execution: partition_id / replica_id, and the collective ops (spec "Collective ops").

Collectives are registered in their own table (`COLLECTIVES`) and run by
`tv_ir.semantics.interpreters.spmd.SpmdInterpreter` on every device at once:
`fn(ctx, grid, operands)` takes the
per-device operand lists (`operands[device_id]`) and returns the per-device result lists.
Process groups come from `grid.groups(...)` (the spec's strategy rule per op). Element
arithmetic goes through `ctx.alg` only, so the same evaluators run on symbolic values; the
single-device interpreter refuses collectives ("needs SPMD execution").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tv_ir.errors import BadInput
from tv_ir.ir.program import TensorType
from tv_ir.semantics.ops.reduction import assemble, fold, reducer_kind
from tv_ir.semantics.ops.registry import OpContext, collective, process_op

if TYPE_CHECKING:
    from tv_ir.semantics.interpreters.process_grid import ProcessGrid

PerDevice = list[list]  # [device_id][operand or result index]


# -- the process's position in the grid ---------------------------------------------------------


def _device(ctx):
    if ctx.device is None:
        raise ctx.unsupported(
            "needs SPMD execution (tv_ir.semantics.interpreters.spmd.SpmdInterpreter)"
        )
    return ctx.device


@process_op("stablehlo.partition_id")
def partition_id(ctx: OpContext) -> np.ndarray:
    """partition_id: the process's partition id, a ui32 0-d tensor."""
    return ctx.alg.constant(np.asarray(_device(ctx).partition_id), ctx.result_type)


@process_op("stablehlo.replica_id")
def replica_id(ctx: OpContext) -> np.ndarray:
    """replica_id: the process's replica id, a ui32 0-d tensor."""
    return ctx.alg.constant(np.asarray(_device(ctx).replica_id), ctx.result_type)


# -- helpers shared by the collectives ----------------------------------------------------------


def covering_groups(ctx, grid) -> list:
    """The op's process groups, which must hold every process exactly once (C1-C4)."""
    groups = grid.groups(ctx.name, ctx.attrs)
    seen = [d for g in groups for d in g]
    if len(seen) != len(set(seen)) or set(seen) != set(grid.devices):
        raise BadInput(
            f"{ctx.name}: process groups {[[d.device_id for d in g] for g in groups]} "
            f"must hold each of the {grid.num_processes} processes exactly once"
        )
    return groups


def _zeros(ctx, i: int) -> np.ndarray:
    t = ctx.result_types[i]
    return ctx.alg.constant(np.zeros(t.shape), t)


def _all_reduce_one(ctx, values: list, i: int) -> np.ndarray:
    """`computation` over one operand's values from the group's members, in group order.

    The spec leaves the schedule (binary tree) implementation-defined; recognised reducer
    bodies reduce in one algebra call, others are folded left to right per element.
    """
    arg_type = ctx.regions[0].block.args[0].type
    src = ctx.operand_types[i]
    if src.dtype != arg_type.dtype:  # to_destination_type(..., type(func_inputs(computation)[0]))
        dst = TensorType(src.shape, arg_type.dtype)
        values = [ctx.alg.convert(v, src, dst) for v in values]
    kind = reducer_kind(ctx)
    if kind is not None:
        stacked = values if isinstance(values, np.ndarray) else np.stack(values)
        return getattr(ctx.alg, kind[0])(stacked, (0,))
    values = [np.asarray(v) for v in values]
    shape = values[0].shape
    if not values[0].size:
        return values[0]
    scalars = []
    for idx in np.ndindex(*shape):
        acc = values[0][idx + (...,)]
        for v in values[1:]:
            acc = np.asarray(fold(ctx, 0, [acc], [v[idx + (...,)]])[0])
        scalars.append(acc)
    return assemble(shape, scalars)


# -- the collectives ------------------------------------------------------------------------------


def member_values(ctx: OpContext, values: list, i: int = 0, lead: int = 0) -> list:
    """What each member of a group gets from an all_reduce, all_gather or reduce_scatter of
    operand `i`, given the members' values in group order (a list, or one array stacking
    them along a first axis). One place for their meaning: device by device here, on the
    devices' stacked values in `device_batch` (`group_values`: `lead` dimensions ahead of
    the op's own in every value)."""
    name = ctx.name.split(".", 1)[-1]
    if name == "all_gather":
        gathered = np.concatenate(values, axis=lead + ctx.attr("all_gather_dim"))
        return [gathered] * len(values)
    reduced = _all_reduce_one(ctx, values, i)
    if name == "reduce_scatter":
        return np.split(reduced, len(values), axis=lead + ctx.attr("scatter_dimension"))
    return [reduced] * len(values)


def group_values(ctx: OpContext, stacked: np.ndarray) -> np.ndarray:
    """`member_values` of operand 0 for many groups of one size at once: `stacked` holds
    each group's members' values (groups, members, ...), the result what each member gets,
    shaped alike (each group's values reduced in the order a group alone reduces them)."""
    got = member_values(ctx, np.moveaxis(stacked, 1, 0), lead=1)
    return np.stack(got, axis=1)


def _by_group(ctx: OpContext, grid: ProcessGrid, operands: PerDevice) -> PerDevice:
    """Every device's results of a collective whose groups each combine their members'
    operands (`member_values`, operand by operand)."""
    results: PerDevice = [[] for _ in grid.devices]
    for group in covering_groups(ctx, grid):
        members = grid.rendezvous(group, operands)
        per_operand = [
            member_values(ctx, [m[i] for m in members], i) for i in range(len(members[0]))
        ]
        for k, d in enumerate(group):
            results[d.device_id] = [values[k] for values in per_operand]
    return results


@collective("stablehlo.all_reduce")
def all_reduce(ctx: OpContext, grid: ProcessGrid, operands: PerDevice) -> PerDevice:
    """all_reduce: every member gets `computation` applied across the group's operands
    (variadic: each operand reduced separately)."""
    return _by_group(ctx, grid, operands)


@collective("stablehlo.all_gather")
def all_gather(ctx: OpContext, grid: ProcessGrid, operands: PerDevice) -> PerDevice:
    """all_gather: every member gets the group's operands concatenated on `all_gather_dim`."""
    return _by_group(ctx, grid, operands)


@collective("stablehlo.reduce_scatter")
def reduce_scatter(ctx: OpContext, grid: ProcessGrid, operands: PerDevice) -> PerDevice:
    """reduce_scatter: all_reduce, split on `scatter_dimension` into one part per member;
    the member at `receiver_index` gets part `receiver_index`."""
    return _by_group(ctx, grid, operands)


@collective("stablehlo.all_to_all", "mhlo.all_to_all")
def all_to_all(ctx: OpContext, grid: ProcessGrid, operands: PerDevice) -> PerDevice:
    """all_to_all: each sender splits its operands on `split_dimension` into `split_count`
    parts; the receiver at `receiver_index` concatenates part `receiver_index` of every
    sender on `concat_dimension`. Without `split_dimension` (the tuple form, from HLO as
    `mhlo.all_to_all`), operand `receiver_index` of sender k becomes the receiver's result k."""
    if ctx.attr("split_dimension") is None:
        return _all_to_all_tuple(ctx, grid, operands)
    split, concat = ctx.attr("split_dimension"), ctx.attr("concat_dimension")
    count = ctx.attr("split_count")
    results: PerDevice = [[] for _ in grid.devices]
    for group in covering_groups(ctx, grid):
        if len(group) != count:
            raise BadInput(f"{ctx.name}: group size {len(group)} != split_count {count} (C8)")
        members = grid.rendezvous(group, operands)
        split_parts = [[np.split(x, count, axis=split) for x in m] for m in members]
        for k, d in enumerate(group):
            results[d.device_id] = [
                np.concatenate([parts[i][k] for parts in split_parts], axis=concat)
                for i in range(len(members[0]))
            ]
    return results


def _all_to_all_tuple(ctx: OpContext, grid: ProcessGrid, operands: PerDevice) -> PerDevice:
    results: PerDevice = [[] for _ in grid.devices]
    for group in covering_groups(ctx, grid):
        members = grid.rendezvous(group, operands)
        if len(members[0]) != len(group):
            raise BadInput(f"{ctx.name}: {len(members[0])} operands for a group of {len(group)}")
        for k, d in enumerate(group):
            results[d.device_id] = [m[k] for m in members]
    return results


@collective("stablehlo.collective_permute")
def collective_permute(ctx: OpContext, grid: ProcessGrid, operands: PerDevice) -> PerDevice:
    """collective_permute: each (source, target) group sends the source's operand to the
    target; processes that are no group's target get zeros."""
    results: PerDevice = [[_zeros(ctx, 0)] for _ in grid.devices]
    targets = set()
    for source, target in grid.groups(ctx.name, ctx.attrs):
        if target in targets:
            raise BadInput(f"{ctx.name}: process {target} is the target of two pairs (C3)")
        targets.add(target)
        results[target.device_id] = [operands[source.device_id][0]]
    return results


@collective("stablehlo.collective_broadcast")
def collective_broadcast(ctx: OpContext, grid: ProcessGrid, operands: PerDevice) -> PerDevice:
    """collective_broadcast: every member of a group gets the operands of the group's first
    process; processes in no group get zeros. (`has_dynamic_root`, newer than the StableHLO
    in jaxlib 0.10.2, is refused.)"""
    if ctx.attr("has_dynamic_root"):
        raise ctx.unsupported("has_dynamic_root is not supported")
    n = len(ctx.result_types)
    results: PerDevice = [[_zeros(ctx, j) for j in range(n)] for _ in grid.devices]
    for group in grid.groups(ctx.name, ctx.attrs):
        root = grid.rendezvous(group, operands)[0]
        for d in group:
            results[d.device_id] = list(root[:n])
    return results


@collective("mhlo.ragged_all_to_all")
def ragged_all_to_all(ctx: OpContext, grid: ProcessGrid, operands: PerDevice) -> PerDevice:
    """ragged_all_to_all (`jax.lax.ragged_all_to_all`; XLA:CPU cannot compile it): operands
    (operand, output, input_offsets, send_sizes, output_offsets, recv_sizes). With K offsets
    and G members, sender s sends rows operand[input_offsets[i] : + send_sizes[i]] of slice
    i to member i // (K / G), which writes them into its `output` at the sender's
    output_offsets[i]. Offsets and sizes must be known; sizes that disagree with the
    receiver's recv_sizes, slices out of bounds and overlapping writes are undefined
    behaviour in JAX's contract: unsupported, never given a meaning."""
    results: PerDevice = [[] for _ in grid.devices]
    for group in covering_groups(ctx, grid):
        members = grid.rendezvous(group, operands)
        g = len(group)
        known = [[_known_ints(ctx, m[n]) for n in range(2, 6)] for m in members]
        k = len(known[0][0])
        if k % g:
            raise BadInput(f"{ctx.name}: {k} offsets for a group of {g} (not a multiple)")
        per = k // g
        symbolic = any(np.asarray(m[n]).dtype == object for m in members for n in (0, 1))
        for j, d in enumerate(group):
            out = np.array(members[j][1], dtype=object if symbolic else None, copy=True)
            written = np.zeros(out.shape[0], dtype=bool)
            for s in range(g):
                in_off, send, out_off, _ = known[s]
                for t in range(per):
                    i = j * per + t
                    lo, size, dst = in_off[i], send[i], out_off[i]
                    if size != known[j][3][s * per + t]:
                        raise ctx.unsupported(
                            f"member {s} sends {size} rows where member {j} receives "
                            f"{known[j][3][s * per + t]} (undefined)"
                        )
                    source = np.asarray(members[s][0])
                    if not (0 <= lo <= lo + size <= source.shape[0]) or not (
                        0 <= dst <= dst + size <= out.shape[0]
                    ):
                        raise ctx.unsupported(f"slice {i} of member {s} is out of bounds")
                    if written[dst : dst + size].any():
                        raise ctx.unsupported(f"slices written twice on member {j}")
                    written[dst : dst + size] = True
                    out[dst : dst + size] = source[lo : lo + size]
            results[d.device_id] = [out]
    return results


def _known_ints(ctx: OpContext, x) -> list[int]:
    return [int(v) for v in np.asarray(ctx.alg.indices(x)).reshape(-1)]
