"""One op on every device at once, for concrete SPMD runs.

The devices of an SPMD program run the same op sequence, each on its own data. Evaluated
device by device, an op on the few-element arrays of a reduced program costs numpy's call
overhead (tens of microseconds) once per device; at 8 devices and a layer loop run at its
real count that is most of a concrete run (docs/benchmarks.md, "Depth with the layers as a
scan"). Here an ordinary op is evaluated once on the devices' values stacked along a new
leading *device axis*, by the op's own evaluator with its attributes shifted past that axis
(as `jax.vmap` batches a primitive): `broadcast_in_dim`'s dimensions + 1, `dot_general`'s
device axis a batch dimension, `reduce`'s dimensions + 1, and so on. The stacked result is
cut into per-device views, so everything else (hooks, collectives, control flow, the
per-device environments) sees what device-by-device evaluation gives.

Only ops whose batched form is the same function on each device slice are batched:
element-wise ops with operands of the result's shape, the data-movement ops, `dot_general`,
`reduce` with a known reducer, `dynamic_slice` / `dynamic_update_slice` whose start indices
(and `pad` / `reduce` whose scalar operands) are the same on every device, and ops whose
operands every device holds as the same objects (`constant`, `iota`, and what is computed
from them alone: evaluated once, shared). Anything else, or any failure of the batched
form, is evaluated device by device as before.
"""

from __future__ import annotations

import contextvars
import dataclasses
import math
import os

import numpy as np

from tv_ir.ir.program import Op, TensorType
from tv_ir.semantics.interpreters.evaluator import InterpreterError
from tv_ir.semantics.ops import OpContext, lookup
from tv_ir.semantics.ops.reduction import reducer_kind

ELEMENTWISE = frozenset(
    "stablehlo." + n
    for n in (
        "add subtract multiply divide remainder power maximum minimum atan2 negate abs sign "
        "compare select clamp and or xor not convert exponential exponential_minus_one log "
        "log_plus_one logistic tanh sqrt rsqrt cbrt sine cosine tan floor ceil "
        "round_nearest_afz round_nearest_even is_finite"
    ).split()
)
# off (TV_DEVICE_BATCH=0, or set in a context): device by device, for comparison
DEVICE_BATCH = contextvars.ContextVar(
    "device_batch", default=os.environ.get("TV_DEVICE_BATCH", "1") != "0"
)
# a stack copied from the devices' own arrays (a collective's results, a shard_map's
# pieces) is kept for the value's next uses only up to this size: a larger one is copied
# again at each use rather than held beside the devices' arrays
KEEP_COPIES_BYTES = 1 << 20
# an op whose results on all devices together are larger is evaluated device by device:
# batching it gains little, and its temporaries would be the devices' all at once
BATCH_BYTES = 16 << 20
SHARED = frozenset({"stablehlo.constant", "stablehlo.iota"})  # no operands: one value for all


