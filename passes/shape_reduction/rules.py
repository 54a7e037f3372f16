"""Shape rules: for each op, how its dimensions tie, and whether its meaning is size-generic.

An op is *size-generic* when each output element is a fixed kernel of operand elements at
index maps that are affine in the positions, with offsets that scale with the dimension
(elementwise ops, broadcasts, reshapes by factors, transposes, dots and reductions,
slices/pads/concatenations at offsets the factor divides, collectives, shard boundaries).
Everything else keeps its dimensions at their real sizes (`DimClasses.keep`), with the reason.

Integer values that act as positions are tracked beside the shapes (`Positions`):
- `iota` along a class gives *positions* of that class (`index`);
- integers computed from constants and `partition_id` alone are *known* per device (folded
  with the concrete op table), and where a known integer meets a position (an offset added
  to it, a bound compared with it, a `dynamic_slice` start) it is in that class's units: the
  factor must divide it, and the reduced program reads it divided (`Rescale`).
A position used any other way, and a start index computed from inputs, keep the class.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tv_ir.ir.program import (
    Block,
    Function,
    Module,
    Op,
    TensorType,
    Value,
    captured,
    holds_integers,
    read_operands,
    walk,
)

from ..expand_batch_norm import NORMALISED_LANE
from .aggregation import spread_dims
from .classes import DimClasses, Key
from .convolution import convolution_shapes
from .counts import ClassCounts
from .device_shares import sum_group_size
from .layer_stacks import MIN_LAYERS, LayerLoop, invariant_integers, layer_loop, trip_key
from .per_device import PerDevice, batched, combinations, results, stacked_results, table_rows
from .ranges import sums
from .sorts import sort_rule
from .windows import cumulative, whole_window

ELEMENTWISE = {
    "stablehlo." + n
    for n in (
        "add subtract multiply divide remainder power maximum minimum atan2 negate abs sign "
        "exponential exponential_minus_one log log_plus_one logistic sqrt rsqrt cbrt tanh "
        "sine cosine tan floor ceil round_nearest_afz round_nearest_even is_finite not and or "
        "xor shift_left shift_right_logical shift_right_arithmetic popcnt count_leading_zeros "
        "compare select clamp convert reduce_precision real imag complex bitcast_convert "
        "erf erf_inv lgamma digamma acos asin atan acosh asinh atanh sinh cosh"
    ).split()
} | {"chlo.erf", "chlo.erf_inv", "chlo.lgamma", "chlo.digamma", "mhlo.erf"}
# ops that map each row of a stacked operand to the same row of their result (the result
# type given the stacked dimension): folded for all combinations at once, as elementwise ops
ROW_WISE = {"stablehlo.reshape"}
# ops whose results are their operands, dimension by dimension
PASS_THROUGH = {
    "stablehlo.optimization_barrier",
    "mhlo.copy",
    "stablehlo.all_reduce",
    "stablehlo.collective_permute",
    "stablehlo.collective_broadcast",
    "sdy.sharding_constraint",
    "sdy.reshard",
}
# custom calls that only move a value between sharded and manual views
SHARDING_CALLS = {"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape"}
FOLD_LIMIT = 4096  # known integer tensors are folded up to this many elements per device
# an integer constant is one array for every device: known up to this many elements, so
# that XLA's per-device tables (one entry per device: 8,192 on 8,192 devices) are read
TABLE_LIMIT = 1 << 20


@dataclass
class Rescale:
    """Operand `operand` of `op` is a known integer in units of class `key`, one value per
    device: the reduced program reads (value + bias) / factor - bias on each device.
    `values` are the distinct values, and device d reads `values[which[d]]` (`which` None:
    the one value on every device)."""

    op: Op
    operand: int
    key: Key
    values: list[int]
    bias: int = 0
    which: np.ndarray | None = None


@dataclass
class Normaliser:
    """Operand `operand` of `op` is a float constant equal to the count (power 1) or its
    reciprocal (power -1) of the positions summed over (or spread over) in `keys`: the
    reduced program reads it at the reduced count."""

    op: Op
    operand: int
    keys: tuple[Key, ...]
    constant: int  # the value id of the constant operand
    # the constants that scaled the sum before this one (`sum / 8 / 4096`), as (op, operand,
    # value id): the count is their product with this one
    chain: tuple[tuple[Op, int, int], ...] = ()
    # the devices whose sums the sum adds (all_reduce group sizes multiplied): a count of
    # it read at one program's own sizes counts these devices too
    devices: int = 1


@dataclass
class Positions:
    index: dict[int, Key] = field(default_factory=dict)  # value id -> its positions' class
    known: dict[int, PerDevice] = field(default_factory=dict)  # per device (distinct values)
    independent: set[int] = field(default_factory=set)  # value ids that read no input
    rescales: list[Rescale] = field(default_factory=list)
    numbers: set[int] = field(default_factory=set)  # positions converted to floats
    floats: dict[int, float] = field(default_factory=dict)  # splat float constants
    # values that are sums over (or copies spread along) dimensions: value id -> their keys
    summed: dict[int, tuple[Key, ...]] = field(default_factory=dict)
    # sums added over devices (all_reduce): value id -> the devices each element adds
    psummed: dict[int, int] = field(default_factory=dict)
    normalisers: list[Normaliser] = field(default_factory=list)
    # sums scaled by float constants: value id -> (the sum's keys, the constants so far, as
    # Normaliser.chain)
    scaled_sums: dict[int, tuple[tuple[Key, ...], tuple]] = field(default_factory=dict)
    # results of `x * c` / `x / c` with c a float constant: value id -> (op, operand of c)
    scaled: dict[int, tuple[Op, int]] = field(default_factory=dict)
    # values scaled element by element by float constants in a row (`y / 4096`): value id ->
    # those constants, as Normaliser.chain; and sums of such values: sum's id -> the same
    scaled_values: dict[int, tuple] = field(default_factory=dict)
    pre_scaled: dict[int, tuple] = field(default_factory=dict)
    # sizes that became values (a sum over values that read no input): (size, where)
    counts: list[tuple[int, object]] = field(default_factory=list)
    # values that are one element broadcast (splat constants, broadcasts of a scalar): value
    # id -> the op making it; an elementwise op reads its own copy at its own shape
    splats: dict[int, Op] = field(default_factory=dict)
    # every use of a float constant by an arithmetic op: (op, operand, value id)
    float_uses: list[tuple[Op, int, int]] = field(default_factory=list)
    # splats of c / N spread over positions (the cotangent of a mean): value id -> (op,
    # operand of N); each elementwise use normalises the positions of its own shape
    spread_splats: dict[int, tuple[Op, int]] = field(default_factory=dict)
    # finite float tables proved for every value they could hold: value id -> constant op
    tables: dict[int, Op] = field(default_factory=dict)
    # loops whose counter only picks layers (layer_stacks.py), and their index values:
    # value id -> the trip count's key
    layer_loops: list[LayerLoop] = field(default_factory=list)
    layer_starts: dict[int, Key] = field(default_factory=dict)
    # positions offset by known integers: value id -> the largest |offset| added so far
    shifts: dict[int, int] = field(default_factory=dict)
    # ops whose results hold positions computed in their element type (a convert, an add
    # of an offset): (op, the positions' class, the largest |offset|); `narrow_positions`
    widths: list[tuple[Op, Key, int]] = field(default_factory=list)


def dims_of(d: DimClasses, v: Value, where: str) -> list[Key]:
    t = v.type
    if not isinstance(t, TensorType):
        return []
    return [d.add((v.id, a), n, f"{where} dim {a}") for a, n in enumerate(t.shape)]


class ShapeRules:
    """Walks one program, tying its dimensions and tracking positions."""

    def __init__(
        self,
        dims: DimClasses,
        module: Module,
        side: str,
        num_partitions: int,
        num_replicas: int,
        tables: bool = True,
    ):
        self.d = dims
        self.tables = tables  # finite float tables may become symbols (rule_constant)
        self.module = module
        self.side = side
        self.num_partitions = num_partitions
        self.num_devices = num_partitions * num_replicas
        self.pos = Positions()
        self._evaluators = None
        self.counts = ClassCounts(dims, self.keys)  # counts compared keep their classes

    # -- walking ---------------------------------------------------------------------------

    def run(self, fn: Function) -> None:
        for k, a in enumerate(fn.args):
            dims_of(self.d, a, f"{self.side} argument {k}")
        self.block(fn.body)
        for k, r in enumerate(fn.body.results):
            dims_of(self.d, r, f"{self.side} result {k}")

    def block(self, block: Block) -> None:
        for op in block.ops:
            for r in op.results:
                dims_of(self.d, r, f"{op.short_name} at {op.loc}")
            if op.operands and all(v.id in self.pos.independent for v in read_operands(op)):
                self.pos.independent.update(r.id for r in op.results)
            self.op(op)
            self.counts.step(op, self.pos.independent, self.pos.tables)

    def op(self, op: Op) -> None:
        name = op.name
        if name in ELEMENTWISE:
            return self.elementwise(op)
        rule = getattr(self, "rule_" + op.short_name.replace(".", "_"), None)
        if name == "stablehlo.custom_call":
            target = op.attrs.get("call_target_name")
            if target in SHARDING_CALLS:
                return self.pass_through(op)
            return self.keep_all(op, f"custom_call @{target}")
        if name in PASS_THROUGH:
            return self.pass_through(op)
        if rule is not None and (name.startswith("stablehlo.") or name.startswith("sdy.")):
            return rule(op)
        return self.keep_all(op, f"{name} (no shape rule)")

    # -- helpers ---------------------------------------------------------------------------

    def keys(self, v: Value) -> list[Key]:
        return dims_of(self.d, v, "")

    def tie_all(self, a: Value, b: Value) -> None:
        ka, kb = self.keys(a), self.keys(b)
        if len(ka) == len(kb):
            for x, y in zip(ka, kb, strict=True):
                self.d.tie(x, y)

    def keep_value(self, v: Value, why: str) -> None:
        for k in self.keys(v):
            self.d.keep(k, why)

    def keep_all(self, op: Op, why: str) -> None:
        for v in list(op.operands) + list(op.results):
            self.keep_value(v, why)
        for region in op.regions:
            for inner in walk(region.block):
                # a region may use values of the enclosing block (captures): they too
                for v in list(inner.operands) + list(inner.results):
                    self.keep_value(v, why)
            for v in list(region.block.args) + list(region.block.results):
                self.keep_value(v, why)
        for v in op.operands:
            self.untrack(v, why)

    def untrack(self, v: Value, why: str) -> None:
        """A position used in a way tv does not follow: its class keeps its size."""
        key = self.pos.index.get(v.id)
        if key is not None:
            self.d.keep(key, f"positions used by {why}")

    def pass_through(self, op: Op) -> None:
        group = sum_group_size(op) if op.name == "stablehlo.all_reduce" else None
        for a, b in zip(op.operands, op.results, strict=False):
            self.tie_all(a, b)
            self.carry(a, b)
            if group and b.id in self.pos.summed:
                self.pos.psummed[b.id] = self.pos.psummed.get(a.id, 1) * group

    def _carry_sums(self, a: Value, b: Value) -> None:
        if a.id in self.pos.summed:
            self.pos.summed[b.id] = self.pos.summed[a.id]
        if a.id in self.pos.psummed:
            self.pos.psummed[b.id] = self.pos.psummed[a.id]
        if a.id in self.pos.scaled_sums:
            self.pos.scaled_sums[b.id] = self.pos.scaled_sums[a.id]
        if a.id in self.pos.pre_scaled:
            self.pos.pre_scaled[b.id] = self.pos.pre_scaled[a.id]
        if a.id in self.pos.scaled:
            self.pos.scaled[b.id] = self.pos.scaled[a.id]
        if a.id in self.pos.floats:
            self.pos.floats[b.id] = self.pos.floats[a.id]

    def carry(self, a: Value, b: Value) -> None:
        """b holds a's positions, sums, float constant or known values."""
        self._carry_sums(a, b)
        key = self.pos.index.get(a.id)
        if key is not None:
            self.pos.index[b.id] = key
            if a.id in self.pos.shifts:
                self.pos.shifts[b.id] = self.pos.shifts[a.id]
        if a.id in self.pos.known:
            self.fold_into(b)

    # -- positions and known integers ------------------------------------------------------

    def fold(self, op: Op) -> None:
        """Fold op on every device when all its operands are known (small integer tensors):
        once per distinct combination of its operands' values (per_device.py); an op that
        reads the device itself (not in the op table of device-independent ops) on each."""
        if op.regions or not all(v.id in self.pos.known for v in op.operands):
            return
        if any(
            not isinstance(r.type, TensorType) or r.type.is_float or r.type.size > FOLD_LIMIT
            for r in op.results
        ):
            return
        from tv_ir.semantics.ops.registry import OPS

        operands = [self.pos.known[v.id] for v in op.operands]
        try:  # not foldable here: the value is simply not known
            if op.name in OPS:
                folded = self._fold_distinct(op, operands)
            else:
                folded = self._fold_each(op, operands)
        except Exception:
            return
        for r, x in zip(op.results, folded, strict=True):
            self.pos.known[r.id] = x

    def _fold_distinct(self, op: Op, operands: list[PerDevice]) -> list[PerDevice]:
        """A device-independent op, evaluated once per distinct combination of operand
        values (an elementwise op over all of them at once)."""
        from tv_ir.semantics.interpreters.evaluator import refuse_complex, run_evaluator
        from tv_ir.semantics.ops.registry import OPS

        combos, which = combinations(operands)
        ev = self._evaluator(int(np.argmax(which == 0)) if len(which) else 0)
        types = [v.type for v in (*op.operands, *op.results)]
        stack = None
        if op.name in ELEMENTWISE or op.name in ROW_WISE:
            stack = batched(types, operands, combos, op.name in ELEMENTWISE)
        if stack is not None and len(combos) > 1:
            arrays, wide = stack
            refuse_complex(op)
            ctx = ev.context(op)
            ctx.operand_types = [wide(v.type) for v in op.operands]
            ctx.result_types = [wide(r.type) for r in op.results]
            out = run_evaluator(op, lambda: OPS[op.name](ctx, *arrays))
            out = out if isinstance(out, list) else [out]
            outs = []
            for x, r in zip(out, op.results, strict=True):
                outs.append(np.asarray(x).astype(r.type.numpy_dtype))
                if outs[-1].shape != (len(combos), *r.type.shape):
                    raise ValueError(f"{op.name} folded to shape {outs[-1].shape}")
            return stacked_results(outs, which)
        if op.name == "stablehlo.dynamic_slice" and operands[0].count == 1:
            # a lookup in one table at each device's start (XLA's `table[partition_id]`)
            table = np.asarray(operands[0].values[0])
            if table.dtype != object and len(combos) > 1:
                rows = table_rows(table, operands[1:], combos, op.attrs["slice_sizes"])
                return stacked_results([rows], which)
        per_combo = []
        for c in combos:
            for v, x, i in zip(op.operands, operands, c, strict=True):
                ev.env[v.id] = x.values[i]
            per_combo.append(ev.evaluate_op(op))
        return results(per_combo, which)

    def _fold_each(self, op: Op, operands: list[PerDevice]) -> list[PerDevice]:
        """An op that may read the device (`partition_id`, a collective), on every device."""
        outs = []
        for dev in range(self.num_devices):
            ev = self._evaluator(dev)
            for v, x in zip(op.operands, operands, strict=True):
                ev.env[v.id] = x[dev]
            outs.append(ev.evaluate_op(op))
        return [PerDevice.of([o[k] for o in outs]) for k in range(len(op.results))]

    def fold_into(self, b: Value) -> None:
        if b.owner is not None:
            self.fold(b.owner)

    def _evaluator(self, dev: int):
        """Device dev's evaluator of single ops (made when first used)."""
        from tv_ir.semantics.algebra import NumpyAlgebra
        from tv_ir.semantics.interpreters.evaluator import BlockEvaluator
        from tv_ir.semantics.interpreters.process_grid import Device

        if self._evaluators is None:
            self._evaluators = {}
        ev = self._evaluators.get(dev)
        if ev is None:
            device = Device(dev // self.num_partitions, dev % self.num_partitions, dev)
            ev = self._evaluators[dev] = BlockEvaluator(self.module, NumpyAlgebra(), device=device)
        return ev

    def in_units(self, op: Op, operand: int, key: Key, bias: int = 0) -> bool:
        """Operand `operand` of op is an offset in class `key`'s units: it must be known on
        every device, one value per device (a scalar, or a scalar broadcast), and the factor
        must divide it (+ `bias`: `p <= b` reads as `p < b + 1`)."""
        v = op.operands[operand]
        vals = self.pos.known.get(v.id)
        if vals is None:
            self.d.keep(key, f"{op.short_name} at {op.loc} offsets positions by input values")
            return False
        scalars = vals.scalars()  # the distinct values, in the order of the first device
        if scalars is None:
            self.d.keep(key, f"{op.short_name} at {op.loc} offsets positions unevenly")
            return False
        self.d.divides_each(key, [x + bias for x in scalars])
        if any(scalars):
            self.pos.rescales.append(Rescale(op, operand, key, scalars, bias, vals.which))
        return True

    def _shifted(self, op: Op, k: int, key: Key) -> None:
        """op's result is operand k's positions offset by the other (known) operand."""
        res = op.results[0]
        self.pos.index[res.id] = key
        offsets = self.pos.known[op.operands[1 - k].id].scalars() or [0]
        shift = self.pos.shifts.get(op.operands[k].id, 0) + max(abs(int(x)) for x in offsets)
        if shift:
            self.pos.shifts[res.id] = shift
        self.pos.widths.append((op, key, shift))

    def normaliser(self, op: Op) -> None:
        """`sum * (1/N)`, `sum / N`, `spread / N`: a float constant that may be the count of
        what is summed (checked against the classes' sizes once they are known)."""
        name = op.short_name
        if name == "convert":
            self._carry_sums(op.operands[0], op.results[0])
        if name == "negate":  # still a sum, which a count normalises
            a, b = op.operands[0], op.results[0]
            if a.id in self.pos.summed:
                self.pos.summed[b.id] = self.pos.summed[a.id]
            if a.id in self.pos.psummed:
                self.pos.psummed[b.id] = self.pos.psummed[a.id]
            if a.id in self.pos.scaled_sums:
                self.pos.scaled_sums[b.id] = self.pos.scaled_sums[a.id]
            if a.id in self.pos.pre_scaled:
                self.pos.pre_scaled[b.id] = self.pos.pre_scaled[a.id]
            if a.id in self.pos.floats:
                self.pos.floats[b.id] = -self.pos.floats[a.id]
        if name not in ("multiply", "divide") or len(op.operands) != 2:
            for k, v in enumerate(op.operands):
                if v.id in self.pos.floats and name != "convert":
                    self.pos.float_uses.append((op, k, v.id))
            return
        res = op.results[0]
        for k, (c, other) in enumerate((op.operands, op.operands[::-1])):
            if c.id not in self.pos.floats or (name == "divide" and k == 0):
                continue  # N / sum: not a normaliser
            use = ((op, k, c.id),)
            g = self.pos.psummed.get(other.id, 1)
            if other.id in self.pos.summed:
                keys = self.pos.summed[other.id]
                self.pos.normalisers.append(Normaliser(op, k, keys, c.id, devices=g))
                self.pos.scaled_sums[res.id] = (keys, use)
                if g > 1:
                    self.pos.psummed[res.id] = g
                pre = self.pos.pre_scaled.get(other.id)
                if pre:  # `sum(y / 4096) / 8`: the count may be split across the sum
                    self.pos.normalisers.append(Normaliser(op, k, keys, c.id, pre, g))
            elif other.id in self.pos.scaled_sums:  # one more constant: counts with the rest
                keys, before = self.pos.scaled_sums[other.id]
                self.pos.normalisers.append(Normaliser(op, k, keys, c.id, before, g))
                if g > 1:
                    self.pos.psummed[res.id] = g
                self.pos.scaled_sums[res.id] = (keys, before + use)
            elif other.id not in self.pos.floats and other.type == res.type:
                prior = self.pos.scaled_values.get(other.id, ())
                self.pos.scaled_values[res.id] = prior + use
        for k, v in enumerate(op.operands):
            if v.id in self.pos.floats:
                self.pos.float_uses.append((op, k, v.id))
        for k, (a, b) in enumerate((op.operands, op.operands[::-1])):
            if a.id in self.pos.floats and b.id not in self.pos.floats:
                self.pos.scaled[res.id] = (op, k)
        a, b = op.operands
        if name == "divide" and a.id in self.pos.floats and self.pos.floats.get(b.id):
            # c / N of two constants (the cotangent of a mean, before XLA folds it): a
            # constant scaled by N, which spread over N positions normalises them
            self.pos.floats[res.id] = self.pos.floats[a.id] / self.pos.floats[b.id]
            self.pos.scaled[res.id] = (op, 1)

    # -- rules -----------------------------------------------------------------------------

    def elementwise(self, op: Op) -> None:
        if op.name == "stablehlo.bitcast_convert" and _rank(op.operands[0]) != _rank(op.results[0]):
            return self.keep_all(op, f"bitcast_convert at {op.loc} between element widths")
        # a splat (one value broadcast) says nothing about the dimensions it is used at: it
        # may be shared (CSE) by uses of other meanings; each use reads its own copy
        ins = [v for v in op.operands if _rank(v) > 0]
        if ins and all(v.id in self.pos.splats for v in ins) and len(op.results) == 1:
            self.pos.splats[op.results[0].id] = op  # a splat computed from splats
        ranked = [
            v
            for v in list(op.operands) + list(op.results)
            if _rank(v) > 0 and v.id not in self.pos.splats
        ]
        for v in ranked[1:]:
            self.tie_all(ranked[0], v)
        spread = [v for v in op.operands if v.id in self.pos.spread_splats]
        if len(spread) == 1 and op.results[0].id in self.pos.splats:
            # a spread constant times other constants: still spread, by the same N
            self.pos.spread_splats[op.results[0].id] = self.pos.spread_splats[spread[0].id]
        elif ranked and len(op.results) == 1:
            for v in op.operands:
                if v.id in self.pos.spread_splats:
                    src, k = self.pos.spread_splats[v.id]
                    keys = tuple(self.keys(op.results[0]))
                    self.pos.normalisers.append(Normaliser(src, k, keys, src.operands[k].id))
        self.fold(op)
        self.normaliser(op)
        idx = [self.pos.index.get(v.id) for v in op.operands]
        if not any(k is not None for k in idx):
            return
        name, res = op.short_name, op.results[0]
        floats = any(v.id in self.pos.numbers for v in op.operands)
        if name == "convert":
            self.pos.index[res.id] = idx[0]
            shift = self.pos.shifts.get(op.operands[0].id, 0)
            if shift:
                self.pos.shifts[res.id] = shift
            self.pos.widths.append((op, idx[0], shift))
            if res.type.is_float or floats:
                # positions as numbers (RoPE angles): they stay tracked, and the class keeps
                # two positions so the kernel is seen away from position 0
                self.pos.numbers.add(res.id)
                self.d.at_least(idx[0], 2)
            return
        if floats:
            if name in ("multiply", "divide") and all(
                k is None or v.id in self.pos.numbers for k, v in zip(idx, op.operands, strict=True)
            ):
                return  # angle = position * frequency: a value from here on
            for k in idx:
                if k is not None:
                    self.d.keep(k, f"positions as numbers used by {name} at {op.loc}")
            return
        if name == "compare":
            a, b = idx
            if a is not None and b is not None:  # a mask: each block keeps both sides
                self.d.tie(a, b)
                self.d.at_least(a, 2)
                self.d.at_least(b, 2)
                return
            other = 1 if a is not None else 0
            key = a if a is not None else b
            direction = str(op.attrs.get("comparison_direction"))
            if other == 0:  # c OP p  ==  p OP' c
                direction = {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE"}.get(
                    direction, direction
                )
            # p < b and p >= b tell blocks of positions apart when the factor divides b,
            # p <= b and p > b when it divides b + 1; p == b picks one position
            bias = {"LT": 0, "GE": 0, "LE": 1, "GT": 1}.get(direction)
            if bias is None or op.operands[other].id not in self.pos.known:
                self.d.keep(key, f"positions compared by {direction} at {op.loc}")
                return
            self.in_units(op, other, key, bias)
            return
        if name in ("add", "subtract") and idx[0] is not None and idx[1] is None:
            if self.in_units(op, 1, idx[0]):
                self._shifted(op, 0, idx[0])
            return
        if name == "add" and idx[1] is not None and idx[0] is None:
            if self.in_units(op, 0, idx[1]):
                self._shifted(op, 1, idx[1])
            return
        for k in idx:
            if k is not None:
                self.d.keep(k, f"positions used by {op.short_name} at {op.loc}")

    def rule_constant(self, op: Op) -> None:
        value = np.asarray(op.attrs.get("value"))
        r = op.results[0]
        self.pos.independent.add(r.id)
        splat = value.size <= 1 or bool(np.all(value.reshape(-1) == value.reshape(-1)[0]))
        if splat and value.ndim:
            self.pos.splats[r.id] = op
        if not splat and self.tables and r.type.is_float and np.all(np.isfinite(value)):
            # a table of finite floats (RoPE frequencies computed with numpy): its elements
            # become symbols shared by both programs (TABLE_ATTR), so what is proved holds
            # for every value the table could hold, its own included, and its dimensions
            # shrink like an argument's
            self.pos.independent.discard(r.id)
            self.pos.tables[r.id] = op
        elif not splat:
            # a table of values by position (a mask built with numpy, an integer table):
            # nothing says which function of position it holds, so its dimensions keep
            # their sizes
            for k, n in zip(self.keys(r), r.type.shape, strict=True):
                if n > 1:
                    self.d.keep(k, f"constant tensor at {op.loc}")
        elif r.type.is_float and value.size:
            self.pos.floats[r.id] = float(value.reshape(-1)[0])
        if isinstance(r.type, TensorType) and not r.type.is_float:
            if value.size <= TABLE_LIMIT:
                self.pos.known[r.id] = PerDevice.same(value, self.num_devices)
            elif splat:
                flat = np.asarray(value.reshape(-1)[:1]).reshape(())
                wide = np.broadcast_to(flat, value.shape)
                self.pos.known[r.id] = PerDevice.same(wide, self.num_devices)

    def rule_iota(self, op: Op) -> None:
        r = op.results[0]
        self.pos.independent.add(r.id)
        key = self.keys(r)[op.attrs["iota_dimension"]]
        self.pos.index[r.id] = key
        self.pos.widths.append((op, key, 0))  # `jnp.arange(n, dtype=jnp.int8)` wraps too
        if r.type.is_float:  # `jnp.arange(n, dtype=f32)`: positions as numbers already
            self.pos.numbers.add(r.id)
            self.d.at_least(key, 2)

    def rule_partition_id(self, op: Op) -> None:
        self.pos.independent.add(op.results[0].id)
        ids = np.arange(self.num_devices)
        partitions = [np.asarray(p, dtype=np.uint32) for p in range(self.num_partitions)]
        self.pos.known[op.results[0].id] = PerDevice(partitions, ids % self.num_partitions)

    def rule_replica_id(self, op: Op) -> None:
        self.pos.independent.add(op.results[0].id)
        ids = np.arange(self.num_devices)
        replicas = [np.asarray(r, dtype=np.uint32) for r in range(len(ids) // self.num_partitions)]
        self.pos.known[op.results[0].id] = PerDevice(replicas, ids // self.num_partitions)

    def rule_broadcast_in_dim(self, op: Op) -> None:
        x, r = op.operands[0], op.results[0]
        kx, kr = self.keys(x), self.keys(r)
        if not kx:
            self.pos.splats[r.id] = op
        for i, j in enumerate(op.attrs["broadcast_dimensions"]):
            if x.type.shape[i] == r.type.shape[j]:
                self.d.tie(kx[i], kr[j])
        key = self.pos.index.get(x.id)
        if key is not None:
            self.pos.index[r.id] = key
        if x.id in self.pos.numbers:
            self.pos.numbers.add(r.id)
        if x.id in self.pos.floats:
            self.pos.floats[r.id] = self.pos.floats[x.id]
        spread = tuple(kr[j] for j in spread_dims(op))  # the positions it spreads over
        if not spread and x.id in self.pos.scaled:  # the same values, unit dimensions added
            self.pos.scaled[r.id] = self.pos.scaled[x.id]
        if spread or x.id in self.pos.summed:
            self.pos.summed[r.id] = self.pos.summed.get(x.id, ()) + spread
            if x.id in self.pos.psummed:
                self.pos.psummed[r.id] = self.pos.psummed[x.id]
        if x.id in self.pos.spread_splats:  # a spread constant broadcast further
            src, k = self.pos.spread_splats[x.id]
            if r.id in self.pos.splats:
                self.pos.spread_splats[r.id] = (src, k)
            else:
                self.pos.normalisers.append(Normaliser(src, k, tuple(kr), src.operands[k].id))
        if spread and x.id in self.pos.scaled:  # (g / N) broadcast over the N positions
            src, k = self.pos.scaled[x.id]
            if r.id in self.pos.splats:
                # a constant spread: its dimensions are its own (splats tie nothing); the
                # positions it spreads over are those of each elementwise use (elementwise)
                self.pos.spread_splats[r.id] = (src, k)
            else:
                self.pos.normalisers.append(Normaliser(src, k, spread, src.operands[k].id))
        self._splat(op)

    def _splat(self, op: Op) -> None:
        """A known scalar broadcast stays known (as a broadcast view, never materialised)."""
        x, r = op.operands[0], op.results[0]
        vals = self.pos.known.get(x.id)
        if vals is None:
            return
        if r.type.size <= FOLD_LIMIT:
            self.fold(op)
        elif all(np.asarray(v).size == 1 for v in vals.values):
            shape = r.type.shape
            self.pos.known[r.id] = vals.mapped(
                lambda v: np.broadcast_to(np.asarray(v).reshape(()), shape)
            )

    def rule_reshape(self, op: Op) -> None:
        x, r = op.operands[0], op.results[0]
        kx, kr = self.keys(x), self.keys(r)
        for gx, gr in factor_groups(x.type.shape, r.type.shape):
            if len(gx) == 1 and len(gr) == 1:
                self.d.tie(kx[gx[0]], kr[gr[0]])
            elif len(gx) == 1 or len(gr) == 1:
                whole, parts = (kx[gx[0]], [kr[j] for j in gr])
                if len(gx) != 1:
                    whole, parts = (kr[gr[0]], [kx[i] for i in gx])
                self.d.product(whole, tuple(parts))
                # each part keeps two positions, so the order the parts are merged in
                # (which one is major) stays observable
                for k in parts:
                    self.d.at_least(k, 2)
            else:
                for k in [kx[i] for i in gx] + [kr[j] for j in gr]:
                    self.d.keep(k, f"reshape at {op.loc} regroups dimensions")
        key = self.pos.index.get(x.id)
        if key is not None:
            # the elements are still positions of their class, whatever the shape (an
            # argsort's indices regrouped around XLA's all_to_all)
            self.pos.index[r.id] = key
        self._carry_sums(x, r)
        self._splat(op)

    def rule_transpose(self, op: Op) -> None:
        x, r = op.operands[0], op.results[0]
        kx, kr = self.keys(x), self.keys(r)
        for j, i in enumerate(op.attrs["permutation"]):
            self.d.tie(kx[i], kr[j])
        self.carry(x, r)

    def rule_dot_general(self, op: Op) -> None:
        lhs, rhs, r = op.operands[0], op.operands[1], op.results[0]
        dn = op.attrs["dot_dimension_numbers"]
        kl, kq, kr = self.keys(lhs), self.keys(rhs), self.keys(r)
        out = []
        for i, j in zip(dn.lhs_batch, dn.rhs_batch, strict=True):
            self.d.tie(kl[i], kq[j])
            out.append(kl[i])
        for i, j in zip(dn.lhs_contract, dn.rhs_contract, strict=True):
            self.d.tie(kl[i], kq[j])
            self.d.at_least(kl[i], 2)
            self.d.at_least(kq[j], 2)
            if lhs.id in self.pos.independent and rhs.id in self.pos.independent:
                self.d.keep(kl[i], f"dot_general at {op.loc} sums values that read no input")
        if dn.lhs_contract:
            self.pos.summed[r.id] = tuple(kl[i] for i in dn.lhs_contract)
        out += [kl[i] for i in range(len(kl)) if i not in dn.lhs_batch + dn.lhs_contract]
        out += [kq[j] for j in range(len(kq)) if j not in dn.rhs_batch + dn.rhs_contract]
        for a, b in zip(out, kr, strict=True):
            self.d.tie(a, b)
        for v in (lhs, rhs):
            self.untrack(v, f"dot_general at {op.loc}")

    def rule_convolution(self, op: Op) -> None:
        """Batch and features scale like a dot's, groups by their own class, spatial
        dimensions where the window is size-generic (`convolution.convolution_shapes`)."""
        convolution_shapes(self, op)

    def rule_reduce(self, op: Op) -> None:
        n = len(op.operands) // 2
        axes = tuple(op.attrs["dimensions"])
        for x in op.operands[1:n]:  # a variadic reduce (argmax) walks its inputs together
            self.tie_all(op.operands[0], x)
        if n == 1 and all(op.operands[0].type.shape[a] == 1 for a in axes):
            # a sum over one element (keepdims undone): the same value
            if op.operands[0].id in self.pos.scaled:
                self.pos.scaled[op.results[0].id] = self.pos.scaled[op.operands[0].id]
        if n == 1 and sums(op):  # a sum of sums counts both
            kx = self.keys(op.operands[0])
            before = self.pos.summed.get(op.operands[0].id, ())
            self.pos.summed[op.results[0].id] = before + tuple(kx[a] for a in axes)
            if op.operands[0].id in self.pos.psummed:
                self.pos.psummed[op.results[0].id] = self.pos.psummed[op.operands[0].id]
            x = op.operands[0].id
            pre = self.pos.pre_scaled.get(x) if before else self.pos.scaled_values.get(x)
            if pre:  # the scales before the first sum, carried through sums of it
                self.pos.pre_scaled[op.results[0].id] = pre
        # a batch_norm's lane keeps 3 positions: at 2 it normalises to +-1 (NORMALISED_LANE)
        least = 3 if op.attrs.get(NORMALISED_LANE) else 2
        for x in op.operands[:n]:
            kx = self.keys(x)
            for a in axes:
                self.d.at_least(kx[a], least)
                if x.id in self.pos.independent:
                    self.d.keep(kx[a], f"reduce at {op.loc} reduces values that read no input")
                    self.pos.counts.append((x.type.shape[a], op.loc))
            rest = [kx[i] for i in range(len(kx)) if i not in axes]
            for r in op.results:
                for a, b in zip(rest, self.keys(r), strict=True):
                    self.d.tie(a, b)
            self.untrack(x, f"reduce at {op.loc}")

    def rule_reduce_window(self, op: Op) -> None:
        n = len(op.operands) // 2
        self._windowed(op, list(op.operands[:n]) + list(op.results))

    def rule_select_and_scatter(self, op: Op) -> None:
        self._windowed(op, [op.operands[0], op.operands[1], *op.results])

    def _windowed(self, op: Op, tensors: list[Value]) -> None:
        """reduce_window, select_and_scatter: along a dimension whose window is one position
        with stride 1, no padding and no dilation, each result position reads only the
        same position of its inputs (elementwise along it: a pooling's batch and feature
        dimensions), so the dimension ties across `tensors`; any other dimension keeps its
        size. Regions that read values from outside keep everything."""
        if captured(op):
            return self.keep_all(op, f"{op.short_name} at {op.loc} reading outer values")
        rank = len(op.operands[0].type.shape)
        ones = (1,) * rank
        window = op.attrs.get("window_dimensions") or ones
        strides = op.attrs.get("window_strides") or ones
        base = op.attrs.get("base_dilations") or ones
        dilation = op.attrs.get("window_dilations") or ones
        padding = op.attrs.get("padding")
        pads = np.zeros((rank, 2), int) if padding is None else np.asarray(padding)
        pads = pads.reshape(rank, 2)
        first = self.keys(tensors[0])
        for a in range(rank):
            trivial = (window[a], strides[a], base[a], dilation[a]) == (1, 1, 1, 1)
            trivial = trivial and not pads[a].any()
            if op.name == "stablehlo.reduce_window" and cumulative(op, a):
                trivial = True  # a prefix (suffix) over the whole dimension, at any size
            elif op.name == "stablehlo.reduce_window" and whole_window(op, a):
                trivial = True  # windows of the class's size: window and pads rescale
                for n in (window[a], *pads[a]):
                    self.d.divides(first[a], int(n))
            for v in tensors:
                if trivial:
                    self.d.tie(first[a], self.keys(v)[a])
                else:
                    self.d.keep(self.keys(v)[a], f"a window of {op.short_name} at {op.loc}")
        for v in op.operands:
            self.untrack(v, f"{op.short_name} at {op.loc}")

    def rule_slice(self, op: Op) -> None:
        x, r = op.operands[0], op.results[0]
        kx, kr = self.keys(x), self.keys(r)
        starts, limits = op.attrs["start_indices"], op.attrs["limit_indices"]
        strides = op.attrs.get("strides") or (1,) * len(starts)
        for a, (s, e, st) in enumerate(zip(starts, limits, strides, strict=True)):
            self.d.tie(kx[a], kr[a])
            if st != 1 and r.type.shape[a] > 1:
                self.d.keep(kx[a], f"slice at {op.loc} with stride {st}")
            self.d.divides(kx[a], s)
            self.d.divides(kx[a], x.type.shape[a] - e)
        self.carry(x, r)

    def rule_pad(self, op: Op) -> None:
        x, r = op.operands[0], op.results[0]
        kx, kr = self.keys(x), self.keys(r)
        lo, hi = op.attrs["edge_padding_low"], op.attrs["edge_padding_high"]
        interior = op.attrs["interior_padding"]
        for a in range(len(kx)):
            self.d.tie(kx[a], kr[a])
            if interior[a]:
                self.d.keep(kx[a], f"pad at {op.loc} with interior padding")
            self.d.divides(kx[a], lo[a])
            self.d.divides(kx[a], hi[a])
        self.untrack(x, f"pad at {op.loc}")

    def rule_concatenate(self, op: Op) -> None:
        r = op.results[0]
        for x in op.operands:
            self.tie_all(x, r)
            self.untrack(x, f"concatenate at {op.loc}")
        self.fold(op)

    def rule_reverse(self, op: Op) -> None:
        self.tie_all(op.operands[0], op.results[0])
        for a in op.attrs.get("dimensions", ()):  # the order within every shard shows
            self.d.every_member_at_least(self.keys(op.operands[0])[a], 2)
        self.untrack(op.operands[0], f"reverse at {op.loc}")

    def rule_sort(self, op: Op) -> None:
        sort_rule(self, op)

    def rule_dynamic_slice(self, op: Op) -> None:
        x, r = op.operands[0], op.results[0]
        kx, kr = self.keys(x), self.keys(r)
        on_grid = True
        for a in range(len(kx)):
            if a == 0 and self.layer_start(op.operands[1], kx[0]):
                continue  # one layer of the stack
            self.d.tie(kx[a], kr[a])
            if r.type.shape[a] != x.type.shape[a]:
                on_grid = self.in_units(op, 1 + a, kx[a]) and on_grid
        if on_grid and x.id in self.pos.index:
            # a window at offsets on the grid, as a static slice (rule_slice): its elements
            # are still positions of their class (an argsort's iota sliced per device)
            self.pos.index[r.id] = self.pos.index[x.id]
        else:
            self.untrack(x, f"dynamic_slice at {op.loc}")
        self.fold(op)

    def rule_dynamic_update_slice(self, op: Op) -> None:
        x, u, r = op.operands[0], op.operands[1], op.results[0]
        kx, ku = self.keys(x), self.keys(u)
        self.tie_all(x, r)
        for a in range(len(kx)):
            if a == 0 and self.layer_start(op.operands[2], kx[0]):
                continue  # one layer of the stack
            self.d.tie(kx[a], ku[a])
            if u.type.shape[a] != x.type.shape[a]:
                self.in_units(op, 2 + a, kx[a])
        for v in (x, u):
            self.untrack(v, f"dynamic_update_slice at {op.loc}")
        self.fold(op)

    def rule_gather(self, op: Op) -> None:
        """`x[indices]` (an embedding lookup): the indexed dimensions of `x` are data-dependent
        positions and keep their size; a dimension taken whole (the embedding width) is
        size-generic and ties to its output dimension; the indices' batch dimensions tie to
        the output's."""
        x, idx, r = op.operands[0], op.operands[1], op.results[0]
        dn, sizes = op.attrs["dimension_numbers"], op.attrs["slice_sizes"]
        kx, ki, kr = self.keys(x), self.keys(idx), self.keys(r)
        why = f"the indexed dimension of a gather at {op.loc}"
        batch_out = [d for d in range(len(kr)) if d not in dn.offset_dims]
        batch_idx = [d for d in range(len(ki)) if d != dn.index_vector_dim]
        for a, b in zip(batch_idx, batch_out, strict=True):
            self.d.tie(ki[a], kr[b])
        if dn.index_vector_dim < len(ki):
            self.d.keep(ki[dn.index_vector_dim], why)
        window = [
            d
            for d in range(len(kx))
            if d not in dn.collapsed_slice_dims and d not in dn.operand_batching_dims
        ]
        for d in range(len(kx)):
            if d in dn.operand_batching_dims:
                k = dn.operand_batching_dims.index(d)
                self.d.tie(kx[d], ki[dn.start_indices_batching_dims[k]])
            elif d in dn.start_index_map or sizes[d] != x.type.shape[d]:
                self.d.keep(kx[d], why)
            if d in window:
                o = kr[dn.offset_dims[window.index(d)]]
                if d in dn.start_index_map or sizes[d] != x.type.shape[d]:
                    self.d.keep(o, why)
                else:
                    self.d.tie(kx[d], o)
        for v in (x, idx):
            self.untrack(v, f"gather at {op.loc}")

    def rule_scatter(self, op: Op) -> None:
        """The transpose of `rule_gather` (an embedding gradient, a scatter-add): the
        scattered-into dimensions keep their size, whole windows tie to the operand, the
        update positions tie to the indices' batch dimensions and are summed over when indices
        collide (at least 2 positions, as any reduction)."""
        n = (len(op.operands) - 1) // 2
        inputs, idx, updates = op.operands[:n], op.operands[n], op.operands[n + 1 :]
        dn = op.attrs["scatter_dimension_numbers"]
        for x, r in zip(inputs, op.results, strict=True):
            self.tie_all(inputs[0], x)
            self.tie_all(x, r)
        for u in updates[1:]:
            self.tie_all(updates[0], u)
        x, u = inputs[0], updates[0]
        kx, ki, ku = self.keys(x), self.keys(idx), self.keys(u)
        why = f"the indexed dimension of a scatter at {op.loc}"
        scatter_dims = [d for d in range(len(ku)) if d not in dn.update_window_dims]
        batch_idx = [d for d in range(len(ki)) if d != dn.index_vector_dim]
        for a, b in zip(batch_idx, scatter_dims, strict=True):
            self.d.tie(ki[a], ku[b])
            self.d.at_least(ku[b], 2)
        if dn.index_vector_dim < len(ki):
            self.d.keep(ki[dn.index_vector_dim], why)
        window = [
            d
            for d in range(len(kx))
            if d not in dn.inserted_window_dims and d not in dn.input_batching_dims
        ]
        for d in range(len(kx)):
            if d in dn.input_batching_dims:
                k = dn.input_batching_dims.index(d)
                self.d.tie(kx[d], ki[dn.scatter_indices_batching_dims[k]])
            elif d in dn.scattered_dims_to_operand_dims or d not in window:
                self.d.keep(kx[d], why)
            if d in window:
                w = dn.update_window_dims[window.index(d)]
                if d in dn.scattered_dims_to_operand_dims or u.type.shape[w] != x.type.shape[d]:
                    self.d.keep(kx[d], why)
                    self.d.keep(ku[w], why)
                else:
                    self.d.tie(kx[d], ku[w])
        for v in op.operands:
            self.untrack(v, f"scatter at {op.loc}")

    def rule_all_gather(self, op: Op) -> None:
        self.pass_through(op)
        dim = op.attrs.get("all_gather_dim")
        for x, r in zip(op.operands, op.results, strict=False):
            if dim is not None and x.type.shape[dim] == 1 < r.type.shape[dim]:
                # one element per device gathered (each device's candidate of an argmax): the
                # gathered dimension is the device count, which no shape reduction changes
                self.d.keep(self.keys(r)[dim], f"all_gather at {op.loc} gathers one per device")

    def rule_reduce_scatter(self, op: Op) -> None:
        self.pass_through(op)

    def rule_all_to_all(self, op: Op) -> None:
        self.pass_through(op)
        split, count = op.attrs.get("split_dimension"), op.attrs.get("split_count")
        if split is None or not count:
            return self.keep_all(op, f"all_to_all at {op.loc} without split attributes")
        for x in op.operands:  # each piece sent is a block of the split dimension
            n = x.type.shape[split]
            self.d.divides(self.keys(x)[split], n // count)

    def layer_start(self, start: Value, key: Key) -> bool:
        """A layer loop's layer index (`layer_stacks.py`): the stack's dimension 0 scales with
        the loop's trip count."""
        trips = self.pos.layer_starts.get(start.id)
        if trips is None:
            return False
        self.d.tie(trips, key)
        return True

    def rule_while(self, op: Op) -> None:
        """A layer loop (a scan over stacked layers, `layer_stacks.py`): its state, condition
        and body tie position by position, and its trip count joins the class of the stacks
        it indexes (at least MIN_LAYERS iterations). Any other loop keeps every dimension
        it touches."""
        found = layer_loop(op, self.pos.known)
        if isinstance(found, str):
            return self.keep_all(op, f"loop at {op.loc} ({found})")
        cond, body = op.regions[0].block, op.regions[1].block
        key = self.d.add(trip_key(found), found.trips, f"layers of the loop at {op.loc}")
        self.d.at_least(key, MIN_LAYERS)
        constants = invariant_integers(op, self.pos.known)
        # a splat starting the state (zeros for a gradient stack, shared by CSE with other
        # stacks of the same shape) ties nothing: the state's own dimensions stand for it
        # and it is copied at the state's reduced shape (rewrite.py), as for an elementwise
        # use; tied through it, two stacks' dimensions would be one class
        anchors = [
            body.args[j] if a.id in self.pos.splats else a for j, a in enumerate(op.operands)
        ]
        for block in (cond, body):
            for j, (a, b) in enumerate(zip(op.operands, block.args, strict=True)):
                dims_of(self.d, b, "loop state")
                self.tie_all(anchors[j], b)
                if a.id in self.pos.index:
                    self.untrack(a, f"loop at {op.loc}")
                if j in constants:  # the same integers on every iteration
                    self.pos.known[b.id] = self.pos.known[a.id]
        for vid in found.starts:
            self.pos.layer_starts[vid] = key
        for bop, operand, bias in found.bounds:
            n = found.trips - bias
            self.d.divides(key, n + bias)
            self.pos.rescales.append(Rescale(bop, operand, key, [n], bias))
        for mop, operand, k in found.markers:  # layer K singled out: K // factor reduced
            self.pos.rescales.append(Rescale(mop, operand, key, [k]))
        self.pos.layer_loops.append(found)
        self.block(cond)
        self.block(body)
        for a, b, r in zip(anchors, body.results, op.results, strict=True):
            self.tie_all(a, b)
            self.tie_all(a, r)

    def rule_get_tuple_element(self, op: Op) -> None:
        self.keep_all(op, "tuples")

    def rule_manual_computation(self, op: Op) -> None:
        body = op.regions[0].block
        ins = op.attrs.get("in_shardings") or [None] * len(op.operands)
        outs = op.attrs.get("out_shardings") or [None] * len(op.results)
        for a, b, s in zip(op.operands, body.args, ins, strict=True):
            dims_of(self.d, b, "shard_map argument")
            self.shard_boundary(a, b, s)
            if a.id in self.pos.independent:
                self.pos.independent.add(b.id)
            if a.id in self.pos.index:
                self.untrack(a, f"sdy.manual_computation at {op.loc}")
        self.block(body)
        for a, b, s in zip(body.results, op.results, outs, strict=True):
            self.shard_boundary(b, a, s)
            self.untrack(a, f"sdy.manual_computation at {op.loc}")

    def shard_boundary(self, whole: Value, local: Value, sharding) -> None:
        """A shard_map's global value and its tile (`sharding`: the Shardy sharding between
        them): tied, each shard's boundary an offset on the grid."""
        self.tie_all(whole, local)
        self._shard_boundaries(whole, local)

    def _shard_boundaries(self, whole: Value, local: Value) -> None:
        """Every shard's boundary in a dimension split over devices is an offset that must
        stay on the reduced grid (in a merged dimension, on the same digit: _digits)."""
        if not isinstance(whole.type, TensorType) or not isinstance(local.type, TensorType):
            return
        for k, n, m in zip(self.keys(whole), whole.type.shape, local.type.shape, strict=True):
            if m and n != m and n % m == 0:
                for start in range(0, n + 1, m):
                    self.d.divides(k, start)

    def rule_return(self, op: Op) -> None:
        pass


def _rank(v: Value) -> int:
    t = v.type
    return len(t.shape) if isinstance(t, TensorType) else 0


def factor_groups(a: tuple[int, ...], b: tuple[int, ...]):
    """Split two shapes of equal size into aligned groups of equal products (size-1 dims
    join no group: they stay 1). Yields (axes of a, axes of b) per group."""
    ia = [i for i, n in enumerate(a) if n != 1]
    ib = [j for j, n in enumerate(b) if n != 1]
    i = j = 0
    while i < len(ia) and j < len(ib):
        ga, gb = [ia[i]], [ib[j]]
        pa, pb = a[ia[i]], b[ib[j]]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                pa *= a[ia[i]]
                ga.append(ia[i])
                i += 1
            else:
                pb *= b[ib[j]]
                gb.append(ib[j])
                j += 1
        yield ga, gb


def narrow_positions(d: DimClasses, rules) -> None:
    """Positions converted or offset in an integer type that cannot hold them at the real
    size (an iota of 8,192 rows as i8 wraps past 127) keep their class: at the reduced size
    they would all fit, and the pair would lose what the wrap does."""
    widths = [w for r in rules for w in r.pos.widths]
    if not widths:
        return
    largest = {root: max(d.real[k] for k in members) for root, members in d.classes().items()}
    for op, key, shift in widths:
        hi = largest[d.find(key)] - 1 + shift
        t = op.results[0].type
        if not holds_integers(t, -shift, hi):
            d.keep(key, f"{op.short_name} at {op.loc} holds positions up to {hi} in {t.dtype}")
