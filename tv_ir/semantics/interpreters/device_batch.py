"""One op on every device at once, for concrete SPMD runs.

The devices of an SPMD program run the same op sequence, each on its own data. Evaluated
device by device, an op on the few-element arrays of a reduced program costs numpy's call
overhead (tens of microseconds) once per device; at 8 devices and a layer loop run at its
real count that is most of a concrete run (docs/benchmarks.md, "Depth with the layers as a
scan"). Here an ordinary op is evaluated once on the devices' values stacked along a new
leading *device axis*, by the op's own evaluator with its attributes shifted past that axis
(as `jax.vmap` batches a primitive): `broadcast_in_dim`'s dimensions + 1, `dot_general`'s
device axis a batch dimension, `reduce`'s dimensions + 1, and so on. The stacked result is
held once, stacked, and the next batched op reads it as it is; a device's environment
(`DeviceEnv`) gives its slice, a view made when something reads it device by device (a
collective, control flow, a hook, an op not batched), so everything else sees what
device-by-device evaluation gives. Writing a device's own value drops the stack; a stack
put for a value drops the devices' own older copies (a loop body's values, once per
iteration). A hook that only reads an op's results (a traced run records every value) gets
each device's view and leaves the stack as it is: nothing is written device by device
(`holds`). all_reduce, reduce_scatter and all_gather combine every group of one size in one
call (`collectives.group_values`), adding in the order a group alone does.

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
import operator
import os

import numpy as np

from tv_ir.ir.program import Op, TensorType
from tv_ir.semantics.interpreters.evaluator import InterpreterError
from tv_ir.semantics.ops import OpContext, lookup
from tv_ir.semantics.ops.collectives import group_values, member_values
from tv_ir.semantics.ops.reduction import reducer_kind
from tv_ir.semantics.ops.registry import ELEMENTWISE

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
# collectives evaluated on the devices' stacked values (`DeviceBatch.collective`)
BATCHED_COLLECTIVES = frozenset(("all_reduce", "reduce_scatter", "all_gather"))


class One:
    """A value every device holds as the same object (a constant, an iota, what is computed
    from them alone)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class Stacked:
    """An op's results on all devices: per result, the stacked array (device axis first) or
    `One`. What `DeviceBatch.evaluate` gives; `DeviceBatch.put` records it."""

    __slots__ = ("results",)

    def __init__(self, results: list):
        self.results = results


class DeviceEnv(dict):
    """A device's environment in a device-batched run. A value the batch computed for all
    devices at once is held once, stacked (`DeviceBatch.put`); reading it here gives this
    device's slice (a view, made on first read). Values written here (each device's own:
    collectives, control flow, ops evaluated device by device) take precedence, and writing
    one drops the stack of the same value."""

    __slots__ = ("store", "device")

    def __init__(self, store: _Store, device: int):
        super().__init__()
        self.store = store  # not the DeviceBatch: no reference cycle keeps its arrays alive
        self.device = device

    def __missing__(self, vid: int):
        return self.store.device_value(vid, self.device)

    def __setitem__(self, vid: int, value) -> None:
        dict.__setitem__(self, vid, value)
        self.store.written_per_device(vid)


class _Store:
    """The values batched for all devices, by value id (what `DeviceEnv`s read)."""

    __slots__ = ("n", "stacks", "views", "owner", "own")

    def __init__(self, n: int):
        self.n = n
        self.stacks: dict[int, object] = {}  # value id -> stacked array or One
        self.views: dict[int, tuple] = {}  # value id -> (stack, each device's view)
        self.owner: dict[int, int] = {}  # id(device 0's view) -> value id of its stack
        self.own: set[int] = set()  # value ids some device holds its own value of

    def written_per_device(self, vid: int) -> None:
        self.own.add(vid)
        self.stacks.pop(vid, None)

    def device_value(self, vid: int, d: int):
        """Device `d`'s value of `vid` from its stack (KeyError: no such value)."""
        r = self.stacks[vid]
        if type(r) is One:
            return r.value
        return self.device_values(vid, r)[d]

    def device_values(self, vid: int, r) -> tuple:
        """Every device's slice of the stack `r` of `vid` (views, made once per stack)."""
        known = self.views.get(vid)
        if known is None or known[0] is not r:
            views = tuple(r) if r.ndim > 1 else tuple(r[k, ...] for k in range(self.n))
            known = self.views[vid] = (r, views)
            self.owner[id(views[0])] = vid
        return known[1]


