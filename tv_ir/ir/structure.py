"""Structural signatures of ops and regions: what must be equal for two ops (or two
regions) to compute the same function of their operands, whatever their values are named.

Used where tv recognises the same computation twice: consecutive layers to reroll into a
loop (passes/reroll.py), and one data-dependent loop in two programs, whose results are
then the same function of the same initial state (tv_ir/semantics/ops/control.py).
"""

from __future__ import annotations

import re

import numpy as np

from tv_ir.ir.attrs import ChannelHandle
from tv_ir.ir.program import Block, Op

PAIRED_BY_CHANNEL = {"stablehlo.send", "stablehlo.recv"}  # the channel id is their meaning


def attr_key(value) -> object:
    """A hashable stand-in for an attribute value, equal exactly when the values are."""
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, list | tuple):
        return tuple(attr_key(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, attr_key(v)) for k, v in value.items()))
    return repr(value)


def op_signature(op: Op, ignored: frozenset = frozenset()) -> tuple:
    """What must be equal for two ops to be the same op of two blocks (not their operands'
    identities). A collective's channel id (XLA numbers them one by one) only says whether
    it is positive: all that its meaning reads of it. Attributes named in `ignored` (a
    partitioner's annotations) are left out."""
    attrs = []
    for k, v in sorted(op.attrs.items()):
        if k in ignored:
            continue
        if k == "channel_handle" and op.name not in PAIRED_BY_CHANNEL:
            v = (getattr(v, "type", None), channel_id(v) > 0)
        attrs.append((k, attr_key(v)))
    regions = tuple(region_signature(r.block, ignored) for r in op.regions)
    return (
        op.name,
        tuple(attrs),
        tuple(str(r.type) for r in op.results),
        tuple(str(v.type) for v in op.operands),
        regions,
    )


def channel_id(handle) -> int:
    """The handle's id (mhlo's opaque form read from its text)."""
    if isinstance(handle, ChannelHandle):
        return handle.handle
    m = re.search(r"handle\s*=\s*(-?\d+)", str(getattr(handle, "text", handle)))
    return int(m.group(1)) if m else 0


def region_signature(block: Block, ignored: frozenset = frozenset()) -> tuple:
    """A region's argument types and ops with their operands numbered inside it; a value
    from outside the region makes the signature unique (such regions never match)."""
    local = {a.id: ("arg", k) for k, a in enumerate(block.args)}
    out = []
    for n, op in enumerate(block.ops):
        operands = []
        for v in op.operands:
            if v.id not in local:
                return (object(),)
            operands.append(local[v.id])
        out.append((op_signature(op, ignored), tuple(operands)))
        for k, r in enumerate(op.results):
            local[r.id] = ("op", n, k)
    results = []
    for v in block.results:
        if v.id not in local:
            return (object(),)
        results.append(local[v.id])
    return (tuple(str(a.type) for a in block.args), tuple(out), tuple(results))


def reads_from_outside(block: Block) -> bool:
    """Whether an op of the region, or of a region nested in it at any depth, reads a value
    the region does not define (an implicit capture)."""
    defined: set[int] = set()
    used: list[int] = []
    stack = [block]
    while stack:
        b = stack.pop()
        defined.update(a.id for a in b.args)
        used.extend(v.id for v in b.results)
        for op in b.ops:
            defined.update(r.id for r in op.results)
            used.extend(v.id for v in op.operands)
            stack.extend(r.block for r in op.regions)
    return any(u not in defined for u in used)