class DeviceBatch:
    """Evaluates ordinary ops of an SPMD run on all `n` devices at once (concrete values).

    Keeps, per value id, the stacked array it made or read and the per-device objects it
    stands for; a stacked array is reused only while every device's environment still
    holds exactly those objects (a hook or another path that replaced them makes it
    stack again)."""

    def __init__(self, n: int, alg):
        self.n = n
        self.alg = alg
        self.batched = 0  # ops evaluated once for all devices (stats, tests)
        self._stacks: dict[int, tuple[np.ndarray, tuple]] = {}  # value id -> (stack, objects)
        self._owner: dict[int, int] = {}  # id(device 0's object) -> value id of its stack
        self._plans: dict[int, tuple] = {}  # id(op) -> (op, rule, batched result types)

    def evaluate(self, op: Op, procs: list) -> list | None:
        """Each device's results of `op` (as `[device][result]`), or None when the op is
        not batched here (the caller evaluates it device by device)."""
        plan = self._plans.get(id(op))
        if plan is None or plan[0] is not op:
            plan = self._plans[id(op)] = (op, *_plan(op, self.n))
        _, rule, result_types = plan
        if rule is None:
            return None
        per = [[p.env[v.id] for p in procs] for v in op.operands]
        if all(_one_object(values) for values in per):
            return self._shared(op, procs)
        try:
            call = rule(op, per, self)
            if call is None:
                return None
            attrs, operands, operand_types = call
            ctx = OpContext(
                name=op.name,
                attrs=attrs,
                operand_types=operand_types,
                result_types=result_types,
                alg=self.alg,
                run_region=_no_region,
                regions=op.regions,
                loc=op.loc,
            )
            out = lookup(op.name, op.loc)(ctx, *operands)
            out = out if isinstance(out, list) else [out]
            stacks = [_checked(r, t) for r, t in zip(out, result_types, strict=True)]
        except (MemoryError, RecursionError):
            raise
        except Exception:  # not batchable after all: device by device decides (and errs)
            return None
        self.batched += 1
        if len(stacks) == 1:
            views = self._views(op.results[0].id, stacks[0])
            return [[x] for x in views]
        per_result = [self._views(v.id, r) for v, r in zip(op.results, stacks, strict=True)]
        return [[views[d] for views in per_result] for d in range(self.n)]

    def _views(self, vid: int, r: np.ndarray) -> tuple:
        """Each device's result: a view of its slice of the stacked result `r`."""
        views = tuple(r) if r.ndim > 1 else tuple(r[d, ...] for d in range(self.n))
        self._remember(vid, r, views)
        return views

    def stacked(self, vid: int, values: list, one: bool = False) -> np.ndarray | None:
        """The devices' `values` of value `vid` stacked along a leading device axis (the
        remembered stack when they are still its objects), or None for non-arrays. With
        `one`, a value every device holds as the same object is given with a device axis of
        1 (for element-wise ops: numpy broadcasts it)."""
        first = values[0]
        if one and _one_object(values) and isinstance(first, np.ndarray):
            return first[None]
        for key in (vid, self._owner.get(id(first))):
            known = self._stacks.get(key) if key is not None else None
            if known is not None and all(a is b for a, b in zip(known[1], values, strict=True)):
                if key != vid:
                    self._stacks[vid] = known  # a loop's carried value: the body's result
                return known[0]
        if not all(isinstance(x, np.ndarray) for x in values):
            return None
        if first.dtype == object or any(
            x.shape != first.shape or x.dtype != first.dtype for x in values
        ):
            return None
        if _one_object(values):
            r = np.broadcast_to(first, (self.n, *first.shape))
        else:
            r = np.stack(values)
            if r.nbytes > KEEP_COPIES_BYTES:  # a copy kept would double the value's memory
                return r
        self._remember(vid, r, tuple(values))
        return r

    def _remember(self, vid: int, r: np.ndarray, objects: tuple) -> None:
        old = self._stacks.get(vid)
        if old is not None and self._owner.get(id(old[1][0])) == vid:
            del self._owner[id(old[1][0])]
        self._stacks[vid] = (r, objects)
        self._owner[id(objects[0])] = vid

    def _shared(self, op: Op, procs: list) -> list:
        """An op whose operands every device holds as the same objects (none, for a
        constant or an iota) computes the same values on every device: evaluated once,
        its results shared."""
        results = procs[0].evaluate_op(op)
        self.batched += 1
        return [list(results) for _ in range(self.n)]


def _one_object(values: list) -> bool:
    first = values[0]
    return all(x is first for x in values)


def _plan(op: Op, n: int) -> tuple:
    """(the op's batching rule, its batched result types), or (None, None): not batched."""
    name = op.name
    rule = _RULES.get(name) or (_elementwise if name in ELEMENTWISE else None)
    if name in SHARED:
        rule = _never  # no operands: always evaluated once and shared
    if rule is None or _complex(op):
        return None, None
    types = [_batched_type(v.type, n) for v in op.results]
    if sum(math.prod(t.shape) * np.dtype(t.numpy_dtype).itemsize for t in types) > BATCH_BYTES:
        return None, None  # large arrays: the call overhead is small beside the work
    return rule, types


def _never(op, per, batch):
    return None


def _no_region(i, args):
    raise InterpreterError("a region in a device-batched op")  # never: such ops are not batched


def _complex(op: Op) -> bool:
    return any(getattr(v.type, "is_complex", False) for v in (*op.operands, *op.results))


def _batched_type(t, n: int):
    return TensorType((n, *t.shape), t.dtype) if isinstance(t, TensorType) else t


def _checked(r, t) -> np.ndarray:
    """A batched result against its batched type (as evaluator.checked_results does)."""
    r = np.asarray(r)
    if r.shape != tuple(t.shape):
        raise InterpreterError(f"batched result shape {r.shape} does not match {t}")
    if r.dtype != np.dtype(t.numpy_dtype):
        r = r.astype(t.numpy_dtype)
    return r


def _stacks(op: Op, per: list, batch: DeviceBatch, which) -> list | None:
    """The stacked operands at positions `which` (None if one cannot be stacked)."""
    out = []
    for k in which:
        s = batch.stacked(op.operands[k].id, per[k])
        if s is None:
            return None
        out.append(s)
    return out


def _same(values: list):
    """The value every device holds (a scalar operand: an index, an init, a pad value),
    or None when the devices' values differ."""
    first = values[0]
    if not isinstance(first, np.ndarray) or first.dtype == object:
        return None
    for x in values[1:]:
        if not isinstance(x, np.ndarray) or x.dtype != first.dtype or x.shape != first.shape:
            return None
        if x is not first and x.tobytes() != first.tobytes():
            return None
    return first


def _types(op: Op, n: int, batched: list[bool]) -> list:
    return [
        _batched_type(v.type, n) if b else v.type for v, b in zip(op.operands, batched, strict=True)
    ]


def _elementwise(op: Op, per: list, batch: DeviceBatch):
    shape = tuple(op.results[0].type.shape)
    if any(tuple(v.type.shape) != shape for v in op.operands):
        return None  # a scalar predicate or bound beside tensors: not batched
    xs = []
    for k, v in enumerate(op.operands):  # a value shared by all devices: broadcast
        x = batch.stacked(v.id, per[k], one=True)
        if x is None:
            return None
        xs.append(x)
    return op.attrs, xs, _types(op, batch.n, [True] * len(xs))


