"""Run one per-device program on every process of a StableHLO process grid, in lockstep (SPMD).

Each process has its own `BlockEvaluator` (its environment, its `Device` in `OpContext.device`),
so ordinary ops (and the regions inside them) run per device through the op table, and
`partition_id` / `replica_id` fold to constants per device. Collectives run once for all
devices from `COLLECTIVES` with the `ProcessGrid`. Ops whose regions may hold collectives
(`while`, `case`, `if`, `func.call`, `composite`) run their regions on all devices together;
their predicates / indices must agree across devices.

Values cross the API as per-device lists: `run` takes and returns `[device_id][index]`
(device id = replica_id * num_partitions + partition_id), and so does the hook.

`sdy.manual_computation` (what `jax.shard_map` lowers to) runs in lockstep too: each device's
(global) operand is cut to its piece by the `in_shardings` (over the manual axes, device =
partition id), the body runs on all devices with its collectives, and the devices' results
are assembled by the `out_shardings` into the global value each device then holds.
The hook sees the ops of a top-level manual computation's body as well (with local values).
The GSPMD form of shard_map works the same way: `custom_call @SPMDFullToShardShape` cuts its
operand by the `mhlo.sharding` of the `@Sharding` annotation producing it, and
`@SPMDShardToFullShape` assembles the devices' pieces by its own `mhlo.sharding`.

Replicas. A box of a result that several devices compute (an out_sharding leaves a manual
axis out: `out_specs=P()`) is only *claimed* equal on them (`check_vma=False` does not check
it). As XLA does, each device keeps its own copy: its global value holds its own piece in
its box, and the first holder's copy of every box it does not compute. Boxes whose copies
are not identical are recorded in `replicas` (`Replicas`): the prover proves every copy
equal to the first, or refutes the claim on the device named.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from tv_ir.errors import BadInput, ProgramHangs, Unsupported, devices_clause
from tv_ir.ir.attrs import SdySharding
from tv_ir.ir.program import Block, Function, Module, Op, TensorType, walk
from tv_ir.limits import CHECK_EVERY, check_time
from tv_ir.semantics.algebra import NumpyAlgebra
from tv_ir.semantics.interpreters.device_batch import (
    BATCHED_COLLECTIVES,
    DEVICE_BATCH,
    DeviceBatch,
    Stacked,
)
from tv_ir.semantics.interpreters.evaluator import (
    BlockEvaluator,
    InterpreterError,
    checked_results,
    run_evaluator,
)
from tv_ir.semantics.interpreters.invariant_ops import InvariantValues
from tv_ir.semantics.interpreters.mesh_coords import mesh_coords
from tv_ir.semantics.interpreters.process_grid import ProcessGrid
from tv_ir.semantics.layout import Layout
from tv_ir.semantics.ops.collectives import covering_groups
from tv_ir.semantics.ops.control import (
    TRIP_LIMIT,
    LoopTooLong,
    collective_in,
    known_truth,
    refuse_collective_branches,
    select_case,
    select_results,
    while_,
)
from tv_ir.semantics.ops.registry import COLLECTIVES, GLOBAL_VIEW

_GSPMD = ("SPMDFullToShardShape", "SPMDShardToFullShape")
PerDevice = list[list]  # [device_id][value index]
SpmdHook = Callable[[Op, PerDevice], PerDevice]
# before a top-level op is evaluated: its results on every device, when they are known
# without evaluating it (given the op and how to read its operands on every device)
SpmdPrehook = Callable[[Op, Callable[[Op], PerDevice]], PerDevice | None]


@dataclasses.dataclass
class Replicas:
    """One box of a shard_map result computed by several devices, whose copies are claimed
    equal (by the out_sharding) but are not identical values: each copy must be proved
    equal to the first (what a device that does not compute the box reads)."""

    op: Op
    result: int  # which result of `op`
    box: tuple  # ((start, stop), ...) of the global value
    devices: tuple[int, ...]  # device ids holding a copy, in order (device 0's first)
    values: list  # each device's copy (its local piece)

    def where(self) -> str:
        """'result 0 of sdy.manual_computation at f.py:12'."""
        loc = self.op.loc
        at = f" at {loc.file}:{loc.line}" if getattr(loc, "file", None) else ""
        return f"result {self.result} of {self.op.name}{at}"


class SpmdInterpreter:
    """Lockstep execution of `module` on `num_replicas` x `num_partitions` processes.

    Grid sizes default to the module's `mhlo.num_replicas` / `mhlo.num_partitions`, else 1.
    `hook(op, per_device_results)` sees (and may replace) the results of each top-level op.
    """

    def __init__(
        self,
        module: Module,
        alg,
        num_replicas: int | None = None,
        num_partitions: int | None = None,
        hook: SpmdHook | None = None,
        prehook: SpmdPrehook | None = None,
    ):
        self.module = module
        self.alg = alg
        self.hook = hook
        self.prehook = prehook
        self.grid = ProcessGrid(
            num_replicas or int(module.attrs.get("mhlo.num_replicas", 1)),
            num_partitions or int(module.attrs.get("mhlo.num_partitions", 1)),
            meshes=module.attrs.get("sdy.meshes"),
        )
        self.procs = [BlockEvaluator(module, alg, device=d) for d in self.grid.devices]
        # concrete runs evaluate ordinary ops once for all devices (device_batch)
        self.batch = (
            DeviceBatch(len(self.procs), alg)
            if type(alg) is NumpyAlgebra and len(self.procs) > 1 and DEVICE_BATCH.get()
            else None
        )
        if self.batch is not None:  # the devices read the values batched for all from it
            for proc, env in zip(self.procs, self.batch.envs, strict=True):
                proc.env = env
        self.replicas: list[Replicas] = []  # claimed-replicated boxes whose copies differ
        # a region's constant-derived values on all devices, made once (concrete runs)
        self.invariants = InvariantValues() if type(alg) is NumpyAlgebra else None
        # id(block) -> (block, its ops to run, their tape) for device-batched regions run whole
        self._tapes: dict[int, tuple] = {}

    @property
    def num_devices(self) -> int:
        return len(self.procs)

    def run(self, per_device_args: PerDevice, fn: Function | None = None) -> PerDevice:
        """Run `fn` (default: main) with `per_device_args[device_id]` on each device."""
        if len(per_device_args) != self.num_devices:
            raise BadInput(f"{len(per_device_args)} argument lists for {self.num_devices} devices")
        fn = fn or self.module.main
        return self._block(fn.body, [list(a) for a in per_device_args], top=True)

    def run_op(self, op: Op, per_device_operands: PerDevice) -> PerDevice:
        """Evaluate one op on every device from the given operands."""
        for proc, xs in zip(self.procs, per_device_operands, strict=True):
            for v, x in zip(op.operands, xs, strict=True):
                proc.env[v.id] = x
        out = self._op(op)
        return self.batch.per_device(op, out) if type(out) is Stacked else out

    # -- blocks and ops ----------------------------------------------------------------------
    def _block(self, block: Block, args: PerDevice, top: bool) -> PerDevice:
        for a in args:
            if len(a) != len(block.args):
                raise InterpreterError(f"block takes {len(block.args)} arguments, got {len(a)}")
        if self.batch is not None:  # a loop's state: what was stacked is passed on stacked
            self.batch.put_values(block.args, args)
        else:
            for proc, a in zip(self.procs, args, strict=True):
                for v, x in zip(block.args, a, strict=True):
                    proc.env[v.id] = x
        envs = [proc.env for proc in self.procs]
        hook = self.hook if top else None
        prehook = self.prehook if top else None
        fixed = self.invariants.of(block, top) if self.invariants is not None else None
        ops = self.invariants.to_run(block) if fixed else block.ops
        if fixed and ops is not block.ops and self.batch is not None:  # run whole before
            self._run_tape(self._tape(block, ops), envs)
            return self.batch.values_of([v.id for v in block.results])
        for k, op in enumerate(ops):
            if not k & CHECK_EVERY:  # the limits, polled every few ops
                check_time()
            results = prehook(op, self._operands) if prehook is not None else None
            if results is not None:  # known without evaluating the op
                _write(envs, op, results)
                continue
            if fixed and id(op) in fixed:  # the same on every device, every time
                results = self.invariants.results(op, self._op)
            else:
                results = self._op(op, top)
            if type(results) is Stacked:
                if hook is None:  # held stacked: each device reads its slice when it needs it
                    self.batch.put(op, results)
                    continue
                results = hook(op, self.batch.per_device(op, results))
                if self.batch.holds(op, results):  # the hook only read them: held stacked
                    continue
            elif hook is not None:
                results = hook(op, results)
            _write(envs, op, results)
        if fixed:
            self.invariants.ran(block, fixed)
        if self.batch is not None:
            return self.batch.values_of([v.id for v in block.results])
        return [[proc.env[v.id] for v in block.results] for proc in self.procs]

    def _tape(self, block: Block, ops: list[Op]) -> list[tuple]:
        """`ops` (a region's ops still to evaluate at each run, device-batched) as a tape:
        per op, its batch plan when `_op` would reach the device batch, else None."""
        known = self._tapes.get(id(block))
        if known is not None and known[0] is block and known[1] is ops:
            return known[2]
        tape = []
        for op in ops:
            plan = None
            if not self._own_way(op):
                plan = self.batch.plan(op)
                plan = plan if plan[1] is not None else None
            tape.append((op, plan))
        self._tapes[id(block)] = (block, ops, tape)
        return tape

    def _run_tape(self, tape: list[tuple], envs: list) -> None:
        """Evaluate a region's tape: what `_block` and `_op` do op by op, the batch plans
        already found."""
        batch, procs = self.batch, self.procs
        for k, (op, plan) in enumerate(tape):
            if not k & CHECK_EVERY:  # the limits, polled every few ops
                check_time()
            if plan is None:
                results = self._op(op)
            else:
                results = batch.evaluate(op, procs, plan)
                if results is None:
                    results = [self._on_device(proc, op) for proc in procs]
            if type(results) is Stacked:  # held stacked, as `_block` holds it
                batch.put(op, results)
                continue
            _write(envs, op, results)

    def _op(self, op: Op, top: bool = False) -> PerDevice | Stacked:
        """`op`'s results on every device: per device, or `Stacked` when the device batch
        evaluated it once for all (`_block` holds those as they are)."""
        if self._own_way(op):
            return self._evaluated_own_way(op, top)
        if self.batch is not None:
            out = self.batch.evaluate(op, self.procs)
            if out is not None:
                return out
        return [self._on_device(proc, op) for proc in self.procs]

    def _own_way(self, op: Op) -> bool:
        """Whether `op` is evaluated its own way here (`_evaluated_own_way`), not as an
        ordinary op (the device batch, else device by device)."""
        return (
            op.name in COLLECTIVES
            or (op.name in GLOBAL_VIEW and self.num_devices > 1)
            or op.name == "sdy.manual_computation"
            or (op.name == "stablehlo.custom_call" and op.attrs.get("call_target_name") in _GSPMD)
            or op.name in _LOCKSTEP
        )

    def _evaluated_own_way(self, op: Op, top: bool) -> PerDevice | Stacked:
        """Collectives, global-view ops (refused), shard_maps, GSPMD's markers, lockstep
        control flow."""
        if op.name in COLLECTIVES:
            return self._collective(op)
        if op.name in GLOBAL_VIEW and self.num_devices > 1:
            raise Unsupported(
                f"{op.name} in a per-device program (a Shardy op of the global view: "
                "partition the module first)",
                op=op.name,
                loc=op.loc,
            )
        operands = self._operands(op)
        if op.name == "sdy.manual_computation":
            out = run_evaluator(op, lambda: self._manual_computation(op, operands, top))
        elif op.name == "stablehlo.custom_call":
            out = run_evaluator(op, lambda: self._gspmd_manual(op, operands))
        else:
            lockstep = _LOCKSTEP[op.name]
            out = run_evaluator(op, lambda: lockstep(self, op, operands))
        return [checked_results(op, o) for o in out]

    def _on_device(self, proc: BlockEvaluator, op: Op) -> list:
        """An ordinary op on one device; evaluator faults name the device."""
        try:
            return proc.evaluate_op(op)
        except InterpreterError as e:
            d = proc.device
            where = f"device {d.device_id} (replica {d.replica_id}, partition {d.partition_id})"
            if where in str(e):
                raise
            raise InterpreterError(f"{e} on {where}") from e

    def _operands(self, op: Op) -> PerDevice:
        return [[proc.env[v.id] for v in op.operands] for proc in self.procs]

    def _collective(self, op: Op) -> PerDevice | Stacked:
        fn = COLLECTIVES[op.name]
        ctx = dataclasses.replace(self.procs[0].context(op), device=None)
        if self.batch is not None and op.name.split(".", 1)[-1] in BATCHED_COLLECTIVES:
            groups = run_evaluator(op, lambda: covering_groups(ctx, self.grid))
            out = run_evaluator(op, lambda: self.batch.collective(op, ctx, groups))
            if out is not None:
                return out
        operands = self._operands(op)
        out = run_evaluator(op, lambda: fn(ctx, self.grid, operands))
        return [checked_results(op, o) for o in out]

    def _region(self, op: Op, i: int, args: PerDevice) -> PerDevice:
        return self._block(op.regions[i].block, args, top=False)

    def _agreed(self, op: Op, what: str, values: list):
        """The value every device computed for a control decision."""
        if any(v != values[0] for v in values):
            raise Unsupported(f"{op.name}: {what} diverges across devices: {values}", op=op.name)
        return values[0]

    # -- lockstep control flow ---------------------------------------------------------------
    def _while(self, op: Op, operands: PerDevice) -> PerDevice:
        """Every device's loop in lockstep while the devices agree on going on; once they
        do not (or it depends on the inputs), a loop that does not talk to other devices
        goes on on each device alone: the same as in lockstep, as no device waits for
        another."""
        values = operands
        for _ in range(TRIP_LIMIT.get()):
            preds = [known_truth(self.alg, p[0]) for p in self._region(op, 0, values)]
            decided = all(p is not None and p == preds[0] for p in preds)
            if not decided and collective_in(op.regions) is None:
                return [
                    self._own_loop(proc, op, v) for proc, v in zip(self.procs, values, strict=True)
                ]
            if any(p is None for p in preds):
                raise Unsupported(
                    f"{op.name}: the loop predicate depends on the inputs and the loop holds "
                    f"{collective_in(op.regions)}",
                    op=op.name,
                )
            # devices that go on wait at the body's collective for those that stopped
            split = self._split_group(op, [1 if p else -1 for p in preds])
            if split is not None:
                decided_by = op.regions[0].block.results[0].owner
                raise _hangs(op, "the loop predicate differs across devices and the body holds",
                             split, decided_by, self._device_name)  # fmt: skip
            if not self._agreed(op, "the loop predicate", preds):
                return values
            values = self._region(op, 1, values)
        raise LoopTooLong(op.name, op.loc)

    def _own_loop(self, proc: BlockEvaluator, op: Op, values: list) -> list:
        """One device's loop from `values` on, by itself."""
        ctx = proc.context(op)
        return checked_results(op, run_evaluator(op, lambda: while_(ctx, *values)))

    def _case(self, op: Op, operands: PerDevice) -> PerDevice:
        n = len(op.regions)
        known = [self.alg.known_index(o[0]) for o in operands]
        if all(i is not None and i == known[0] for i in known):
            i = known[0]
            return self._region(op, i if 0 <= i < n else n - 1, [[] for _ in self.procs])
        taken = [None if i is None else i if 0 <= i < n else n - 1 for i in known]
        self._every_branch_may_run(op, operands, "the branch index", taken)
        results = [self._region(op, k, [[] for _ in self.procs]) for k in range(n)]
        return [
            select_case(self.alg, o[0], [r[d] for r in results]) for d, o in enumerate(operands)
        ]

    def _if(self, op: Op, operands: PerDevice) -> PerDevice:
        known = [known_truth(self.alg, o[0]) for o in operands]
        if all(p is not None and p == known[0] for p in known):
            return self._region(op, 0 if known[0] else 1, [[] for _ in self.procs])
        taken = [None if p is None else 0 if p else 1 for p in known]
        self._every_branch_may_run(op, operands, "the predicate", taken)
        on_true = self._region(op, 0, [[] for _ in self.procs])
        on_false = self._region(op, 1, [[] for _ in self.procs])
        return [
            select_results(self.alg, o[0], on_true[d], on_false[d]) for d, o in enumerate(operands)
        ]

    def _every_branch_may_run(
        self, op: Op, operands: PerDevice, what: str, taken: list | None = None
    ) -> None:
        """A decision that depends on the inputs, or that devices take differently, runs
        every branch in lockstep and each device picks its results: the same as running the
        chosen branch when every device decides on the same term, or when no branch talks
        to other devices (each device then runs its own branch, as XLA does), or when the
        devices decide concretely (`taken`: each device's branch) and every group of every
        collective in a branch is taken whole or not at all (a pipeline's first stage
        all-reducing over its tensor axis): each group then meets in its branch, and the
        groups of devices elsewhere compute values no device picks."""
        first = np.asarray(operands[0][0]).reshape(())
        if all(np.asarray(o[0]).reshape(()).item() == first.item() for o in operands):
            return
        concrete = all(np.asarray(o[0]).dtype != object for o in operands)
        why = "differs across devices" if concrete else "depends on the inputs"
        if concrete and taken is not None and all(k is not None for k in taken):
            split = self._split_group(op, taken)
            if split is None:
                return
            raise _hangs(
                op, f"{what} {why} and a branch holds", split, op.operands[0].owner,
                self._device_name,
            )  # fmt: skip
        refuse_collective_branches(op.regions, f"{op.name}: {what}", op.loc, why)

    def _device_name(self, device: int) -> str:
        """'device 3 (x=3)', as the report names it."""
        return device_name(self.module, device, self.grid.num_partitions)

    def _split_group(self, op: Op, taken: list[int]) -> tuple[Op, set, set] | None:
        """A collective in a branch whose group some of its devices take and others do not
        (the collective, its group's devices, the ones that take it), or None when every
        group is taken whole or not at all."""
        if all(t == taken[0] for t in taken):
            return None  # every device takes the same branch: every group whole
        for k, region in enumerate(op.regions):
            takers = {d for d, t in enumerate(taken) if t == k}
            for inner in walk(region.block):
                if inner.name not in COLLECTIVES:
                    continue
                for group in self.grid.groups(inner.name, inner.attrs):
                    ids = {dev.device_id for dev in group}
                    if ids & takers and not ids <= takers:
                        return inner, ids, ids & takers
        return None

    def _call(self, op: Op, operands: PerDevice) -> PerDevice:
        """func.call (callee) and composite (its decomposition) run the function in lockstep."""
        name = op.attrs.get("callee") or op.attrs.get("decomposition")
        fn = self.module.functions.get(name)
        if fn is None:
            raise Unsupported(f"call to unknown function @{name}", op=op.name)
        return self._block(fn.body, operands, top=False)

    def _async_start(self, op: Op, operands: PerDevice) -> PerDevice:
        """The body (a collective or a slice) in lockstep; each device's future holds its
        results (ops/asynchronous.py)."""
        out = self._region(op, 0, operands)
        return [[r[0] if len(r) == 1 else tuple(r)] for r in out]

    # -- shard_map ---------------------------------------------------------------------------
    def _manual_computation(self, op: Op, operands: PerDevice, top: bool) -> PerDevice:
        """Global operands -> local pieces (in_shardings), body in lockstep, results ->
        global values (out_shardings) on every device."""
        if self.grid.num_replicas != 1:
            raise Unsupported("sdy.manual_computation with more than one replica", op=op.name)
        manual = tuple(op.attrs.get("manual_axes") or ())
        block = op.regions[0].block
        ins = self._manual_layouts(op, "in_shardings", [v.type for v in op.operands], manual)
        outs = self._manual_layouts(op, "out_shardings", [v.type for v in op.results], manual)
        pids = [proc.device.partition_id for proc in self.procs]
        local = []
        for pid, args in zip(pids, operands, strict=True):
            pieces = []
            for k, (lay, x, v) in enumerate(zip(ins, args, block.args, strict=True)):
                piece = x if lay is None else lay.shard(x, pid)
                want = tuple(v.type.shape) if isinstance(v.type, TensorType) else ()
                if lay is not None and tuple(piece.shape) != want:
                    raise Unsupported(
                        f"sdy.manual_computation: operand {k} piece on device {pid} has shape "
                        f"{list(piece.shape)}, the body takes {v.type} (uneven sharding?)",
                        op=op.name,
                    )
                pieces.append(piece)
            local.append(pieces)
        results = self._block(block, local, top=top)
        glob: PerDevice = [[] for _ in self.procs]
        for k, lay in enumerate(outs):
            values = [results[d][k] for d in range(len(self.procs))]
            if lay is None:  # a token: each device's own
                for d, val in enumerate(values):
                    glob[d].append(val)
                continue
            by_pid = [None] * lay.num_devices
            for pid, val in zip(pids, values, strict=True):
                by_pid[pid] = val
            for d, val in enumerate(self._assemble(op, k, lay, by_pid, pids)):
                glob[d].append(val)
        return glob

    def _manual_layouts(self, op: Op, key: str, types: list, manual: tuple) -> list:
        """One Layout per value over the manual axes only (None for non-tensors)."""
        shardings = op.attrs.get(key) or []
        if len(shardings) != len(types):
            raise BadInput(
                f"sdy.manual_computation: {len(shardings)} {key} for {len(types)} values"
            )
        meshes = self.module.attrs.get("sdy.meshes")
        out = []
        for s, t in zip(shardings, types, strict=True):
            if not isinstance(t, TensorType):
                out.append(None)
                continue
            if any(a.name in manual for a in s.unreduced):
                raise Unsupported(f"sdy.manual_computation: unreduced manual axes in {s}")
            only = SdySharding(
                s.mesh, tuple(tuple(a for a in axes if a.name in manual) for axes in s.dims)
            )
            lay = Layout.from_sdy(only, meshes, tuple(t.shape), self.grid.num_partitions)
            out.append(lay)
        return out

    def _gspmd_manual(self, op: Op, operands: PerDevice) -> PerDevice:
        """`@SPMDFullToShardShape`: each device's piece of the global operand, by the sharding
        of the `@Sharding` annotation that produces it; `@SPMDShardToFullShape`: the global
        value assembled from the devices' pieces by the op's own sharding.

        Partially manual shardings (`last_tile_dims={manual}`): each device holds its manual
        instance's whole value. Into such a region, an instance's value is the part of the
        operand its devices hold together; out of it, each device's piece is its tile of
        its instance's value (by the operand's own sharding), and a partially manual result
        is assembled per instance."""
        target = op.attrs.get("call_target_name")
        if self.grid.num_replicas != 1 or len(op.operands) != 1 or len(op.results) != 1:
            raise Unsupported(f"custom_call @{target} (several replicas or values)", op=op.name)
        full = op.operands[0] if target == "SPMDFullToShardShape" else op.results[0]
        annotated = op.operands[0].owner if target == "SPMDFullToShardShape" else op
        text = annotated.attrs.get("mhlo.sharding") if annotated is not None else None
        if not isinstance(text, str) or not isinstance(full.type, TensorType):
            raise Unsupported(f"custom_call @{target} without a tensor sharding", op=op.name)
        n = self.grid.num_partitions
        lay = Layout.from_hlo_sharding(text, tuple(full.type.shape), n)
        if isinstance(lay, list) or lay.unreduced or lay.maximal is not None:
            raise Unsupported(f"custom_call @{target} with sharding {text}", op=op.name)
        pids = [proc.device.partition_id for proc in self.procs]
        if target == "SPMDFullToShardShape":
            if lay.manual:
                raise Unsupported(f"custom_call @{target} of a manual value ({text})", op=op.name)
            inner = _partially_manual(op, op.attrs.get("mhlo.sharding"), op.results[0], n)
            if inner is not None:
                return [
                    [_instance_part(op, lay, inner, args[0], pid)]
                    for pid, args in zip(pids, operands, strict=True)
                ]
            return [[lay.shard(args[0], pid)] for pid, args in zip(pids, operands, strict=True)]
        source = op.operands[0].owner
        tiles = _partially_manual(
            op, source.attrs.get("mhlo.sharding") if source else None, op.operands[0], n
        )
        by_pid = [None] * lay.num_devices
        for pid, args in zip(pids, operands, strict=True):
            piece = args[0]
            if tiles is not None:  # the device's tile of its instance's value
                piece = np.asarray(piece)[_slices(tiles.box(pid))]
            by_pid[pid] = piece
        if lay.manual:  # a partially manual result: each device its instance's value
            return [[value] for value in _per_instance(op, lay, by_pid, pids)]
        return [[value] for value in self._assemble(op, 0, lay, by_pid, pids)]

    def _assemble(self, op: Op, k: int, lay: Layout, by_pid: list, pids: list[int]) -> list:
        """Each device's global value of a shard_map result from the devices' pieces (by
        partition id): its own copy of the box it computed, the first holder's copy of the
        others (XLA keeps each device's copy). Boxes whose copies are not identical are
        recorded in `self.replicas`."""
        base = lay.assemble(by_pid)
        holders: dict[tuple, list[int]] = {}
        for pid in range(lay.num_devices):
            holders.setdefault(lay.box(pid), []).append(pid)
        views = {}
        for box, devs in holders.items():
            if len(devs) < 2:
                continue
            pieces = [_local(lay, by_pid[p], p) for p in devs]
            differ = [not _identical(pieces[0], x) for x in pieces[1:]]
            if not any(differ):
                continue
            self.replicas.append(Replicas(op, k, box, tuple(devs), pieces))
            for p, x, d in zip(devs[1:], pieces[1:], differ, strict=True):
                if d:
                    own = np.array(base, copy=True)
                    own[_slices(box)] = x
                    views[p] = own
        return [views.get(pid, base) for pid in pids]


# ops whose regions run on all devices together (functions, not bound methods: an
# interpreter referring to itself would live on, with its devices' values, until the
# garbage collector finds the cycle)
_LOCKSTEP = {
    "stablehlo.while": SpmdInterpreter._while,
    "stablehlo.case": SpmdInterpreter._case,
    "stablehlo.if": SpmdInterpreter._if,
    "func.call": SpmdInterpreter._call,
    "stablehlo.composite": SpmdInterpreter._call,
    "stablehlo.async_start": SpmdInterpreter._async_start,
}


def _partially_manual(op: Op, text, value, n: int) -> Layout | None:
    """The layout of a partially manual `value` (instances of several devices, each value
    cut over its instance's devices), None when it is not one."""
    if not isinstance(text, str) or "manual" not in text or not isinstance(value.type, TensorType):
        return None
    lay = Layout.from_hlo_sharding(text, tuple(value.type.shape), n)
    if isinstance(lay, list) or lay.unreduced or lay.maximal is not None:
        raise Unsupported(f"custom_call with sharding {text}", op=op.name, loc=op.loc)
    if not lay.manual or all(len(g) == 1 for g in lay.manual):
        return None
    return lay


def _instance_part(op: Op, outer: Layout, inner: Layout, x, pid: int):
    """The part of global `x` that the devices of `pid`'s instance hold together (by the
    operand's layout `outer`): the instance's value, of the shape the region takes."""
    group = next(g for g in inner.manual if pid in g)
    boxes = [outer.box(d) for d in group]
    box = tuple(
        (min(b[i][0] for b in boxes), max(b[i][1] for b in boxes)) for i in range(len(boxes[0]))
    )
    shape = tuple(b - a for a, b in box)
    covered = np.zeros(shape, dtype=bool)
    for bx in boxes:
        covered[tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(bx, box, strict=True))] = True
    if shape != tuple(inner.global_shape) or not covered.all():
        raise Unsupported(
            f"custom_call @{op.attrs.get('call_target_name')}: instance {list(group)} holds "
            f"{[list(b) for b in boxes]} of the operand, not one value of shape "
            f"{list(inner.global_shape)}",
            op=op.name,
            loc=op.loc,
        )
    return np.asarray(x)[_slices(box)]


