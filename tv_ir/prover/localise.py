"""Replay a candidate counterexample concretely, and find where the programs part ways.

The diverging op is the earliest op (in program order, within the cone of the differing
output) whose operands all have a counterpart in the other program but whose result has
none. Constants count: a mask built with the wrong offset diverges at the op that builds
it, not where it is applied. In a distributed implementation a per-device value also has a
counterpart when it is a partial sum of a spec value over device groups, or a spec value
(or partial sum) times a whole number or its reciprocal (a local mean gradient, a sum still
to be divided); index arithmetic on device ids is never blamed, the data op using it is.
See `_Walk`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

from tv_ir.ir.attrs import SdySharding
from tv_ir.ir.program import Module, Op, TensorType, captured
from tv_ir.report.result import NOT_EQUIVALENT, Counterexample, Location, OpSite, OutputResult
from tv_ir.semantics.interpreters.mesh_coords import mesh_coords
from tv_ir.semantics.layout import Layout
from tv_ir.semantics.ops.registry import COLLECTIVES

from ..errors import ProgramHangs, TvError
from ..limits import OutOfMemoryBudget, OutOfTime, check_time, deadline, time_left
from .correspond import MOVEMENT_OPS, TileIndex, box_index, largest_first, mesh_groups
from .simulate import (
    Trace,
    close,
    first_difference,
    overflowed,
    run_traced,
    run_traced_devices,
)

# the share of the time left that looking for the diverging op may take: a refutation is
# replayed at other sizes afterwards (tv_ir.prover.real_size), which must not find the run's
# time spent, or a shown difference would end as `unknown`
LOCATE_SHARE = 0.5

# off while checking a pair whose refutation is never reported (see `without_location`)
_LOCATING: ContextVar[bool] = ContextVar("tv_locating", default=True)


@contextmanager
def without_location() -> Iterator[None]:
    """Refutations made inside are replayed (their counterexample shown concretely) but not
    localised: for a check whose refutation is only a signal to check again (constant tables
    standing for any values, then kept), where the walk would cost most of the refutation
    and its answer be thrown away."""
    token = _LOCATING.set(False)
    try:
        yield
    finally:
        try:
            _LOCATING.reset(token)
        except ValueError:
            # closed by the garbage collector in another context: a watchdog's stop landed
            # inside `__exit__`, and the run's context, setting and all, is gone
            pass


def differs(
    spec: Module, impl: Module, placement, inputs: list, outputs_first: bool = True
) -> bool:
    """Whether `inputs` shows a difference (as `refutation` finds one, without looking for
    where: that walk costs more than the runs). `outputs_first`: the outputs are compared
    from untraced runs first (`outputs_agree`), cheaper where the pair most likely agrees
    (random inputs); a replayed counterexample, which most likely differs, passes False."""
    if outputs_first and outputs_agree(spec, impl, placement, inputs):
        return False
    spec_tr = run_traced(spec, inputs)
    try:
        impl_tr = _run_impl(impl, placement, inputs)
    except ProgramHangs:
        return True  # the spec returned; the implementation never does
    return _first_difference(spec_tr, impl_tr, spec, impl, placement)[1] is not None


def refutation(
    spec: Module,
    impl: Module,
    placement,
    inputs: list,
    locate: bool = True,
    outputs_first: bool = False,
):
    """(counterexample, location, per-output results) if `inputs` shows a difference. The
    location is None when `locate` is False or inside `without_location` (callers that keep
    only the counterexample: the walk costs more than the runs). `outputs_first` as for
    `differs` (random inputs, where the pair most likely agrees)."""
    if outputs_first and outputs_agree(spec, impl, placement, inputs):
        return None
    spec_tr = run_traced(spec, inputs)
    try:
        impl_tr = _run_impl(impl, placement, inputs)
    except ProgramHangs as e:
        return _hang(spec, impl, placement, inputs, e)
    outputs, found = _first_difference(spec_tr, impl_tr, spec, impl, placement)
    if found is None:
        return None
    differing, copy_device, box, b = found
    a = _block(spec_tr.outputs[differing], box)
    b = np.asarray(b)
    local = first_difference(a, b) or (0,) * a.ndim
    idx = tuple(lo + j for (lo, _), j in zip(box, local, strict=True))
    with np.errstate(all="ignore"):
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    ce = Counterexample(
        inputs=_named_inputs(spec, inputs),
        output=differing,
        index=idx,
        expected=_scalar(a[local]),
        actual=_scalar(b[local]),
        device=_holder_device(impl, placement, differing, idx, copy_device),
        max_abs_diff=_largest(diff),
    )
    if ce.device is not None:
        ce.mesh_coords = mesh_coords(impl, ce.device, placement.num_partitions)
    if not (locate and _LOCATING.get()):
        return ce, None, outputs
    left = time_left()
    try:  # with a share of the time left: the rest is for replaying the difference elsewhere
        with deadline(None if left is None else max(left, 0.0) * LOCATE_SHARE):
            loc = _location(spec, impl, placement, inputs, spec_tr, impl_tr, differing)
    except (OutOfTime, OutOfMemoryBudget) as e:  # the difference is shown: only where is not
        loc = Location(note=f"the diverging op was not found ({e} while looking for it)")
    return ce, loc, outputs


def _named_inputs(spec: Module, inputs: list) -> dict:
    """The counterexample's inputs by the spec's argument names; a name that repeats
    (pytree paths, locations) says its argument's number."""
    names = [
        (spec.main.arg_names[k] if k < len(spec.main.arg_names) else None) or f"arg{k}"
        for k in range(len(inputs))
    ]
    return {
        (n if names.count(n) == 1 else f"{n} (arg{k})"): x
        for k, (n, x) in enumerate(zip(names, inputs, strict=True))
    }


