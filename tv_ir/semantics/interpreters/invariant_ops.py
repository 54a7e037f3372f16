"""Ops of a region whose values are the same at every evaluation of the region: computed
once per concrete run, not once per loop iteration.

A loop body over stacked layers holds dozens of constants and their broadcasts, reshapes
and converts; they do not read the body's arguments, so every iteration computes the same
arrays again (at 126 layers, a third of the ops the concrete run at the real layer count
evaluates). An op is *constant-derived* when it is pure (its results depend on its operands
and attributes alone: no device, no randomness, no region) and every operand is a result of
a constant-derived op of the same block; constants and iotas are the first. Such an op has
the same values every time its block runs, so the first values are kept and given again;
once the block has run whole, later runs do not visit those ops at all (their values are
still in the environment: each value is written by its op alone).

Only for concrete runs (numpy values): a symbolic algebra may make fresh symbols for a
constant (tables standing for any values). Kept arrays are made read-only, so an evaluator
that wrote into an operand would fail loudly rather than change a later iteration.
"""

from __future__ import annotations

import numpy as np

from tv_ir.ir.program import Block, Op
from tv_ir.semantics.ops.registry import ELEMENTWISE, REGION_ON_ARRAYS

# pure ops without regions whose results depend on their operands and attributes alone
PURE = ELEMENTWISE | frozenset(
    "stablehlo." + n
    for n in (
        "constant iota broadcast_in_dim reshape transpose slice concatenate pad reverse "
        "dynamic_slice dynamic_update_slice dot_general bitcast_convert"
    ).split()
)


def constant_derived(block: Block) -> frozenset[int]:
    """`id(op)` of the ops of `block` computed from constants alone (within the block)."""
    made: set[int] = set()  # ids of values made by constant-derived ops
    ops: set[int] = set()
    for op in block.ops:
        if op.name in PURE and not op.regions and all(v.id in made for v in op.operands):
            ops.add(id(op))
            made.update(v.id for v in op.results)
    return frozenset(ops)


class InvariantValues:
    """Per interpreter: each region's constant-derived ops, and their values once made."""

    def __init__(self):
        self._ops: dict[int, tuple[Block, frozenset[int]]] = {}
        self._values: dict[int, tuple[Op, object]] = {}
        # id(block) -> (block, its other ops), once the block has run whole in this interpreter
        self._varying: dict[int, tuple[Block, list[Op]]] = {}

    def of(self, block: Block, top: bool) -> frozenset[int] | None:
        """The ops of `block` whose values are made once; None for the top-level block (run
        once anyway) and for a region run on arrays standing for many scalars."""
        if top or REGION_ON_ARRAYS.get():
            return None
        known = self._ops.get(id(block))
        if known is None or known[0] is not block:
            known = self._ops[id(block)] = (block, constant_derived(block))
        return known[1]

    def to_run(self, block: Block) -> list[Op]:
        """The ops of `block` to evaluate: all of them until it has run whole once (`ran`),
        then only those not constant-derived: the others' values are in the environment
        already (each value is written by its op alone), the same objects as before."""
        known = self._varying.get(id(block))
        if known is None or known[0] is not block:
            return block.ops
        return known[1]

    def ran(self, block: Block, fixed: frozenset[int]) -> None:
        """`block` ran whole: its constant-derived values are made and in the environment."""
        known = self._varying.get(id(block))
        if known is None or known[0] is not block:
            self._varying[id(block)] = (block, [op for op in block.ops if id(op) not in fixed])

    def results(self, op: Op, evaluate):
        """`op`'s results: made by `evaluate(op)` the first time, the same objects after."""
        known = self._values.get(id(op))
        if known is None or known[0] is not op:
            out = evaluate(op)
            _read_only(out)
            known = self._values[id(op)] = (op, out)
        return known[1]


def _read_only(x) -> None:
    if isinstance(x, np.ndarray):
        x.flags.writeable = False
    elif isinstance(x, list | tuple):
        for y in x:
            _read_only(y)
    else:
        for attr in ("results", "value"):  # a device batch's Stacked, its One
            inner = getattr(x, attr, None)
            if inner is not None:
                _read_only(inner)