def _per_instance(op: Op, lay: Layout, by_pid: list, pids: list[int]) -> list:
    """Each device's value of a partially manual result: its instance's value, assembled
    from the instance's pieces; copies of a box within an instance must be the same value."""
    if not lay.replicas_agree(by_pid, _identical):
        raise Unsupported(
            f"custom_call @{op.attrs.get('call_target_name')}: copies within a manual instance "
            "are not the same value",
            op=op.name,
            loc=op.loc,
        )
    values = lay.assemble_instances(by_pid)
    index = {d: k for k, group in enumerate(lay.instances()) for d in group}
    return [values[index[pid]] for pid in pids]


def _local(lay: Layout, value, pid: int):
    """A device's piece without the padding of uneven shards."""
    shape = lay.local_shape(pid)
    return np.asarray(value)[(*(slice(0, n) for n in shape), Ellipsis)]


def _slices(box) -> tuple:
    return (*(slice(a, b) for a, b in box), Ellipsis)


def _identical(a, b) -> bool:
    """The same value: the same numbers, or the same (hash-consed) terms."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype == object or b.dtype == object:
        return all(x is y or _equal_scalar(x, y) for x, y in zip(a.flat, b.flat, strict=True))
    if a.dtype.kind in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))


def _equal_scalar(x, y) -> bool:
    try:
        return type(x) is type(y) and bool(x == y)
    except Exception:
        return False


def _write(envs: list, op: Op, results: PerDevice) -> None:
    """Each device's results of `op` into its environment."""
    for env, rs in zip(envs, results, strict=True):
        for v, r in zip(op.results, rs, strict=True):
            env[v.id] = r