def _hang(spec: Module, impl: Module, placement, inputs: list, e: ProgramHangs):
    """`refutation`'s answer when the spec returned on `inputs` and the implementation
    never does (`e`): the devices that wait, the branch they part ways at (located), the
    collective they wait at and where the branch's predicate comes from (related)."""
    device = e.waiting[0] if e.waiting else None
    ce = Counterexample(
        inputs=_named_inputs(spec, inputs),
        output=None,
        index=(),
        expected=None,
        actual=None,
        device=device,
        hang=str(e),
        hang_group=list(e.group),
        hang_waiting=list(e.waiting),
    )
    if device is not None:
        ce.mesh_coords = mesh_coords(impl, device, placement.num_partitions)
    sites = [_site_at(name, loc) for name, loc in e.sites]
    loc = Location(impl=sites[0] if sites else None, related=sites[1:])
    outputs = [OutputResult(k, NOT_EQUIVALENT) for k in range(len(impl.main.body.results))]
    return ce, loc, outputs


def _location(spec, impl, placement, inputs, spec_tr, impl_tr, differing: int) -> Location:
    """Where the programs part ways, for output `differing` (a walk over every value)."""
    walk = _Walk(
        impl.main,
        impl_tr,
        _spec_tiles(spec, spec_tr),
        placement.num_devices,
        other=lambda: _run_impl(impl, placement, _other_inputs(inputs)),
    )
    impl_site, matched_spec, blamed, used_at = _impl_site(impl, walk, differing)
    loc = Location(impl=impl_site, spec=_spec_site(spec, matched_spec, differing))
    if used_at is not None and used_at is not blamed:
        loc.used_at = _site(used_at)
    if blamed is not None:
        loc.related = _wrong_block_sites(blamed, impl, placement, spec_tr, differing, walk)
        loc.related += _body_returns(blamed, impl.main.body.results[differing], walk)
        loc.related += related_sites(blamed, walk.index_values)
        loc.related = _distinct(loc.related, loc.impl)[:RELATED_LIMIT]
    return loc


def _wrong_block_sites(blamed, impl, placement, spec_tr, differing: int, walk) -> list[OpSite]:
    """For an output assembled block by block (`blamed` is the last write into the buffer a
    shard_map returns as output `differing`): the ops that computed the blocks written
    wrong, earliest write first, each followed by where its inputs come from. Each block
    alone is a tile of the spec's result (a block computed from another device's chunk, or
    scaled), so no op before the writes diverges and the last write is blamed; the mistake
    is in the block's producer (a scaled update) or its inputs (a mis-directed ppermute)."""
    if blamed.name != "stablehlo.dynamic_update_slice":
        return []
    if _assembled_by(impl.main.body.results[differing], walk) is not blamed:
        return []
    layout = _shard_map_layout(impl, differing, placement.num_devices)
    if layout is None:
        return []
    spec_out = spec_tr.outputs[differing]
    expected = [_block(spec_out, layout.box(d)) for d in range(placement.num_devices)]
    final = walk.tr.values.get(blamed.results[0].id)
    if final is None:
        return []
    sites: list[OpSite] = []
    for write in reversed(_write_chain(blamed)):
        if _writes_a_wrong_block(write, expected, final, walk.tr):
            producer = write.operands[1].owner
            if producer is not None:
                if producer.loc.line is not None:
                    sites.append(_site(producer))
                sites += related_sites(producer, walk.index_values)
    return sites