class DeviceBatch:
    """Evaluates ordinary ops of an SPMD run on all `n` devices at once (concrete values).

    Holds, per value id, the stacked array (or `One`) the batch made, or one it stacked
    from the devices' own values; the devices' environments (`DeviceEnv`) read their
    slices from it. A value written per device drops its stack; a stack put for a value
    drops the devices' own copies."""

    def __init__(self, n: int, alg):
        self.n = n
        self.alg = alg
        self.batched = 0  # ops evaluated once for all devices (stats, tests)
        self.store = _Store(n)
        self.envs = [DeviceEnv(self.store, d) for d in range(n)]
        # id(op) -> (op, rule, batched result types, evaluator, what the rule made once)
        self._plans: dict[int, tuple] = {}

    # -- the store ---------------------------------------------------------------------------
    def put(self, op: Op, out: Stacked) -> None:
        """Record `op`'s results on all devices (dropping the devices' own older copies)."""
        store = self.store
        for v, r in zip(op.results, out.results, strict=True):
            vid = v.id
            if vid in store.own:
                self._drop_own(vid)
            store.stacks[vid] = r
            store.views.pop(vid, None)  # an older stack's views: not kept alive by them

    def _drop_own(self, vid: int) -> None:
        """The devices' own values of `vid`, dropped: a stack is put for it."""
        self.store.own.discard(vid)
        for env in self.envs:
            dict.pop(env, vid, None)

    def put_values(self, values: list, per_device: list) -> None:
        """Give `values` (a block's arguments) the devices' `per_device[d][k]`: a position
        whose values are one stack's slices (a loop's state, as the body left it) or one
        object on every device is recorded as that stack or object, the others device by
        device. What each device then reads is the object it was given."""
        store = self.store
        for k, v in enumerate(values):
            xs = [a[k] for a in per_device]
            first = xs[0]
            owner = store.owner.get(id(first))
            known = store.views.get(owner) if owner is not None else None
            if known is not None and all(map(operator.is_, known[1], xs)):
                entry = known[0]
            elif all(x is first for x in xs):
                entry = One(first)
            else:
                for env, x in zip(self.envs, xs, strict=True):
                    env[v.id] = x
                continue
            vid = v.id
            if vid in store.own:
                self._drop_own(vid)
            store.stacks[vid] = entry
            if type(entry) is One:
                store.views.pop(vid, None)
            else:
                store.views[vid] = known  # its slices: the very objects given

    def values_of(self, vids: list[int]) -> list[list]:
        """Each device's values of `vids` (`[device][k]`), as its environment reads them:
        its own value where it wrote one, else its slice of the stack (a block's results)."""
        store = self.store
        columns = []
        for vid in vids:
            if vid in store.own:  # a device's own value is in its environment
                columns.append([env[vid] for env in self.envs])
                continue
            r = store.stacks[vid]
            columns.append([r.value] * self.n if type(r) is One else store.device_values(vid, r))
        if not columns:
            return [[] for _ in self.envs]
        return [list(row) for row in zip(*columns, strict=True)]

    def per_device(self, op: Op, out: Stacked) -> list:
        """`out` as `[device][result]` (for a hook: it sees what device-by-device gives)."""
        self.put(op, out)
        per = [self._columns(v.id) for v in op.results]
        return [list(row) for row in zip(*per, strict=True)]

    def _columns(self, vid: int):
        """Each device's value of `vid` from its stack (the views `per_device` hands out)."""
        r = self.store.stacks[vid]
        return [r.value] * self.n if type(r) is One else self.store.device_values(vid, r)

    def holds(self, op: Op, per_device: list) -> bool:
        """Are these `op`'s results as `per_device` gave them (a hook that only read them)?
        The devices then read them from the stack: nothing is written device by device."""
        for k, v in enumerate(op.results):
            r = self.store.stacks.get(v.id)
            if r is None:
                return False
            given = (row[k] for row in per_device)
            if type(r) is One:
                if not all(x is r.value for x in given):
                    return False
            elif not all(map(operator.is_, given, self.store.device_values(v.id, r))):
                return False
        return True

    def entry(self, vid: int):
        """The devices' values of `vid`: a stacked array, `One`, or None (not arrays, or of
        different shapes)."""
        store = self.store
        r = store.stacks.get(vid)
        if r is None:
            r = self._gathered(vid)
        if type(r) is not list:
            return r
        values, first = r, r[0]
        owner = store.owner.get(id(first))
        known = store.views.get(owner) if owner is not None else None
        if known is not None and all(map(operator.is_, known[1], values)):
            r = known[0]  # a loop's carried value: the body's result, as it was stacked
        else:
            if not all(isinstance(x, np.ndarray) for x in values):
                return None
            if first.dtype == object or any(
                x.shape != first.shape or x.dtype != first.dtype for x in values
            ):
                return None
            r = np.stack(values)
            if r.nbytes > KEEP_COPIES_BYTES:  # a copy kept would double the memory
                return r
            # the same objects again (a value a loop carries unchanged): this stack
            store.views[vid] = (r, tuple(values))
            store.owner[id(first)] = vid
        store.stacks[vid] = r
        return r

    def _gathered(self, vid: int) -> One | list:
        """The devices' own values of `vid`: `One` (recorded) when they are one object."""
        values = [env[vid] for env in self.envs]
        first = values[0]
        if any(x is not first for x in values):
            return values
        one = self.store.stacks[vid] = One(first)
        return one

    def stacked(self, vid: int, one: bool = False) -> np.ndarray | None:
        """The devices' values of `vid` stacked along a leading device axis, or None for
        non-arrays. With `one`, a value every device holds as the same object is given with
        a device axis of 1 (for element-wise ops: numpy broadcasts it)."""
        r = self.entry(vid)
        if type(r) is One:
            x = r.value
            if not isinstance(x, np.ndarray) or x.dtype == object:
                return None
            return x[None] if one else np.broadcast_to(x, (self.n, *x.shape))
        return r

    def same(self, vid: int):
        """The value every device holds (a scalar operand: an index, an init, a pad
        value), or None when the devices' values differ."""
        r = self.entry(vid)
        if type(r) is One:
            x = r.value
            return x if isinstance(x, np.ndarray) and x.dtype != object else None
        if r is None or r.dtype == object:
            return None
        flat = np.ascontiguousarray(r).view(np.uint8).reshape(self.n, -1)
        return r[0] if (flat == flat[0]).all() else None

    # -- ops ---------------------------------------------------------------------------------
    def plan(self, op: Op) -> tuple:
        """(op, its batching rule or None, batched result types, evaluator, the rule's memo):
        made once per op."""
        plan = self._plans.get(id(op))
        if plan is None or plan[0] is not op:
            plan = self._plans[id(op)] = (op, *_plan(op, self.n), {})
        return plan

    def evaluate(self, op: Op, procs: list, plan: tuple | None = None) -> Stacked | None:
        """`op`'s results on every device, or None when the op is not batched here (the
        caller evaluates it device by device). `plan`: `self.plan(op)`, if known."""
        _, rule, result_types, fn, memo = plan or self.plan(op)
        if rule is None:
            return None
        stacks = self.store.stacks
        for v in op.operands:  # every operand the same object on every device: shared
            r = stacks.get(v.id)
            if type(r if r is not None else self._gathered(v.id)) is not One:
                break
        else:
            return self._shared(op, procs)
        try:
            call = rule(op, self, memo)
            if call is None:
                return None
            attrs, operands, operand_types = call
            # an op evaluated again (in a loop) keeps its context: the rules make attributes
            # and types once per op
            known = memo.get("context")
            if known is None or known[0] is not attrs or known[1] is not operand_types:
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
                known = (attrs, operand_types, ctx)
                memo["context"] = known if "context" in memo else None
            ctx = known[2]
            out = fn(ctx, *operands)
            out = out if isinstance(out, list) else [out]
            stacks = [_checked(r, t) for r, t in zip(out, result_types, strict=True)]
        except (MemoryError, RecursionError):
            raise
        except Exception:  # not batchable after all: device by device decides (and errs)
            return None
        self.batched += 1
        return Stacked(stacks)

    def collective(self, op: Op, ctx: OpContext, groups: list) -> Stacked | None:
        """all_reduce, reduce_scatter or all_gather of one operand on the devices' stacked
        values: each group's members given what `collectives.member_values` gives them, as
        device by device. None when the op is not of that form (evaluated device by
        device)."""
        if op.name.split(".", 1)[-1] not in BATCHED_COLLECTIVES or len(op.operands) != 1:
            return None
        x = self.stacked(op.operands[0].id)
        if x is None:
            return None
        if len({len(g) for g in groups}) == 1:  # groups of one size: all at once
            order = [d.device_id for g in groups for d in g]
            got = group_values(ctx, x[order].reshape(len(groups), len(groups[0]), *x.shape[1:]))
            out = np.empty((self.n, *got.shape[2:]), dtype=got.dtype)
            out[order] = got.reshape(self.n, *got.shape[2:])
            self.batched += 1
            return Stacked([_checked(out, _batched_type(op.results[0].type, self.n))])
        out = None
        for group in groups:
            members = [d.device_id for d in group]
            values = member_values(ctx, x[members])
            if out is None:
                first = np.asarray(values[0])
                out = np.empty((self.n, *first.shape), dtype=first.dtype)
            if all(v is values[0] for v in values):  # one value for the group: at once
                out[members] = values[0]
                continue
            for d, value in zip(members, values, strict=True):
                out[d] = value
        if out is None:
            return None
        self.batched += 1
        return Stacked([_checked(out, _batched_type(op.results[0].type, self.n))])

    def _shared(self, op: Op, procs: list) -> Stacked:
        """An op whose operands every device holds as the same objects (none, for a
        constant or an iota) computes the same values on every device: evaluated once,
        its results shared."""
        results = procs[0].evaluate_op(op)
        self.batched += 1
        return Stacked([One(r) for r in results])