def _hangs(op: Op, what: str, split: tuple, decided_by: Op | None, name) -> ProgramHangs:
    """The devices of `split`'s collective group that reach it wait for the others, which
    `op`'s decision (made by `decided_by`) sent elsewhere."""
    collective, ids, waiting = split
    return ProgramHangs(
        f"{op.name}: {what} {collective.name} at {collective.loc} "
        f"{devices_clause(ids, waiting, name)}: those devices would wait for the others (the "
        "program hangs)",
        op=op.name,
        loc=op.loc,
        sites=[(o.name, o.loc) for o in (op, collective, decided_by) if o is not None],
        waiting=sorted(waiting),
        group=sorted(ids),
    )


def device_name(module: Module, device: int, n: int) -> str:
    """'device 3 (x=3)': a device and its coordinates when the module names a mesh of n."""

    coords = mesh_coords(module, device, n) or {}
    at = f" ({', '.join(f'{a}={i}' for a, i in coords.items())})" if coords else ""
    return f"device {device}{at}"


def mesh_size(module: Module, op: Op) -> int:
    """The number of devices of the mesh a `sdy.manual_computation` is sharded over."""
    shardings = list(op.attrs.get("in_shardings") or []) + list(op.attrs.get("out_shardings") or [])
    meshes = module.attrs.get("sdy.meshes") or {}
    for s in shardings:
        mesh = s.mesh if not isinstance(s.mesh, str) else meshes.get(s.mesh)
        if mesh is not None:
            return max(1, math.prod(size for _, size in mesh.axes))
    raise BadInput(f"{op.name} at {op.loc}: no mesh for its shardings")