def _write_chain(last) -> list:
    """The dynamic_update_slices that fill one buffer, last write first."""
    chain = []
    op = last
    while op is not None and op.name == "stablehlo.dynamic_update_slice":
        chain.append(op)
        op = op.operands[0].owner
    return chain


def _writes_a_wrong_block(write, expected: list, final: list, tr) -> bool:
    """Does `write` put, on some device, a block that is not the expected one where the
    finished buffer differs from it too (a block later overwritten does not count)?"""
    update = tr.values.get(write.operands[1].id)
    offsets = [tr.values.get(o.id) for o in write.operands[2:]]
    if update is None or any(o is None for o in offsets):
        return False
    for d, want in enumerate(expected):
        u = np.asarray(update[d])
        want = np.asarray(want)
        if u.shape == () or want.shape != np.shape(final[d]):
            return False
        starts = [
            min(max(int(np.asarray(o[d])), 0), n - k)
            for o, n, k in zip(offsets, want.shape, u.shape, strict=True)
        ]
        box = tuple(slice(s, s + k) for s, k in zip(starts, u.shape, strict=True))
        if not close(want[box], u) and not close(want[box], np.asarray(final[d])[box]):
            return True
    return False


def _first_difference(spec_tr, impl_tr, spec: Module, impl: Module, placement):
    """(per-output results, the first difference or None): (output, device, box, that
    device's copy) of the first output some device's copy of which is not the spec's."""
    # floats are reals: a run that overflows float64 shows no difference in the outputs
    # that read the overflow (an integer output beside them still can: a counter's `+ 1`
    # wrapping at INT_MAX where the spec's saturates, while `0.9 ** count` overflows)
    skip: set[int] = set()
    if overflowed(spec, spec_tr) or overflowed(impl, impl_tr):
        for i, (s, m) in enumerate(
            zip(spec.main.body.results, impl.main.body.results, strict=True)
        ):
            if overflowed(spec, spec_tr, _cone(s)) or overflowed(impl, impl_tr, _cone(m)):
                skip.add(i)
    # every device's copy of each output is compared: a replicated output is right only if
    # each device holding it holds the spec's value
    copies = placement.output_copies(
        [
            [impl_tr.outputs[k][d] for k in range(len(impl_tr.outputs))]
            for d in range(placement.num_devices)
        ]
    )
    outputs = []
    found = None
    for i, (a, held) in enumerate(zip(spec_tr.outputs, copies, strict=True)):
        if i in skip:
            outputs.append(OutputResult(i, "unknown"))
            continue
        bad = next(((d, box, b) for d, box, b in held if not close(_block(a, box), b)), None)
        # one replay proves a difference, not an equality
        outputs.append(OutputResult(i, "unknown" if bad is None else NOT_EQUIVALENT))
        if bad is not None and found is None:
            found = (i, *bad)
    return outputs, found


def _body_returns(op, output, walk) -> list[OpSite]:
    """For a blamed shard_map (it returns a per-device value as whole, or tiles in the wrong
    places: a missing psum or all_to_all, a wrong shard offset), the body ops computing what
    it returns toward the differing output, and where their inputs come from: the user's
    lines inside the body (the shard_map op itself is located where it is called)."""
    if op.name != "sdy.manual_computation" or not op.regions:
        return []
    cone = _cone(output)
    body = op.regions[0].block.results
    sites = []
    for r, v in zip(op.results, body, strict=True):
        if r.id in cone and v.owner is not None:
            if v.owner.loc.line is not None:
                sites.append(_site(v.owner))
            sites += related_sites(v.owner, walk.index_values)
    return sites


def _distinct(sites: list[OpSite], own: OpSite | None) -> list[OpSite]:
    """Sites on distinct lines other than `own`'s."""
    seen = {(own.file, own.line)} if own is not None else set()
    out = []
    for s in sites:
        if (s.file, s.line) not in seen:
            seen.add((s.file, s.line))
            out.append(s)
    return out


def _largest(diff: np.ndarray) -> float:
    """The largest of the differences that are numbers (NaN when none is: NaN against a
    number everywhere)."""
    numbers = diff[~np.isnan(diff)]
    if numbers.size:
        return float(numbers.max())
    return float("nan") if diff.size else 0.0