def _plan(op: Op, n: int) -> tuple:
    """(the op's batching rule, its batched result types, its evaluator), or Nones: not
    batched."""
    name = op.name
    rule = _RULES.get(name) or (_elementwise if name in ELEMENTWISE else None)
    if name in SHARED:
        rule = _never  # no operands: always evaluated once and shared
    if rule is None or _complex(op):
        return None, None, None
    types = [_batched_type(v.type, n) for v in op.results]
    if sum(math.prod(t.shape) * np.dtype(t.numpy_dtype).itemsize for t in types) > BATCH_BYTES:
        return None, None, None  # large arrays: the call overhead is small beside the work
    return rule, types, lookup(op.name, op.loc)


def _never(op, batch, memo):
    return None


def _no_region(i, args):
    raise InterpreterError("a region in a device-batched op")  # never: such ops are not batched


def _complex(op: Op) -> bool:
    return any(getattr(v.type, "is_complex", False) for v in (*op.operands, *op.results))


def _batched_type(t, n: int):
    return TensorType((n, *t.shape), t.dtype) if isinstance(t, TensorType) else t


def _checked(r, t) -> np.ndarray:
    """A batched result against its batched type (as evaluator.checked_results does)."""
    if type(r) is np.ndarray and type(t) is TensorType and r.shape == t.shape:
        if r.dtype == t.numpy_dtype:
            return r  # the common case, checked first: as declared
    r = np.asarray(r)
    if r.shape != tuple(t.shape):
        raise InterpreterError(f"batched result shape {r.shape} does not match {t}")
    if r.dtype != np.dtype(t.numpy_dtype):
        r = r.astype(t.numpy_dtype)
    return r