def _shifted(dims) -> tuple:
    return tuple(int(d) + 1 for d in dims)


def _one_operand(attrs_of):
    def rule(op: Op, per: list, batch: DeviceBatch):
        xs = _stacks(op, per, batch, [0])
        if xs is None:
            return None
        return attrs_of(op.attrs), xs, _types(op, batch.n, [True])

    return rule


def _broadcast_in_dim(a):
    return {**a, "broadcast_dimensions": (0, *_shifted(a["broadcast_dimensions"]))}


def _transpose(a):
    return {**a, "permutation": (0, *_shifted(a["permutation"]))}


def _slice(a):
    strides = a.get("strides") or (1,) * len(a["start_indices"])
    return {
        **a,
        "start_indices": (0, *a["start_indices"]),
        "limit_indices": (None, *a["limit_indices"]),
        "strides": (1, *strides),
    }


def _concatenate(op: Op, per: list, batch: DeviceBatch):
    xs = _stacks(op, per, batch, range(len(op.operands)))
    if xs is None:
        return None
    attrs = {**op.attrs, "dimension": int(op.attrs["dimension"]) + 1}
    return attrs, xs, _types(op, batch.n, [True] * len(xs))


def _pad(op: Op, per: list, batch: DeviceBatch):
    xs = _stacks(op, per, batch, [0])
    value = _same(per[1])
    if xs is None or value is None:
        return None
    a = op.attrs
    attrs = {
        **a,
        "edge_padding_low": (0, *a["edge_padding_low"]),
        "edge_padding_high": (0, *a["edge_padding_high"]),
        "interior_padding": (0, *a["interior_padding"]),
    }
    return attrs, [xs[0], value], _types(op, batch.n, [True, False])


def _dot_general(op: Op, per: list, batch: DeviceBatch):
    xs = _stacks(op, per, batch, [0, 1])
    if xs is None:
        return None
    d = op.attrs["dot_dimension_numbers"]
    dims = dataclasses.replace(
        d,
        lhs_batch=(0, *_shifted(d.lhs_batch)),
        rhs_batch=(0, *_shifted(d.rhs_batch)),
        lhs_contract=_shifted(d.lhs_contract),
        rhs_contract=_shifted(d.rhs_contract),
    )
    return {**op.attrs, "dot_dimension_numbers": dims}, xs, _types(op, batch.n, [True, True])


def _reduce(op: Op, per: list, batch: DeviceBatch):
    if len(op.operands) != 2 or reducer_kind(_RegionsOnly(op.regions)) is None:
        return None  # a general reducer runs its region per element: device by device
    xs = _stacks(op, per, batch, [0])
    init = _same(per[1])
    if xs is None or init is None:
        return None
    attrs = {**op.attrs, "dimensions": (*_shifted(op.attrs["dimensions"]),)}
    return attrs, [xs[0], init], _types(op, batch.n, [True, False])


@dataclasses.dataclass
class _RegionsOnly:
    regions: list


def _start_indices(op: Op, per: list, first: int):
    """The start index operands from position `first` when every device has the same ones,
    with a zero start for the device axis in front; else None."""
    starts = []
    for k in range(first, len(op.operands)):
        s = _same(per[k])
        if s is None:
            return None
        starts.append(s)
    return [np.zeros((), dtype=starts[0].dtype if starts else np.int64), *starts]


def _dynamic_slice(op: Op, per: list, batch: DeviceBatch):
    xs = _stacks(op, per, batch, [0])
    starts = _start_indices(op, per, 1)
    if xs is None or starts is None:
        return None
    attrs = {**op.attrs, "slice_sizes": (batch.n, *op.attrs["slice_sizes"])}
    types = [_batched_type(op.operands[0].type, batch.n)]
    types += [TensorType((), str(op.operands[1].type.dtype)) for _ in starts]
    return attrs, [xs[0], *starts], types


def _dynamic_update_slice(op: Op, per: list, batch: DeviceBatch):
    xs = _stacks(op, per, batch, [0, 1])
    starts = _start_indices(op, per, 2)
    if xs is None or starts is None:
        return None
    types = [_batched_type(op.operands[k].type, batch.n) for k in (0, 1)]
    types += [TensorType((), str(op.operands[2].type.dtype)) for _ in starts]
    return op.attrs, [*xs, *starts], types


_RULES = {
    "stablehlo.broadcast_in_dim": _one_operand(_broadcast_in_dim),
    "stablehlo.reshape": _one_operand(lambda a: a),
    "stablehlo.transpose": _one_operand(_transpose),
    "stablehlo.slice": _one_operand(_slice),
    "stablehlo.concatenate": _concatenate,
    "stablehlo.pad": _pad,
    "stablehlo.dot_general": _dot_general,
    "stablehlo.reduce": _reduce,
    "stablehlo.dynamic_slice": _dynamic_slice,
    "stablehlo.dynamic_update_slice": _dynamic_update_slice,
}