def _run_impl(impl: Module, placement, inputs: list, values: bool = True):
    return run_traced_devices(
        impl,
        placement.shard_inputs(inputs),
        placement.num_replicas,
        placement.num_partitions,
        values,
    )


def outputs_agree(spec: Module, impl: Module, placement, inputs: list) -> bool:
    """Whether every output agrees on `inputs`, from runs that keep their outputs alone
    (cheaper: the devices' values stay batched). Only outputs that differ need every value:
    whether a run overflowed (then no difference counts) and where they part ways."""
    spec_out = run_traced(spec, inputs, values=False)
    try:
        impl_out = _run_impl(impl, placement, inputs, values=False)
    except ProgramHangs:
        return False  # told apart, and said why, by the traced runs
    return _first_difference(spec_out, impl_out, spec, impl, placement)[1] is None


def _other_inputs(inputs: list) -> list:
    """Fresh float inputs of the same shapes (integer and boolean inputs kept: they may be
    indices), to tell data-free values from data."""
    rng = np.random.default_rng(12345)
    out = []
    for x in inputs:
        a = None if x is None else np.asarray(x)
        if a is not None and a.dtype.kind == "f":
            a = rng.standard_normal(a.shape).astype(np.float32).astype(a.dtype)
        out.append(a)
    return out


def _block(array, box):
    return np.asarray(array)[box_index(box)]


def _holder_device(impl: Module, placement, output: int, idx, device: int) -> int | None:
    """The device that computed the differing element of `device`'s copy of an output: for
    an output returned by a shard_map, `device` itself if its piece (by the shard_map's
    out_sharding) holds the element (each device keeps its own copy), else the first device
    whose piece holds it; otherwise `device`, whose box holds it."""
    if not placement.distributed:
        return None
    layout = _shard_map_layout(impl, output, placement.num_partitions)
    if layout is None or _holds(layout, device, idx):
        return device
    return _holder(layout, idx)


def _shard_map_layout(impl: Module, output: int, n: int) -> Layout | None:
    """How a top-level shard_map (or GSPMD `@SPMDShardToFullShape`) assembles an output
    from its devices' pieces, if it does."""
    value = impl.main.body.results[output]
    op = value.owner
    if op is None or not isinstance(value.type, TensorType):
        return None
    if op.attrs.get("call_target_name") == "SPMDShardToFullShape":
        text = op.attrs.get("mhlo.sharding")
        try:
            lay = Layout.from_hlo_sharding(text, tuple(value.type.shape), n)
        except (TvError, ValueError):
            return None
        return lay if isinstance(lay, Layout) and not lay.manual else None
    if op.name != "sdy.manual_computation":
        return None
    k = next(i for i, r in enumerate(op.results) if r is value)
    shardings = op.attrs.get("out_shardings") or []
    if k >= len(shardings):
        return None
    manual = set(op.attrs.get("manual_axes") or ())
    s = shardings[k]
    only = SdySharding(s.mesh, tuple(tuple(a for a in ax if a.name in manual) for ax in s.dims))
    try:
        return Layout.from_sdy(only, impl.attrs.get("sdy.meshes"), tuple(value.type.shape), n)
    except TvError:
        return None


def _holder(layout, idx) -> int | None:
    """The first device whose box holds element `idx` of a result."""
    for d in range(layout.num_devices):
        if _holds(layout, d, idx):
            return d
    return None


def _holds(layout, device: int, idx) -> bool:
    return all(a <= i < b for i, (a, b) in zip(idx, layout.box(device), strict=True))


def _scalar(x):
    x = np.asarray(x)
    return x.item()


def _spec_tiles(spec: Module, spec_tr) -> TileIndex:
    shapes, order = {}, {}
    values = list(spec.main.args) + [v for op in spec.main.body.ops for v in op.results]
    for v in values:
        if isinstance(v.type, TensorType):
            shapes[v.id] = v.type.shape
            order[v.id] = len(order)
    return TileIndex([spec_tr], shapes, order, loose_rank=True)


@dataclass(frozen=True)
class Kind:
    """How an implementation value relates to the spec, for localisation only.

    On every device the value (summed over its group, when `groups` is given) is `scale`
    times a tile of one spec value. `mixed`: each device holds a tile of a spec value of its
    own, or a data-free value (pipeline stages, bubbles). `idle`: data-free on every device.
    """

    scale: float = 1.0
    groups: tuple | None = None
    mixed: bool = False
    idle: bool = False

    @property
    def exact(self) -> bool:
        return self.scale == 1.0 and self.groups is None and not self.idle

    @property
    def suspicious(self) -> bool:
        """A whole value off by a constant factor: right only if a later op rescales it."""
        return self.groups is None and self.scale != 1.0

    def same(self, other: Kind | None) -> bool:
        """Same relation to the spec (tiles of one or of several spec values alike)."""
        return (
            other is not None
            and self.groups == other.groups
            and self.idle == other.idle
            and abs(self.scale - other.scale) <= 1e-9 * abs(self.scale)
        )