def _stacks(op: Op, batch: DeviceBatch, which) -> list | None:
    """The stacked operands at positions `which` (None if one cannot be stacked)."""
    out = []
    for k in which:
        s = batch.stacked(op.operands[k].id)
        if s is None:
            return None
        out.append(s)
    return out


def _types(op: Op, n: int, batched: tuple, memo: dict) -> list:
    """The operand types of the batched call (`batched`: which operands carry the device
    axis), made once per op and pattern."""
    types = memo.get(batched)
    if types is None:
        types = memo[batched] = [
            _batched_type(v.type, n) if b else v.type
            for v, b in zip(op.operands, batched, strict=True)
        ]
    return types


def _elementwise(op: Op, batch: DeviceBatch, memo: dict):
    if "elementwise" not in memo:
        shape = tuple(op.results[0].type.shape)
        # a scalar predicate or bound beside tensors: not batched
        memo["elementwise"] = all(tuple(v.type.shape) == shape for v in op.operands)
    if not memo["elementwise"]:
        return None
    xs = []
    for v in op.operands:  # a value shared by all devices: broadcast
        x = batch.stacked(v.id, one=True)
        if x is None:
            return None
        xs.append(x)
    return op.attrs, xs, _types(op, batch.n, (True,) * len(xs), memo)


def _shifted(dims) -> tuple:
    return tuple(int(d) + 1 for d in dims)


