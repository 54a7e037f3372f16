"""Sums over devices of values that are the same on every one of them: counts of devices.

`psum(w, "model")` of a `w` that no device holds differently along "model" (a replicated
input, a value already summed over "model", a device's coordinate along another axis) is
`n x w` for the axis's n devices: a count of them, as `psum(1)` is. On a reduced mesh it is
`2 x w`, and a spec that multiplies by 2 (or an axis mixed up with another of the reduced
size) agrees there while the real programs differ. Such an axis keeps its size.

Which axes a value may differ along follows the program: an argument along the axes that
split it, a device's coordinate along its axis, a table read at `partition_id` along the
axes it is a position over, `partition_id` itself along all; an `all_reduce` or
`all_gather` over some axes makes its result the same along them; a `reduce_scatter`,
`all_to_all` or `collective_permute` makes it differ along theirs; any other op differs
along what its operands differ along (loops to a fixpoint). An axis a value is taken to
differ along when it does not keeps nothing; one it is taken to be the same along when it
differs would: the rules follow what ops can do, never less.
"""

from __future__ import annotations

from tv_ir.passes.shape_reduction.ranges import sums

from tv_ir.ir.program import Block, Op, read_operands

SPREADING = ("stablehlo.reduce_scatter", "stablehlo.all_to_all", "stablehlo.collective_permute")
UNIFORM = ("stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.collective_broadcast")
NONE: frozenset = frozenset()  # what a value no rule reached is taken to differ along


def varying_axes(t, body: Block, arg_axes: list) -> dict[int, frozenset]:
    """value id -> the axes (indices of `t.mesh`) along which devices may hold it
    differently; `arg_axes`: per block argument, for each dimension, the axes splitting it."""
    every = frozenset(range(len(t.mesh.sizes)))
    site_axes: dict[int, frozenset] = {}
    for s in t.sites:
        if s.kind == "stride":  # partition_id / stride: the position along the axes to here
            site_axes[id(s.op)] = frozenset(range(s.axes[0] + 1))
        elif s.kind in ("size", "table"):  # a coordinate, or a position over the axes
            site_axes[id(s.op)] = frozenset(s.axes)
    collective = {id(s.op): frozenset(s.axes) for s in t.sites if s.kind in ("groups", "pairs")}
    collective.update({id(s.op): every for s in t.sites if s.kind == "relabel"})
    out: dict[int, frozenset] = {}
    for a, axes in zip(body.args, arg_axes, strict=False):
        out[a.id] = frozenset(x for dim in axes for x in dim)
    for a in body.args[len(arg_axes) :]:
        out[a.id] = every
    _block(body, out, site_axes, collective, every)
    return out


def _block(block: Block, out: dict, site_axes: dict, collective: dict, every) -> None:
    for op in block.ops:
        ins = frozenset().union(*(out.get(v.id, NONE) for v in read_operands(op)))
        if op.name == "stablehlo.partition_id":
            got = [every] * len(op.results)
        elif id(op) in site_axes:
            got = [site_axes[id(op)]] * len(op.results)
        elif op.name in UNIFORM and id(op) in collective:
            got = [ins - collective[id(op)]] * len(op.results)
        elif op.name in SPREADING:
            got = [ins | collective.get(id(op), every)] * len(op.results)
        elif op.regions:
            got = _regions(op, ins, out, site_axes, collective, every)
        else:
            got = [ins] * len(op.results)
        for r, g in zip(op.results, got, strict=True):
            out[r.id] = g


def _regions(op: Op, ins, out: dict, site_axes: dict, collective: dict, every) -> list:
    """What each result of an op with regions differs along: a loop's state position by
    position, to a fixpoint, and what its condition does (the trip count); any other (a
    reduce's body, a case's branches) along all its operands and its regions' results."""
    if op.name == "stablehlo.while":
        state = [out.get(v.id, NONE) for v in op.operands]
        cond, body = op.regions[0].block, op.regions[1].block
        decided = NONE
        for _ in range(len(state) + 2):
            for block in (cond, body):
                for a, s in zip(block.args, state, strict=False):
                    out[a.id] = s
                _block(block, out, site_axes, collective, every)
            decided = frozenset().union(*(out.get(v.id, NONE) for v in cond.results))
            grown = [
                s | out.get(v.id, NONE) | decided for s, v in zip(state, body.results, strict=False)
            ]
            if grown == state:
                break
            state = grown
        return [s | decided for s in state]
    got = ins
    for region in op.regions:
        for a in region.block.args:
            out[a.id] = ins
        _block(region.block, out, site_axes, collective, every)
        got = got.union(*(out.get(v.id, NONE) for v in region.block.results))
    return [got] * len(op.results)


def keep_summed_copies(t, body: Block, arg_axes: list) -> None:
    """Keep each axis an `all_reduce` adds over while its operand is the same along it."""
    varies = varying_axes(t, body, arg_axes)
    for s in t.sites:
        op = s.op
        if s.kind != "groups" or op.name != "stablehlo.all_reduce" or not sums(op):
            continue
        along = frozenset().union(*(varies.get(v.id, NONE) for v in op.operands))
        for a in s.axes:
            if a not in along:
                t.keep(
                    a,
                    f"all_reduce at {op.loc} adds a value the same on every device along it "
                    "(a count of its devices)",
                )