EXACT = Kind()
IDLE = Kind(idle=True)
MIXED = Kind(mixed=True)
DEVICE_IDS = {"stablehlo.partition_id", "stablehlo.replica_id"}


def _impl_site(impl: Module, walk: _Walk, output: int):
    """The implementation op where the first divergence appears (see `_Walk`); also the set
    of spec values that some implementation value equals, the blamed op, and the diverging
    op that used the blamed op's value as a whole (the same op unless blame moved back)."""
    main = impl.main
    result = main.body.results[output]
    cone = _cone(result)
    users = _users(main)
    site = healed = used_at = None
    for op in _execution_order(main):
        check_time()
        walk.note_spec_values(op)  # every value, so the spec side knows what has a counterpart
        if site is None and any(r.id in cone for r in op.results) and walk.diverges(op):
            if walk.persists(op, result, cone, users):
                site, used_at = walk.blame(op), op
            elif healed is None:
                healed = op
    if site is None:
        kind = walk.kind(result)
        if kind is not None and kind.suspicious:  # off by a factor: where it was scaled
            # before a divergence that heals: that one does not reach the output, the
            # factor does (HF GPT-2's doubled loss, at reduced shapes, beside a piece of
            # the fused QKV split that matches no spec tile there)
            site = walk.introducer(result)
    if site is None and healed is not None:  # no divergence reaches the output on its own
        site, used_at = walk.blame(healed), healed
    if site is None:  # every value has a counterpart, but the output is not the spec's:
        site = _assembled_by(result, walk) or result.owner  # e.g. a partial sum as whole
    return (_site(site) if site is not None else None), walk.spec_seen, site, used_at


ASSEMBLING = ("stablehlo.dynamic_update_slice", "stablehlo.scatter")


def _assembled_by(value, walk):
    """The last write into a block-by-block assembled buffer that `value` returns (through a
    shard_map's body), if it is one: the assembled whole is what differs."""
    while value is not None and value.owner is not None:
        op = value.owner
        if op.name in ASSEMBLING and value.id in walk.assembling:
            return op
        if op.name == "sdy.manual_computation" and op.regions:
            k = next(i for i, r in enumerate(op.results) if r is value)
            value = op.regions[0].block.results[k]
            continue
        return None
    return None


# ops where data is moved between devices or picked out of a larger value: the first such op
# on a path into the diverging op says where that input came from
_DATA_SOURCES = {
    "stablehlo.slice",
    "stablehlo.dynamic_slice",
    "stablehlo.gather",
    "stablehlo.dynamic_update_slice",
    "stablehlo.scatter",
} | set(COLLECTIVES)
RELATED_LIMIT = 6


def related_sites(op: Op, index_values: set[int]) -> list[OpSite]:
    """Where the diverging op's inputs come from, for the reader deciding which of them is
    wrong (a block written at the right place with the wrong data, or the reverse, can be
    the same program): on each data path the nearest collective or slice, and the ops
    computing its index operands from device ids or constants. Sites on the op's own
    line are left out."""
    own = (op.loc.file, op.loc.line)
    found: list[Op] = []
    seen: set[int] = set()
    stack = [(v, v.id in index_values) for v in op.operands]
    while stack and len(found) < 4 * RELATED_LIMIT:
        v, is_index = stack.pop()
        src = v.owner
        if src is None or id(src) in seen:
            continue
        seen.add(id(src))
        if is_index:
            found.append(src)
            stack += [(u, True) for u in src.operands if u.id in index_values]
        elif src.name in _DATA_SOURCES:
            found.append(src)
            stack += [(u, True) for u in src.operands if u.id in index_values]
        else:
            stack += [(u, u.id in index_values) for u in src.operands]
    sites, lines = [], set()
    for o in found:
        key = (o.loc.file, o.loc.line)
        if o.loc.line is None or key == own or key in lines:
            continue
        lines.add(key)
        sites.append(_site(o))
    return sites[:RELATED_LIMIT]