def _attrs(op: Op, memo: dict, make) -> dict:
    """The op's attributes for the batched call, made once per op."""
    attrs = memo.get("attrs")
    if attrs is None:
        attrs = memo["attrs"] = make(op.attrs)
    return attrs


def _one_operand(attrs_of):
    def rule(op: Op, batch: DeviceBatch, memo: dict):
        xs = _stacks(op, batch, [0])
        if xs is None:
            return None
        return _attrs(op, memo, attrs_of), xs, _types(op, batch.n, (True,), memo)

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


def _concatenate(op: Op, batch: DeviceBatch, memo: dict):
    xs = _stacks(op, batch, range(len(op.operands)))
    if xs is None:
        return None
    attrs = _attrs(op, memo, lambda a: {**a, "dimension": int(a["dimension"]) + 1})
    return attrs, xs, _types(op, batch.n, (True,) * len(xs), memo)


def _pad_attrs(a):
    return {
        **a,
        "edge_padding_low": (0, *a["edge_padding_low"]),
        "edge_padding_high": (0, *a["edge_padding_high"]),
        "interior_padding": (0, *a["interior_padding"]),
    }


def _pad(op: Op, batch: DeviceBatch, memo: dict):
    xs = _stacks(op, batch, [0])
    value = batch.same(op.operands[1].id)
    if xs is None or value is None:
        return None
    attrs = _attrs(op, memo, _pad_attrs)
    return attrs, [xs[0], value], _types(op, batch.n, (True, False), memo)


def _dot_general_attrs(a):
    d = a["dot_dimension_numbers"]
    dims = dataclasses.replace(
        d,
        lhs_batch=(0, *_shifted(d.lhs_batch)),
        rhs_batch=(0, *_shifted(d.rhs_batch)),
        lhs_contract=_shifted(d.lhs_contract),
        rhs_contract=_shifted(d.rhs_contract),
    )
    return {**a, "dot_dimension_numbers": dims}


def _dot_general(op: Op, batch: DeviceBatch, memo: dict):
    xs = _stacks(op, batch, [0, 1])
    if xs is None:
        return None
    attrs = _attrs(op, memo, _dot_general_attrs)
    return attrs, xs, _types(op, batch.n, (True, True), memo)


def _reduce(op: Op, batch: DeviceBatch, memo: dict):
    if "reducer" not in memo:
        memo["reducer"] = len(op.operands) == 2 and (
            reducer_kind(_RegionsOnly(op.regions)) is not None
        )
    if not memo["reducer"]:
        return None  # a general reducer runs its region per element: device by device
    xs = _stacks(op, batch, [0])
    init = batch.same(op.operands[1].id)
    if xs is None or init is None:
        return None
    attrs = _attrs(op, memo, lambda a: {**a, "dimensions": (*_shifted(a["dimensions"]),)})
    return attrs, [xs[0], init], _types(op, batch.n, (True, False), memo)


@dataclasses.dataclass
class _RegionsOnly:
    regions: list


def _start_indices(op: Op, batch: DeviceBatch, first: int):
    """The start index operands from position `first` when every device has the same ones,
    with a zero start for the device axis in front; else None."""
    starts = []
    for v in op.operands[first:]:
        s = batch.same(v.id)
        if s is None:
            return None
        starts.append(s)
    return [np.zeros((), dtype=starts[0].dtype if starts else np.int64), *starts]


def _dynamic_slice(op: Op, batch: DeviceBatch, memo: dict):
    xs = _stacks(op, batch, [0])
    starts = _start_indices(op, batch, 1)
    if xs is None or starts is None:
        return None
    attrs = _attrs(op, memo, lambda a: {**a, "slice_sizes": (batch.n, *a["slice_sizes"])})
    types = memo.get("types")
    if types is None:
        types = [_batched_type(op.operands[0].type, batch.n)]
        types += [TensorType((), str(op.operands[1].type.dtype)) for _ in starts]
        memo["types"] = types
    return attrs, [xs[0], *starts], types


def _dynamic_update_slice(op: Op, batch: DeviceBatch, memo: dict):
    xs = _stacks(op, batch, [0, 1])
    starts = _start_indices(op, batch, 2)
    if xs is None or starts is None:
        return None
    types = memo.get("types")
    if types is None:
        types = [_batched_type(op.operands[k].type, batch.n) for k in (0, 1)]
        types += [TensorType((), str(op.operands[2].type.dtype)) for _ in starts]
        memo["types"] = types
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
