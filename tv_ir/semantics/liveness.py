"""Which devices' results of a block's ops reach the outputs, on one concrete run.

A reduction whose order XLA chooses matters only where its result is used: on a device
whose `select(partition_id == 0, r, 0)` picks the zeros, `r` is computed and thrown away
(XLA's programs for a value that lives on one device run the same reduce on every
device). `live_results` walks a block backwards from some of its results, per device,
with the run's values of each `select`'s predicate: a predicate that is all true (all
false) on a device makes only the first (second) branch live there. Everything else is
read conservatively: an op with a live result makes every operand live on that device; a
collective with a live result on any device makes its operands live on every device; an
op with regions makes every value its regions read live.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tv_ir.ir.program import Block, Op, Value, walk
from tv_ir.semantics.ops.registry import COLLECTIVES

ValueOf = Callable[[Value], "list | None"]
Live = list[frozenset[int]]  # per device: the indices of an op's results that are used


def live_results(
    block: Block, outputs: set[int] | None, value_of: ValueOf, devices: int
) -> dict[int, Live]:
    """id(op) -> per device, which of the op's results reach `outputs` (indices of the
    block's results; None: all of them) on the run `value_of` reads (each value's arrays
    per device, None where unknown). Ops of `block` only: nested ones are not listed (a
    caller takes those as live)."""
    live: list[set[int]] = [set() for _ in range(devices)]
    for k, v in enumerate(block.results):
        if outputs is None or k in outputs:
            for d in range(devices):
                live[d].add(v.id)
    found: dict[int, Live] = {}
    for op in reversed(block.ops):
        used = [
            frozenset(k for k, r in enumerate(op.results) if r.id in live[d])
            for d in range(devices)
        ]
        found[id(op)] = used
        on = [d for d in range(devices) if used[d]]
        if not on:
            continue
        reads = [v.id for v in op.operands] + _region_reads(op)
        if op.name in COLLECTIVES:
            on = range(devices)
        elif op.name == "stablehlo.select":
            branch = _branch_taken(value_of(op.operands[0]), devices)
            for d in on:
                ids = reads if branch[d] is None else [op.operands[0].id, op.operands[branch[d]].id]
                live[d].update(ids)
            continue
        for d in on:
            live[d].update(reads)
    return found


def _branch_taken(pred: list | None, devices: int) -> list[int | None]:
    """Per device, the operand a select takes everywhere (1 all true, 2 all false), or None."""
    out: list[int | None] = [None] * devices
    if pred is None or len(pred) != devices:
        return out
    for d, p in enumerate(pred):
        p = np.asarray(p)
        if p.dtype != np.bool_ or p.size == 0:
            continue
        if p.all():
            out[d] = 1
        elif not p.any():
            out[d] = 2
    return out


def _region_reads(op: Op) -> list[int]:
    """Every value the op's regions read (their own values included: harmless here)."""
    return [v.id for region in op.regions for inner in walk(region.block) for v in inner.operands]