class _Walk:
    """Counterparts of implementation values, from one concrete run (and a second run on
    other inputs, which tells data-free values apart).

    A value has a counterpart when it is a tile of a spec value, a partial sum of one over
    device groups, either of these times a whole number or its reciprocal, or, device by
    device, a tile or a data-free value. Values computed from `partition_id`/`replica_id`
    without data (axis_index arithmetic, offsets, stage masks) are index arithmetic: they
    always count as matching and are never blamed; the data op using them is.
    """

    def __init__(self, fn, tr, index: TileIndex, n: int, other: Callable[[], Trace] | None = None):
        self.tr = tr
        self.index = index
        self.n = n  # devices
        self._other = other  # runs the same program on other inputs
        self._other_trace: Trace | None = None
        self.order = {v.id: k for k, v in enumerate(_values_in_order(fn))}
        self.from_data, self.index_values = _dependence(fn)
        # constants and iotas match; where they are used is what matters
        ops = _execution_order(fn)
        # constants, and splats of scalar constants (a `where`'s 0.0 fill value): where they
        # are used is what matters. (A mask computed from constants is compared: a wrong
        # offset in it diverges where it is built.)
        self.constants: set[int] = set()
        for op in ops:
            if _is_constant_op(op, self.constants):
                self.constants.update(r.id for r in op.results)
        self.kinds: dict[int, Kind | None] = {}
        self.spec_seen: set[int] = set()
        self._held: dict[int, set[int]] = {}  # value id -> `held(v)`
        # buffers being filled block by block (dynamic_update_slice / scatter of matched
        # pieces into a matched or partly filled buffer): judged when complete, not per write
        self.assembling: set[int] = set()

    # -- what a value is ----------------------------------------------------------------
    def tracked(self, v) -> bool:
        return isinstance(v.type, TensorType) and v.id in self.tr.values

    def is_data(self, v) -> bool:
        """A value the walk compares with the spec (not an index, not a constant, not
        untracked)."""
        return self.tracked(v) and v.id not in self.index_values and v.id not in self.constants

    def note_spec_values(self, op) -> None:
        for r in op.results:
            if self.is_data(r):
                self.spec_seen |= self.held(r)

    def held(self, v) -> set[int]:
        """The spec values a tile of which `v` is on every device: looked up once per value
        (the spec side's note and the value's kind both ask; the look-up is most of the
        walk's cost)."""
        found = self._held.get(v.id)
        if found is None:
            found = self._held[v.id] = self.index.values_held([[x] for x in self.tr.values[v.id]])
        return found

    def kind(self, v) -> Kind | None:
        if not self.is_data(v):
            return EXACT
        if v.id not in self.kinds:
            self.kinds[v.id] = self._classify(v)
        return self.kinds[v.id]

    def _classify(self, v) -> Kind | None:
        vals = self.tr.values[v.id]
        if self.held(v):
            return EXACT
        if np.asarray(vals[0]).dtype.kind != "f":
            return None
        c = self.index.scale_of([[x] for x in vals])
        if c is not None:  # before partial sums: a replicated value is a trivial one
            return Kind(scale=c)
        if self.n > 1 and self._partly_idle_tiles(v, vals):
            return MIXED  # not a partial sum whose other members happen to be zeros
        sums = [(g, _group_sums(vals, g)) for g in mesh_groups(self.n)] if self.n > 1 else []
        for groups, summed in sums:
            if self.index.values_held([[x] for x in summed]):
                return Kind(groups=groups)
        for groups, summed in sums:
            c = self.index.scale_of([[x] for x in summed])
            if c is not None:
                return Kind(scale=c, groups=groups)
        if self.n == 1:  # the rest is about devices holding different things
            return None
        idle = self.idle_devices(v)
        if all(idle):
            return IDLE
        if all(
            idle[d] or self.index.holds_tile([vals[d]]) for d in largest_first([[x] for x in vals])
        ):
            return MIXED
        return None

    def _partly_idle_tiles(self, v, vals) -> bool:
        """Some devices hold data-free values (a pipeline stage that has not started: its
        zeros) and every other one a tile. Summed over a group, such zeros would make any
        tile look like a partial sum."""
        idle = self.idle_devices(v)
        return (
            any(idle)
            and not all(idle)
            and all(
                idle[d] or self.index.holds_tile([vals[d]])
                for d in largest_first([[x] for x in vals])
            )
        )

    def idle_devices(self, v) -> list[bool]:
        """Per device: does the value come out the same on other inputs (data-free)?"""
        other = self._other_run()
        if not self.is_data(v) or other is None or v.id not in other.values:
            return [False] * self.n
        return [close(a, b) for a, b in zip(self.tr.values[v.id], other.values[v.id], strict=True)]

    def _other_run(self) -> Trace | None:
        if self._other_trace is None and self._other is not None:
            try:
                self._other_trace = self._other()
            except TvError:  # e.g. control flow the other inputs steer elsewhere
                self._other_trace = Trace()
            self._other = None
        return self._other_trace

    def matched(self, v) -> bool:
        return v.id in self.assembling or self.kind(v) is not None

    # -- where the programs part ways --------------------------------------------------
    def diverges(self, op) -> bool:
        """Do the op's operands all have counterparts while a result has none (or its data
        is lost: a data-free result on every device from operands that carry data)?"""
        if not op.operands or all(not self.is_data(r) for r in op.results):
            return False  # constants, iotas, index arithmetic: where they are used matters
        if not all(self.matched(v) for v in _data_inputs(op)):
            return False
        if op.name in ASSEMBLING and not any(self.matched(r) for r in op.results):
            self.assembling.update(r.id for r in op.results)
            return False
        return any(not self.matched(r) or self.lost(op, r) for r in op.results)

    def persists(self, op, output, cone: set[int], users: dict[int, list]) -> bool:
        """Does a result of `op` without a counterpart reach `output` through values that
        have none either? A value the spec never computes that is only restructured data
        (the batch reshaped into micro-batches, each of which is a tile of the spec's batch
        again) heals on the way: the op that made it is not where the programs part ways."""
        stack = [r for r in op.results if r.id in cone and not self.matched(r)]
        seen: set[int] = set()
        while stack:
            check_time()
            v = stack.pop()
            if v.id == output.id:
                return True
            if v.id in seen:
                continue
            seen.add(v.id)
            for user in users.get(v.id, ()):
                stack.extend(
                    r
                    for r in _fed_by(user, v)
                    if r.id in cone and r.id not in seen and not self.matched(r)
                )
        return False

    def lost(self, op, r) -> bool:
        if self.n == 1 or not self.is_data(r) or not all(self.idle_devices(r)):
            return False
        return any(self.is_data(v) and not all(self.idle_devices(v)) for v in _data_inputs(op))

    def blame(self, op):
        """The diverging op, unless it uses as a whole a value that is only right up to a
        factor or only a partial sum, and does not itself move, reduce or return it (a
        softmax of mis-scaled scores, an rsqrt of an unreduced variance): then the op where
        that value arose (a missing collective belongs after it)."""
        for r in op.results if op.name == "sdy.manual_computation" else ():
            writer = _assembled_by(r, self)
            if writer is not None:  # its body returns a buffer assembled block by block
                return writer
        for v in _data_inputs(op):  # a buffer assembled block by block: its last write
            if v.id in self.assembling and v.owner is not None:
                return v.owner
        handles_partials = _handles_partials(op)
        for v in _data_inputs(op):
            kind = self.kind(v) if v.id in self.from_data else None
            if kind is None:
                continue
            if kind.suspicious or (kind.groups is not None and not handles_partials):
                return self.introducer(v)
        return op

    def introducer(self, v):
        """The op that gave `v` its relation to the spec: walk back through data inputs of
        the same kind (a shard_map passes its body's result through). Any factor counts as
        the same (which spec value a value is a multiple of can be ambiguous), and any partial
        sum as the same partial sum (a local mean is a local sum, scaled)."""
        kind = self.kind(v)
        while v.owner is not None:
            op = v.owner
            same = [u for u in _data_inputs(op) if self._same_kind(kind, u)]
            if not same:
                return op
            v = max(same, key=lambda u: self.order.get(u.id, -1))
        return None

    def _same_kind(self, kind: Kind, u) -> bool:
        other = self.kind(u) if u.id in self.from_data else None
        if other is None:
            return False
        if kind.suspicious:
            return other.suspicious
        if kind.groups is not None:
            return other.groups is not None
        return kind.same(other)


def _handles_partials(op) -> bool:
    """Ops that move, reduce or return partial sums as such: a wrong one is to blame itself."""
    return (
        op.name in MOVEMENT_OPS
        or op.name in COLLECTIVES
        or op.name == "sdy.manual_computation"
        or op.attrs.get("call_target_name") == "SPMDShardToFullShape"
    )


def _data_inputs(op) -> list:
    """Operands, and for a shard_map the values its body returns."""
    ins = list(op.operands)
    if op.name == "sdy.manual_computation" and op.regions:
        ins += op.regions[0].block.results
    return ins


def _users(fn) -> dict[int, list]:
    """The ops that read each value (a shard_map reads the values its body returns)."""
    users: dict[int, list] = {}
    for op in _execution_order(fn):
        for v in _data_inputs(op):
            users.setdefault(v.id, []).append(op)
    return users


def _fed_by(op, v) -> list:
    """The results of `op` that `v` flows into: all of them, or for a shard_map whose body
    returns `v`, the matching results."""
    if op.name == "sdy.manual_computation" and op.regions:
        body = op.regions[0].block.results
        if any(r is v for r in body) and not any(u is v for u in op.operands):
            return [r for r, b in zip(op.results, body, strict=True) if b is v]
    return list(op.results)


def _group_sums(vals: list, groups) -> list:
    """Each device's value replaced by the sum over its group."""
    out: list = [None] * len(vals)
    for g in groups:
        total = sum(np.asarray(vals[d], dtype=np.float64) for d in g)
        for d in g:
            out[d] = total
    return out


def _values_in_order(fn) -> list:
    vals = list(fn.args)
    for op in _execution_order(fn):
        vals += op.results
    return vals


def _dependence(fn) -> tuple[set[int], set[int]]:
    """(values computed from data, index arithmetic). Index arithmetic: values computed
    without data from device ids (axis_index, offsets, stage masks), and integer scalars
    computed from constants alone (slice offsets)."""
    data: set[int] = {v.id for v in fn.args}
    for op in fn.body.ops:  # shard_map bodies take slices of the (data) arguments
        if op.name == "sdy.manual_computation" and op.regions:
            data.update(v.id for v in op.regions[0].block.args)
    device: set[int] = set()
    offsets: set[int] = set()
    for op in _execution_order(fn):
        # a branch or loop body reads outer values without taking them as operands: a
        # `case` on the stage picking a function of the data is data, not index arithmetic
        ids = [v.id for v in op.operands] + [v.id for v in captured(op)]
        if any(i in data for i in ids):
            data.update(r.id for r in op.results)
        elif op.name in DEVICE_IDS or any(i in device for i in ids):
            device.update(r.id for r in op.results)
        elif ids:
            offsets.update(r.id for r in op.results if _int_scalar(r))
    return data, device | offsets


def _int_scalar(v) -> bool:
    t = v.type
    return isinstance(t, TensorType) and not t.shape and not t.is_float


def _is_constant_op(op, constants: set[int]) -> bool:
    """A constant or iota, or a splat of a scalar constant (a `where`'s 0.0 fill value)."""
    if not op.operands:
        return True
    x = op.operands[0]
    return (
        op.name == "stablehlo.broadcast_in_dim"
        and x.id in constants
        and not getattr(x.type, "shape", ())
    )


def _spec_site(spec: Module, matched: set[int], output: int) -> OpSite | None:
    """Earliest spec op whose operands all have impl counterparts but whose result has none."""
    main = spec.main
    cone = _cone(main.body.results[output])
    ok = {v.id for v in main.args} | matched
    consts: set[int] = set()
    for op in main.body.ops:
        if _is_constant_op(op, consts):  # constants, iotas, splats: where they are used
            consts.update(r.id for r in op.results)
            ok.update(r.id for r in op.results)
            continue
        if not any(r.id in cone for r in op.results):
            continue
        if all(v.id in ok for v in op.operands) and not all(r.id in ok for r in op.results):
            return _site(op)
    producer = main.body.results[output].owner
    return _site(producer) if producer is not None else None


def _execution_order(fn):
    """Top-level ops in program order, with the body of each shard_map region
    (`sdy.manual_computation`, whose body values the simulation records) before the op."""
    for op in fn.body.ops:
        if op.name == "sdy.manual_computation" and op.regions:
            yield from op.regions[0].block.ops
        yield op


def _cone(value) -> set[int]:
    """Values `value` depends on (through shard_map bodies too)."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if v.id in seen:
            continue
        seen.add(v.id)
        if v.owner is not None:
            stack.extend(v.owner.operands)
            stack.extend(captured(v.owner))
            if v.owner.name == "sdy.manual_computation" and v.owner.regions:
                stack.extend(v.owner.regions[0].block.results)
    return seen


def _site(op: Op) -> OpSite:
    return _site_at(op.name, op.loc)


def _site_at(name: str, loc) -> OpSite:
    return OpSite(op=name, file=loc.file, line=loc.line, name=loc.name, function=loc.function)
