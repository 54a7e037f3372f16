"""Simulation-guided cut-points: prove an implementation equal to a spec stage by stage.

1. Simulate both programs on random inputs (float64); if an output differs, that input is
   the counterexample (replayed and localised by tv_ir.prover.localise).
2. Evaluate the spec symbolically once, cutting at every float value: value s gets fresh
   symbols S_s and a one-op definition D_s over its operands' symbols.
3. Evaluate the implementation symbolically in program order. For each float value v, the
   spec values that matched it in simulation are candidates; v is proved equal to a
   candidate s by comparing v's terms with s's definition, where spec symbols not yet proved
   are expanded. A proved v is replaced by S_s: later stages start from fresh symbols, so
   cost grows with the size of a stage, not with the depth of the program.
4. Outputs must be proved. Cutting loses facts such as "m is the mean of x", so when normal
   forms differ, simulation picks which cut-point to expand: perturbing the symbols of the
   values in a violated relation makes the residue non-zero; the latest such value is
   replaced by its definition, and so on. What remains goes to Z3.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from tv_ir.ir.program import Module, TensorType
from tv_ir.report.result import EQUIVALENT, NOT_EQUIVALENT, UNKNOWN, OutputResult, Report, Stats
from tv_ir.semantics import terms as T
from tv_ir.semantics.algebra import NumpyAlgebra
from tv_ir.semantics.interpreters.interp import Interpreter
from tv_ir.semantics.interpreters.spmd import SpmdInterpreter, device_name
from tv_ir.semantics.ops.control import TRIP_LIMIT, LoopTooLong
from tv_ir.semantics.symbolic import TABLE_VALUES, SymbolicAlgebra

from ..errors import ProgramHangs, TvError, Unsupported
from ..limits import OutOfMemoryBudget, OutOfTime, check_memory, past_deadline
from . import smt, workers
from .correspond import MOVEMENT_OPS, TileIndex, box_index
from .localise import outputs_agree, refutation
from .mirrored_ops import mirrored_cut, terms_key
from .mirrored_ops import same_term as _same
from .mirrored_ops import same_terms as _same_terms
from .obligation_cache import ObligationCache, renaming_classes
from .placement import Placement
from .repeated_stages import RepeatedStages
from .simulate import (
    close,
    compared_constants,
    guard_inputs,
    overflowed,
    random_inputs,
    run_traced,
    run_traced_devices,
    with_dominant_diagonals,
    with_equal_ids,
    with_non_negative_roots,
)
from .spec_graph import SpecGraph

SIM_RUNS = 2
# iterations a loop may run in the simulations on extreme integers and on guard sets (zeros)
EXTREME_TRIPS = 10_000
# relative difference above which a simulated output difference refutes at once; smaller
# differences (above float64 noise, see simulate.RTOL) refute only if the proof fails
CLEAR_DIFFERENCE = 1e-6
# how long past the time limit that replay may run (the watchdog steps in at 2 s)
SUSPICIOUS_REPLAY_S = 1.0
STAGE_LEVELS = 12  # expansion levels tried for an intermediate cut-point
STAGE_SMT_SECONDS = 0.5
OUTPUT_LEVELS = 256
STAGE_SMT_SIZE = 4000  # largest stage residue worth a solver call
EXPANSION_BUDGET = 2_000_000  # term nodes, per output obligation
STAGE_BUDGET = 20_000  # term nodes, per intermediate cut-point obligation
MONOMIAL_LIMIT = 400_000  # monomials in one expanded term (memory guard), outputs
STAGE_MONOMIAL_LIMIT = 20_000  # the same, intermediate cut-points
# largest definedness condition (nodes) simplified under its own facts when a cut symbol
# takes it over: a training step's conditions accumulate every upstream guard (a global
# gradient norm's covers every gradient element), and simplifying them for every element
# of every value grew with the program (MaxText's clipped AdamW step: minutes per value)
SETTLE_LIMIT = 500
DEEPER_LIMIT = 64  # monomials: a sign looked for one op below a cut symbol
# most renaming classes of a stage's residues decided one representative at a time
# (`_by_representatives`): each is a solver call, so a stage of many distinct elements is
# decided whole instead
REPRESENTATIVES = 32


@dataclass
class Options:
    timeout: float = 10.0  # seconds per solver query
    seed: int = 0
    progress: Callable[[str], None] | None = None
    time_limit: float | None = None  # seconds for the whole proof (None: no limit)
    # reuse a stage proof for stage obligations that are renamings of it (repeated layers),
    # and the match of a stage for stages of the same form (`repeated_stages`)
    reuse_proofs: bool = True


class _OutOfTime(OutOfTime):
    """The proof's time limit ran out (the verdict becomes unknown). A TvError, so that the
    interpreters pass it through from a hook inside a shard_map body."""


@dataclass
class _Final:
    """A final obligation: `pairs()` must be proved equal element by element; `what` names
    it in a reason; `output` is the output it proves (None for a replica's copy) and
    `proving` the (impl op, spec value) a stop midway names."""

    what: str
    pairs: Callable[[], list]
    output: int | None = None
    proving: tuple | None = None


_COUNTERS = ("stages", "proved_by_normal_form", "proved_by_z3", "expansions", "cache_hits")


def _counters(stats: Stats, since: dict | None = None) -> dict:
    """The proof counters of `stats` (minus those of `since`)."""
    now = {k: getattr(stats, k) for k in _COUNTERS}
    return now if since is None else {k: v - since[k] for k, v in now.items()}


def _add_counters(stats: Stats, delta: dict) -> None:
    for k, v in delta.items():
        setattr(stats, k, getattr(stats, k) + v)


class _Outcome:
    def __init__(self, status: str, method: str = "", model=None, reason: str = ""):
        self.status = status  # proved | sat | unknown
        self.method = method
        self.model = model
        self.reason = reason


class StageProver:
    def __init__(
        self,
        spec: Module,
        impl: Module,
        options: Options | None = None,
        placement: Placement | None = None,
    ):
        self.spec = spec
        self.impl = impl
        self.opt = options or Options()
        self.place = placement or Placement.single_device(spec.main)
        self.stats = Stats()
        self.defs: dict[int, np.ndarray] = {}  # spec value id -> definition (terms)
        self.syms: dict[int, np.ndarray] = {}  # spec value id -> its symbols
        self.owner: dict[int, tuple[int, tuple]] = {}  # symbol atom id -> (value id, index)
        self.proved: set[int] = set()
        # spec value id -> the earlier value with the same definition (see _spec_pass)
        self.twins: dict[int, int] = {}
        # spec value id -> its elements, for transposes and reshapes of cut values (`_spec_pass`)
        self.views: dict[int, np.ndarray] = {}
        self.exprs: dict[int, np.ndarray] = {}  # memo of expr()
        # memo of spec_view() of views: vid -> (how many values were proved then, the view);
        # a view depends only on which of its values are proved, and `proved` only grows
        self._views_seen: dict[int, tuple[int, np.ndarray]] = {}
        self.spec_env: dict[int, object] = {}
        self.spec_order: dict[int, int] = {}
        self.input_atoms: dict[int, tuple[int, tuple]] = {}
        self.sim_env: dict[int, float] = {}
        self.spec_trace = None
        self.sim_inputs: list = []
        self.deadline: float | None = None
        self.obligation: tuple | None = None  # (impl op, spec value id): see _now_proving
        self.spec_op = None  # the spec op being evaluated symbolically (before any obligation)
        self.cache = ObligationCache() if self.opt.reuse_proofs else None
        self.spec_graph = SpecGraph(spec)
        self.repeats = RepeatedStages(self.spec_graph) if self.opt.reuse_proofs else None
        # implementation value id -> per device, the (spec value, box) it was proved equal to
        self.cut_of: dict[int, tuple] = {}
        self._loose: dict[int, TileIndex] = {}  # `_loose_index`, by rank

    # -- driver ------------------------------------------------------------------------
    def run(self) -> Report:
        t0 = time.perf_counter()
        rng = np.random.default_rng(self.opt.seed)
        inputs = [random_inputs(self.spec.main, rng) for _ in range(SIM_RUNS)]
        inputs[-1] = with_equal_ids(self.spec.main, inputs[-1])  # one run with equal ids
        inputs[-1] = with_non_negative_roots(self.spec.main, inputs[-1])  # and in domain
        inputs[0] = with_dominant_diagonals(self.spec.main, inputs[0], self.spec, self.impl)
        try:
            spec_tr = [run_traced(self.spec, x) for x in inputs]
            impl_tr = []
            for x in inputs:
                try:
                    impl_tr.append(self._run_impl(x))
                except ProgramHangs:  # the spec returned on x: replayed and reported
                    return self._refuted(x, "simulation")
            if any(isinstance(t, TensorType) and t.is_integer for t in self.spec.main.arg_types):
                extreme = random_inputs(self.spec.main, rng, extremes=True)  # where ints wrap
                traces = self._extreme_run(extreme)
                if traces is not None:
                    inputs.append(extreme)
                    spec_tr.append(traces[0])
                    impl_tr.append(traces[1])
        except Unsupported as e:
            return self._unsupported(e)
        if len(inputs) > SIM_RUNS and any(
            overflowed(m, tr[-1]) for m, tr in ((self.spec, spec_tr), (self.impl, impl_tr))
        ):  # the extreme integers overflowed floats: no evidence over the reals
            inputs, spec_tr, impl_tr = inputs[:SIM_RUNS], spec_tr[:SIM_RUNS], impl_tr[:SIM_RUNS]
        self.stats.seconds["simulate"] = time.perf_counter() - t0
        suspicious = None  # an input whose outputs differ slightly: maybe float64 noise
        for x, s, i in zip(inputs, spec_tr, impl_tr, strict=True):
            pairs = self._output_copy_pairs(s, i)
            if not all(close(a, b, CLEAR_DIFFERENCE) for a, b in pairs):
                return self._refuted(x, "simulation")
            if suspicious is None and not all(close(a, b) for a, b in pairs):
                suspicious = x
        refuted = self._guard_runs(rng)
        if refuted is not None:
            return refuted
        self.stats.seconds["simulate"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        if self.opt.time_limit is not None:
            self.deadline = t0 + self.opt.time_limit
        try:
            report = self._prove(spec_tr, impl_tr, inputs[0])
        except Unsupported as e:
            report = self._unsupported(e)
        except MemoryError:
            report = self._stopped("out of memory while expanding terms")
        except OutOfMemoryBudget as e:
            report = self._stopped(str(e))
        except _OutOfTime:
            report = self._stopped(f"time limit of {self.opt.time_limit:g} s reached")
        except OutOfTime as e:  # the run's deadline, seen by the interpreter
            report = self._stopped(str(e))
        finally:
            T.forget_later()  # facts of this run's cut symbols, never asked for
        self.stats.seconds["prove"] = time.perf_counter() - t1
        if report.verdict != EQUIVALENT and suspicious is not None:
            # not proved, and the programs differ on this input beyond float64 noise: replayed
            # even when the time limit stopped the proof (one concrete run)
            try:
                with past_deadline(SUSPICIOUS_REPLAY_S):
                    refuted = self._refuted(suspicious, "simulation")
            except (OutOfTime, _OutOfTime):
                refuted = None
            if refuted is not None and refuted.verdict == NOT_EQUIVALENT:
                return refuted
        return report

    def _output_copy_pairs(self, spec_trace, impl_trace) -> list:
        """Every device's copy of every output, beside its block of the spec output."""
        n = self.place.num_devices
        copies = self.place.output_copies(_by_device(impl_trace.outputs, n))
        return [
            (_block(a, box), b)
            for a, held in zip(spec_trace.outputs, copies, strict=True)
            for _, box, b in held
        ]

    def _guard_runs(self, rng) -> Report | None:
        """Run both programs on guard-set inputs (zeros, compared constants); a difference
        there refutes at once. These runs choose no cut-points: their values are often
        degenerate (all equal), which would match anything."""
        constants = compared_constants(self.spec, self.impl)
        for x in guard_inputs(self.spec.main, constants, rng):
            token = TRIP_LIMIT.set(EXTREME_TRIPS)
            try:
                # outputs alone first: every value is needed only when they differ
                if outputs_agree(self.spec, self.impl, self.place, x):
                    continue
                s = run_traced(self.spec, x)
                i = self._run_impl(x)
            except LoopTooLong:
                continue  # zeros double forever: no evidence from this input
            except ProgramHangs:
                return self._refuted(x, "simulation on a guard set")
            except Unsupported:
                return None
            finally:
                TRIP_LIMIT.reset(token)
            if overflowed(self.spec, s) or overflowed(self.impl, i):
                continue  # a huge compared constant (a mask) overflowed floats: no evidence
            if not all(close(a, b) for a, b in self._output_copy_pairs(s, i)):
                refuted = self._refuted(x, "simulation on a guard set")
                if refuted.verdict == NOT_EQUIVALENT:
                    return refuted
        return None

    def _extreme_run(self, x: list) -> tuple | None:
        """Both programs' traces on extreme integers, or None when a loop there runs longer
        than EXTREME_TRIPS (a counter from -2^31 up to a bound): no evidence then."""
        token = TRIP_LIMIT.set(EXTREME_TRIPS)
        try:
            return run_traced(self.spec, x), self._run_impl(x)
        except LoopTooLong:
            return None
        finally:
            TRIP_LIMIT.reset(token)

    def _run_impl(self, inputs: list):
        p = self.place
        return run_traced_devices(
            self.impl, p.shard_inputs(inputs), p.num_replicas, p.num_partitions
        )

    def _report(self, verdict: str, **kw) -> Report:
        return Report(verdict, stats=self.stats, **kw)

    def _unsupported(self, e: Unsupported) -> Report:
        where = f" at {e.loc}" if e.loc is not None and str(e.loc) != "<unknown location>" else ""
        return self._report(UNKNOWN, unsupported=[e.op] if e.op else [], reason=f"{e}{where}")

    def _refuted(self, inputs: list, how: str) -> Report:
        r = refutation(self.spec, self.impl, self.place, inputs)
        if r is None:
            return self._report(UNKNOWN, reason=f"a {how} difference did not replay")
        ce, loc, outputs = r
        return self._report(NOT_EQUIVALENT, counterexample=ce, location=loc, outputs=outputs)

    # -- symbolic passes -----------------------------------------------------------------
    def _input_symbols(self) -> list:
        out = []
        names = self.spec.main.arg_names
        for i, t in enumerate(self.spec.main.arg_types):
            name = names[i] if i < len(names) and names[i] else f"arg{i}"
            if not isinstance(t, TensorType):
                out.append(None)
                continue
            # identity: the argument number (never its name); integer ranges: its type
            arr = T.symbol_array(T.Key("input", i, t.dtype, name), t.shape)
            for idx in np.ndindex(*t.shape):
                p = arr[idx]
                self.input_atoms[T.as_atom(p).id] = (i, idx)
                if t.is_bool:
                    arr[idx] = T.lift_bool(T.compare("NE", p, T.ZERO))
            out.append(arr)
        return out

    def _spec_pass(self, inputs: list) -> list:
        """Evaluate the spec symbolically, cutting every float value (a fresh symbol per
        element, its one-op definition in `defs`). Hash-consed: a value whose definition is
        an earlier value's (the same terms over the same symbols: a rematerialised copy of a
        forward value, recomputed in the backward pass) or is an earlier value's symbols
        (an identity such as a sharding constraint) is that value (`twins`), not a new
        cut-point: otherwise proving it would expand its unproved recomputation."""
        counter = [0]
        by_definition: dict[tuple, int] = {}

        def hook(op, results):
            self._check_time()
            out = []
            for v, r in zip(op.results, results, strict=True):
                self.spec_order[v.id] = len(self.spec_order)
                key = _definition_key(v, r) if _cuttable(op, v, [r]) else None
                first = None if key is None else by_definition.get(key)
                if first is not None:
                    self.twins[v.id] = first
                    out.append(self.syms[first])
                elif key is not None:
                    counter[0] += 1
                    name = T.Key("cut", v.id, v.type.dtype, f"%{op.short_name}{counter[0]}")
                    sym, ids = T.symbol_array_ids(name, v.type.shape)
                    for idx, aid in ids:
                        self.owner[aid] = (v.id, idx)
                    _carry_definedness(sym, r, self._one_level_deeper)
                    self.defs[v.id] = r
                    self.syms[v.id] = sym
                    by_definition[key] = v.id
                    by_definition[_definition_key(v, sym)] = v.id
                    out.append(sym)
                else:
                    out.append(r)
                    if op.name in RELABELLING_OPS and v.type.is_float and _is_sym(r):
                        self.views[v.id] = r
                self.spec_env[v.id] = out[-1]
            return out

        interp = Interpreter(self.spec, SymbolicAlgebra(), hook=hook)
        evaluate = interp.evaluate_op

        def tracked(op):  # a stop (time, memory) before any obligation names this op
            self.spec_op = op
            return evaluate(op)

        interp.evaluate_op = tracked
        for v, a in zip(self.spec.main.args, inputs, strict=True):
            self.spec_env[v.id] = a
        interp.run(self.spec.main, inputs)
        self.spec_op = None
        return [v.id for v in self.spec.main.body.results]

    def _one_level_deeper(self, d):
        """`d` with its cut symbols replaced by their one-op definitions (equal to `d`
        wherever `d` is defined, as each symbol equals its definition where defined), or
        `d` when that grows past DEEPER_LIMIT monomials."""
        mapping = {}
        for a in d.syms:
            o = self.owner.get(a)
            if o is not None:
                mapping[a] = T.lift(np.asarray(self.defs[o[0]])[o[1]])
        if not mapping:
            return d
        try:
            return T.substitute(d, mapping, {}, DEEPER_LIMIT)
        except T.TermTooLarge:
            return d

    def expr(self, vid: int) -> np.ndarray:
        """Spec value `vid` in terms of proved cut symbols and inputs."""
        if vid in self.exprs:
            return self.exprs[vid]
        # compute dependencies first, iteratively (programs can be deep)
        stack, order, seen = [vid], [], set()
        while stack:
            v = stack.pop()
            if v in seen or v in self.exprs:
                continue
            seen.add(v)
            order.append(v)
            for dep in self._unproved_deps(self.defs[v]):
                if dep not in self.exprs and dep not in seen:
                    stack.append(dep)
        for v in sorted(order, key=lambda x: self.spec_order.get(x, 0)):
            self.exprs[v] = self._expand(self.defs[v], self._unproved_mapping)
        return self.exprs[vid]

    def _unproved_deps(self, arr) -> set[int]:
        deps = set()
        for e in np.asarray(arr).reshape(-1):
            if isinstance(e, (T.Poly, T.Bool)):
                for a in e.syms:
                    o = self.owner.get(a)
                    if o is not None and o[0] not in self.proved:
                        deps.add(o[0])
        return deps

    def _unproved_mapping(self, atom_id: int):
        o = self.owner.get(atom_id)
        if o is None or o[0] in self.proved:
            return None
        return self.expr(o[0])[o[1]]

    def _expand(self, arr, lookup) -> np.ndarray:
        """Substitute symbols for which `lookup` gives a term, element by element."""
        arr = np.asarray(arr)
        if arr.dtype != object:
            return arr
        out = np.empty(arr.shape, dtype=object)
        memo: dict = {}
        for idx in np.ndindex(*arr.shape):
            self._check_time()  # expansions can be long: the limits hold here too
            out[idx] = self._expand_term(arr[idx], lookup, memo)
        return out

    def _expand_term(self, e, lookup, memo, limit: int | None = None):
        if not isinstance(e, (T.Poly, T.Bool)):
            return e
        mapping = {}
        for a in e.syms:
            t = lookup(a)
            if t is not None:
                mapping[a] = t
        return T.substitute(e, mapping, memo, limit) if mapping else e

    def spec_view(self, vid: int):
        """What users of spec value `vid` see: its symbols once proved, else its expansion."""
        if vid in self.defs:
            return self.syms[vid] if vid in self.proved else self.expr(vid)
        seen = self._views_seen.get(vid)
        if seen is None or seen[0] != len(self.proved):
            seen = (len(self.proved), self._expand(self.spec_env[vid], self._unproved_mapping))
            self._views_seen[vid] = seen
        return seen[1]

    # -- the proof -----------------------------------------------------------------------
    def _prove(self, spec_tr, impl_tr, sim_inputs) -> Report:
        self.spec_trace = spec_tr[0]
        self.sim_inputs = sim_inputs
        inputs = self._input_symbols()
        spec_outs = self._spec_pass(inputs)
        args = self.spec.main.args
        for i, (v, arr) in enumerate(zip(args, inputs, strict=True)):
            self.spec_order.setdefault(v.id, i - len(args))
            if arr is not None and v.type.is_float:  # inputs are cut-points from the start
                self.defs[v.id] = self.syms[v.id] = self.exprs[v.id] = arr
                self.proved.add(v.id)
        shapes = {vid: np.shape(d) for vid, d in self.defs.items()}
        shapes.update((vid, np.shape(e)) for vid, e in self.views.items())
        index = TileIndex(spec_tr, shapes, self.spec_order)
        total = sum(1 for op in self.impl.main.body.ops for _ in op.results)
        n = self.place.num_devices
        done = [0]

        def hook(op, results):
            for k, v in enumerate(op.results):
                done[0] += 1
                per_device = [results[d][k] for d in range(n)]
                if _cuttable(op, v, per_device):
                    per_device = self._try_cut(v, per_device, index, impl_tr)
                    for d in range(n):
                        results[d][k] = per_device[d]
            if self.opt.progress and done[0] % 50 == 0:
                self.opt.progress(f"stages: {self.stats.stages} proved, {done[0]}/{total} values")
            return results

        def mirrored(op, operands_of):
            cut = mirrored_cut(
                self.spec_graph, op, operands_of, self.cut_of, self.spec_env, self._block_of
            )
            if cut is None:
                return None
            cut = tuple((self.twins.get(vid, vid), box) for vid, box in cut)
            if any(vid not in self.defs for vid, _ in cut):
                return None
            done[0] += 1
            self.stats.stages += _stages_counted([vid for vid, _ in cut])
            self.stats.proved_by_normal_form += 1
            self.stats.mirrored_stages += 1
            self.cut_of[op.results[0].id] = cut
            return [[np.asarray(self._cut_symbols(vid))[box_index(box)]] for vid, box in cut]

        interp = SpmdInterpreter(
            self.impl,
            SymbolicAlgebra(),
            self.place.num_replicas,
            self.place.num_partitions,
            hook,
            mirrored,
        )
        impl_outs = interp.run(self.place.shard_inputs(inputs))

        finals = self._final_obligations(spec_outs, impl_outs, interp)
        outputs, failures = [], []
        for f, outcome in zip(finals, self._decide_finals(finals), strict=True):
            if f.output is not None:
                verdict = EQUIVALENT if outcome.status == "proved" else UNKNOWN
                outputs.append(OutputResult(f.output, verdict))
            if outcome.status != "proved":
                failures.append((f.what, outcome))
        if not failures:
            return self._report(EQUIVALENT, outputs=outputs)
        for _, outcome in failures:
            if outcome.status == "sat" and outcome.model is not None:
                replay = self._model_inputs(outcome.model, spec_tr, impl_tr)
                r = None if replay is None else refutation(self.spec, self.impl, self.place, replay)
                if r is not None:
                    ce, loc, outs = r
                    return self._report(
                        NOT_EQUIVALENT, counterexample=ce, location=loc, outputs=outs
                    )
                diverged = None if replay is None else self._divergent_replica(replay)
                if diverged is not None:
                    return self._report(UNKNOWN, outputs=outputs, reason=diverged)
        what, outcome = failures[0]
        reason = outcome.reason or "normal forms differ and the solver could not decide"
        return self._report(UNKNOWN, outputs=outputs, reason=f"{what}: {reason}")

    def _final_obligations(self, spec_outs: list, impl_outs: list, interp) -> list[_Final]:
        """What must be proved once every value is reached, in the order it is decided:
        each output's pieces equal the spec output, then every device's copy of a
        replicated box of a shard_map result (`SpmdInterpreter.replicas`) equal to the
        first holder's (which devices that do not compute the box read). Independent of
        one another: they read the cut-points, never each other's proofs."""
        n = self.place.num_devices
        out = []
        for i, svid in enumerate(spec_outs):
            per_device = [impl_outs[d][i] for d in range(n)]
            owner = self.impl.main.body.results[i].owner

            def pairs(i=i, svid=svid, per_device=per_device):
                return self._output_pairs(self.place.results[i], per_device, self.spec_view(svid))

            out.append(_Final(f"output {i}", pairs, i, (owner, svid)))
        for rep in interp.replicas:
            first = device_name(self.impl, rep.devices[0], n)
            for d, copy in zip(rep.devices[1:], rep.values[1:], strict=True):
                what = (
                    f"{rep.where()} is claimed replicated, but the copy on "
                    f"{device_name(self.impl, d, n)} is not proved equal to the one on {first}"
                )
                out.append(_Final(what, partial(_element_pairs, copy, rep.values[0])))
        return out

    def _decide_final(self, f: _Final) -> _Outcome:
        if f.proving is not None:
            self._now_proving(*f.proving, output=f.output)
        return self._prove_pairs(f.pairs(), OUTPUT_LEVELS, final=True)

    def _decide_finals(self, finals: list[_Final]) -> list[_Outcome]:
        """Every final obligation decided, in order, as one worker decides them. With
        several workers (tv_ir.prover.workers.decided: the user's count from the first,
        automatically once those decided here have taken a second) the rest are decided
        by forked children. Each obligation's counters come back with its outcome and are
        added here in order, and one that stopped the proof (time, memory) stops it here
        at its place in the order, so the report is the one a single worker writes."""

        def job(k: int):
            before = _counters(self.stats)
            try:
                result = self._decide_final(finals[k])
            except Exception as e:  # raised below, at this obligation's place
                result = workers.Failed(e)
            delta = _counters(self.stats, before)
            _add_counters(self.stats, {c: -v for c, v in delta.items()})  # added below
            return result, delta

        timing: dict = {}
        out = []
        with contextlib.closing(workers.decided(job, list(range(len(finals))), timing)) as done:
            for f, got in zip(finals, done, strict=True):
                if isinstance(got, workers.Failed):  # the job itself failed (it never does)
                    raise got.error
                result, delta = got
                if f.proving is not None:  # what a stop names, as if proved here
                    self._now_proving(*f.proving, output=f.output)
                _add_counters(self.stats, delta)
                if isinstance(result, workers.Failed):
                    raise result.error
                out.append(result)
        if "pool" in timing:
            self.stats.seconds["final obligations in workers"] = timing["pool"]
        return out

    def _divergent_replica(self, inputs: list) -> str | None:
        """On these inputs, a replicated box whose copies differ although every device's
        outputs are the spec's (what the program computes then depends on which copy XLA
        reads): the reason the verdict is unknown."""
        p = self.place
        interp = SpmdInterpreter(self.impl, NumpyAlgebra(), p.num_replicas, p.num_partitions)
        interp.run(p.shard_inputs(inputs))
        for rep in interp.replicas:
            for d, copy in zip(rep.devices[1:], rep.values[1:], strict=True):
                if not close(copy, rep.values[0]):
                    n = p.num_devices
                    return (
                        f"{rep.where()} is claimed replicated, but on a replayed input its copy "
                        f"on {device_name(self.impl, d, n)} differs from the one on "
                        f"{device_name(self.impl, rep.devices[0], n)} (every device's outputs "
                        "equal the spec's, but which copy a device reads is XLA's choice)"
                    )
        return None

    def _try_cut(self, v, per_device: list, index: TileIndex, impl_tr) -> list:
        """Prove v equal (on every device) to a block of a spec value; then use its symbols."""
        runs = [[tr.values[v.id][d] for tr in impl_tr] for d in range(len(per_device))]
        index.forget()  # look-ups of the last value's arrays: `runs` is this value's
        if _input_independent(runs):
            # the same in every run: a constant (a mask, an idle stage's zeros) whose
            # symbolic value is a constant too; tiles of any spec constant would "match"
            return per_device
        form = None
        if self.repeats is not None:
            form = self.repeats.form(v.owner, v.index, self.cut_of)
        if form is not None:
            predicted = self.repeats.predict(*form)
            if predicted is not None:
                out = self._cut_as_predicted(v, per_device, predicted, runs, index)
                if out is not None:
                    return out
        out, found = self._search_cut(v, per_device, runs, index, form)
        if found or 1 not in v.type.shape:
            return out
        # a value with unit dimensions its spec value lacks (a vmapped stage's [1, ...] slice
        # of a state stacked over stages, one stage per device): its elements, in order, are
        # a tile of a spec value of lower rank up to those dimensions, and its cut is that
        # tile reshaped
        loose = self._loose_index(index, len(v.type.shape))
        loose.forget()
        return self._search_cut(v, per_device, runs, loose, form, record=False)[0]

    def _search_cut(
        self, v, per_device: list, runs: list, index: TileIndex, form, record: bool = True
    ) -> tuple[list, bool]:
        """(v's values, cut where proved equal to tiles `index` finds; whether any was).
        `record`: name the tiles in `cut_of` (tiles of v's own shape only: mirrored ops and
        repeated stages read their boxes as v's shape)."""
        for c in index.candidates(runs):
            view = self.spec_view(c.spec_value)
            c = _likeliest_boxes(c, per_device, [view, self._definition_of(c.spec_value)])
            pairs = []
            for d, a in enumerate(per_device):
                pairs += _element_pairs(a, _shaped(c.block(view, d), a))
            self._now_proving(v.owner, c.spec_value)
            outcome = self._prove_pairs(pairs, STAGE_LEVELS, final=False)
            if outcome.status == "proved":
                self.stats.stages += 1
                syms = self._cut_symbols(c.spec_value)
                if record:
                    self._cut_found(v, form, tuple((c.spec_value, b) for b in c.boxes))
                return [_shaped(c.block(syms, d), a) for d, a in enumerate(per_device)], True
        if len(per_device) > 1:
            cuts: list = [None] * len(per_device)
            out = self._cut_per_device(per_device, runs, index, cuts)
            found = any(c is not None for c in cuts)
            if found and record:
                self._cut_found(v, form, tuple(cuts))
            return out, found
        return per_device, False

    def _loose_index(self, index: TileIndex, rank: int) -> TileIndex:
        """`index`'s spec values of lower rank than `rank` (those `index` never compares
        with a value of that rank) tiled up to unit dimensions, built once per rank."""
        found = self._loose.get(rank)
        if found is None or found.traces is not index.traces:
            shapes = {vid: s for vid, s in index.shapes.items() if len(s) < rank}
            found = TileIndex(index.traces, shapes, index.order, loose_rank=True)
            self._loose[rank] = found
        return found

    def _block_of(self, arr) -> tuple | None:
        """(spec value, box) when `arr` is exactly that box of the value's symbols (a shard
        of an input, a slice of a cut value), else None."""
        arr = np.asarray(arr)
        if arr.dtype != object or arr.size == 0:
            return None
        ends = []
        for e in (arr.flat[0], arr.flat[-1]):
            a = T.as_atom(e) if isinstance(e, T.Poly) else None
            if a is None:
                return None
            o = self.owner.get(a.id)
            if o is None and a.id in self.input_atoms:
                i, idx = self.input_atoms[a.id]
                o = (self.spec.main.args[i].id, idx)
            if o is None or o[0] not in self.syms:
                return None
            ends.append(o)
        (vid, first), (other, last) = ends
        if other != vid or len(first) != arr.ndim:
            return None
        box = tuple((a, b + 1) for a, b in zip(first, last, strict=True))
        if any(b - a != n for (a, b), n in zip(box, arr.shape, strict=True)):
            return None
        return (vid, box) if _same_terms(arr, np.asarray(self.syms[vid])[box_index(box)]) else None

    def _cut_found(self, v, form, cut: tuple) -> None:
        """`v` was proved equal, on each device, to the (spec value, box) of `cut`."""
        self.cut_of[v.id] = cut
        if form is not None:
            self.repeats.record(*form, cut)

    def _cut_as_predicted(
        self, v, per_device: list, predicted: tuple, runs: list, index: TileIndex
    ) -> list | None:
        """`v` proved equal on each device to the block `predicted` names (a stage of the
        same form matched the same blocks of other values: `repeated_stages`), then its
        symbols; None when that is not proved (the caller looks for the match). The block
        must agree in simulation first, as a candidate found by looking does."""
        predicted = tuple(p and (self.twins.get(p[0], p[0]), p[1]) for p in predicted)
        cut = [(d, *p) for d, p in enumerate(predicted) if p is not None]
        if not cut or any(vid not in self.defs and vid not in self.views for _, vid, _ in cut):
            return None
        if not index.agrees([(vid, box, runs[d]) for d, vid, box in cut]):
            return None
        terms = [np.asarray(a) for a in per_device]
        self._now_proving(v.owner, cut[0][1])
        if all(self._is_definition(terms[d], vid, box) for d, vid, box in cut):
            self.stats.proved_by_normal_form += 1
        else:
            pairs = []
            for d, vid, box in cut:
                t = terms[d]
                block = np.asarray(self.spec_view(vid))[box_index(box)]
                if block.shape != t.shape:
                    return None
                pairs += _element_pairs(t, block)
            if self._prove_pairs(pairs, STAGE_LEVELS, final=False).status != "proved":
                return None
        counted = _stages_counted([vid for _, vid, _ in cut])
        self.stats.stages += counted
        self.stats.repeated_stages += counted
        out = list(per_device)  # a device the earlier stage did not cut keeps its value
        for d, vid, box in cut:
            out[d] = np.asarray(self._cut_symbols(vid))[box_index(box)]
        self.cut_of[v.id] = predicted
        return out

    def _cut_per_device(self, per_device: list, runs: list, index: TileIndex, cuts: list) -> list:
        """No spec value whose tiles the devices hold: cut each device on its own, at a tile
        of whichever spec value its value equals (a pipeline stage holds another layer's
        activation than its neighbour). Each replacement is proved for its device; a device
        whose value is no spec tile (an idle stage's work) keeps its value. `cuts[d]` is set
        to device d's (spec value, box) when it is cut."""
        out = list(per_device)
        # the distinct values met and their device, by `terms_key` (a pipeline's
        # devices' values are mostly distinct: each is compared with a few, not all)
        cut: dict = {}
        for d, a in enumerate(per_device):
            terms = np.asarray(a)
            same = None
            if self.cache is not None:  # proofs reused (Options.reuse_proofs)
                met = cut.setdefault(terms_key(terms), [])
                same = next((e for b, e in met if _same_terms(terms, b)), None)
            if same is not None:
                # the same terms as a device already cut (a value replicated over a tensor
                # axis): the same obligation, so the same replacement, proved (or not) alike
                out[d] = out[same]
                cuts[d] = cuts[same]
                if out[same] is not per_device[same]:
                    self.stats.stages += 1
                    self.stats.cache_hits += 1
                continue
            if self.cache is not None:
                met.append((terms, d))
            if all(not np.any(np.asarray(r)) for r in runs[d]):
                # all zeros in every run (an idle pipeline stage computing on zeros): zero
                # tiles of any spec value "match", and expanding one costs without bound
                continue
            for vid, box in index.tile_matches(runs[d])[:2]:
                self._now_proving(None, vid)
                if self._is_definition(terms, vid, box):
                    self.stats.proved_by_normal_form += 1
                    outcome = _Outcome("proved", "normal_form")
                else:
                    block = _shaped(np.asarray(self.spec_view(vid))[box_index(box)], a)
                    pairs = _element_pairs(a, block)
                    outcome = self._prove_pairs(pairs, STAGE_LEVELS, final=False)
                if outcome.status == "proved":
                    self.stats.stages += 1
                    out[d] = _shaped(np.asarray(self._cut_symbols(vid))[box_index(box)], a)
                    cuts[d] = (vid, box)
                    break
        return out

    def _is_definition(self, terms: np.ndarray, vid: int, box) -> bool:
        """Are these terms spec value `vid`'s one-op definition at `box` (the same op on the
        same cut operands)? Then they equal its symbols there: what expanding them shows."""
        return _same_terms(
            terms, _shaped(np.asarray(self._definition_of(vid))[box_index(box)], terms)
        )

    def _definition_of(self, vid: int):
        """Spec value `vid` one op deep: its definition when it is a cut-point, its elements
        (cut symbols moved) when it is a view of cut-points."""
        return self.defs[vid] if vid in self.defs else self.views[vid]

    def _cut_symbols(self, vid: int):
        """Spec value `vid` as cut symbols, once an implementation value is proved equal to
        it: its own symbols, or for a view (a transpose or reshape of cut-points: a weight
        gradient computed transposed, then transposed back) the moved symbols of the values
        it views. Those values are proved from then on (`spec_view` gives their symbols)."""
        if vid in self.defs:
            self.proved.add(vid)
            return self.syms[vid]
        self.proved.update(self._unproved_deps(self.views[vid]))
        return self.views[vid]

    def _output_pairs(self, layout, per_device: list, spec_value) -> list:
        """Element pairs stating that the devices' pieces of an output are the spec output."""
        spec_value = np.asarray(spec_value)
        pairs = []
        if layout.unreduced:
            for group in layout.unreduced:
                box = layout.box(group[0])
                total = per_device[group[0]]
                for d in group[1:]:
                    total = SymbolicAlgebra().add(total, per_device[d])
                pairs += _element_pairs(_trim(total, box), _block(spec_value, box))
            return pairs
        for d in layout.holders:  # a maximal layout's value is on its device only
            box = layout.box(d)
            pairs += _element_pairs(_trim(per_device[d], box), _block(spec_value, box))
        return pairs

    def _same_conditions(self, x, y, memo: dict):
        """A pair whose definedness conditions differ, with unproved cut symbols expanded in
        both conditions: the spec side comes expanded (`spec_view`), while an implementation
        value replaced by a cut symbol carries that symbol's condition as it was written."""
        x, y = T.settle(x), T.settle(y)
        if (
            isinstance(x, T.Poly)
            and isinstance(y, T.Poly)
            and x.dom is not y.dom
            and (self._has_unproved(x.dom) or self._has_unproved(y.dom))
        ):
            x = T.settle(self._expand_term(x, self._unproved_mapping, memo))
            y = T.settle(self._expand_term(y, self._unproved_mapping, memo))
        return x, y

    def _has_unproved(self, b) -> bool:
        return any((o := self.owner.get(a)) is not None and o[0] not in self.proved for a in b.syms)

    def _check_time(self) -> float | None:
        """Seconds left before the time limit (None: no limit); raises when none are."""
        check_memory()
        if self.deadline is None:
            return None
        left = self.deadline - time.perf_counter()
        if left <= 0:
            raise _OutOfTime()
        return left

    def _prove_pairs(self, pairs: list, levels: int, final: bool) -> _Outcome:
        self._check_time()
        settle: dict = {}
        work = [_residue(*self._same_conditions(x, y, settle)) for x, y in pairs if not _same(x, y)]
        work = [w for w in work if not _work_done(w)]
        if not work:
            self.stats.proved_by_normal_form += 1
            return _Outcome("proved", "normal_form")
        # a stage obligation proved past its cheapest step (one expansion) is looked up in
        # the cache of proofs: one it is a renaming of proves it (cheaper steps cost less
        # than a look-up); a proof found after the look-up is stored
        original, probe = work, None
        expanded: list[set[int]] = []  # the symbols each level expanded (for the cache)

        def reused() -> bool:
            nonlocal probe
            if self.cache is None or final or probe is not None:
                return False
            probe = self.cache.probe(original, self._cut_definition)
            if probe.hit() is None:
                return False
            self.stats.cache_hits += 1
            return True

        memo: dict = {}
        limit = MONOMIAL_LIMIT if final else STAGE_MONOMIAL_LIMIT
        if not final and self._closed_by_latest(work, limit):
            return _Outcome("proved", "normal_form")
        for level in range(levels):
            self._check_time()
            if level == 1 and reused():
                return _Outcome("proved", "cache")
            groups = self._culprits(work)
            if not groups:
                break
            # perturbation flags every value in a violated relation ("m = mean(x1)" flags m
            # and x1); the latest of them is the derived one: expand it, then look again
            target = max(groups, key=lambda g: self.spec_order.get(g, 0))
            if self.cache is not None and not final:
                expanded.append(self._symbols_of(work, target))

            def expand(e, target=target):
                return self._expand_term(e, lambda aid: self._definition(aid, target), memo, limit)

            new, size = [], 0
            for w in work:
                try:
                    w = _map_work(w, expand)
                except T.TermTooLarge as e:
                    return _Outcome("unknown", reason=f"expansion too large ({e})")
                if not _work_done(w):
                    new.append(w)
                    size += _work_size(w)
            work = new
            self.stats.expansions += 1
            if not work:
                self.stats.proved_by_normal_form += 1
                if probe is not None:
                    probe.record(expanded, "normal_form")
                return _Outcome("proved", "normal_form")
            if size > (EXPANSION_BUDGET if final else STAGE_BUDGET):
                if not final:
                    return _Outcome("unknown", reason="stage too large")
                break
        if reused():
            return _Outcome("proved", "cache")
        if not final and any(isinstance(w, T.Poly) and w.is_const() for w in work):
            # a non-zero constant difference wherever both are defined: not this candidate
            return _Outcome("unknown", reason="the values differ by a constant")
        pairs = [_as_pair(w) for w in work]
        timeout = self.opt.timeout if final else min(STAGE_SMT_SECONDS, self.opt.timeout)
        if not final:
            by_element = self._by_representatives(pairs, timeout)
            if by_element is not None:
                if by_element.status == "proved" and probe is not None:
                    probe.record(expanded, "z3")
                return by_element
        if not final and sum(_size(x) + _size(y) for x, y in pairs) > STAGE_SMT_SIZE:
            return _Outcome("unknown", reason="stage too large for the solver")
        left = self._check_time()
        timeout = timeout if left is None else min(timeout, left)
        res = smt.check_equal(pairs, timeout_s=timeout)
        if res.status == "unsat":
            self.stats.proved_by_z3 += 1
            if probe is not None:
                probe.record(expanded, "z3")
            return _Outcome("proved", "z3")
        self._check_time()
        if res.status == "sat" and final:
            if not self._only_inputs(pairs):
                # a model over cut symbols may not be reachable from any input: express
                # everything in the inputs and ask again, so the model can be replayed
                pairs = self._expand_all(pairs, limit)
                if pairs is None:
                    return _Outcome(
                        "unknown",
                        reason="a solver model over cut-points could "
                        "not be expressed in the inputs (too large)",
                    )
                res = smt.check_equal(pairs, timeout_s=timeout)
                if res.status == "unsat":
                    self.stats.proved_by_z3 += 1
                    return _Outcome("proved", "z3")
            if res.status == "sat":
                return _Outcome(
                    "sat",
                    model=res.model,
                    reason="the solver found a difference, but on the inputs it gave the "
                    "programs agree when run (no counterexample: the solver works over the "
                    "reals, with functions such as exp or erf left uninterpreted, and the "
                    "programs in floats)",
                )
        return _Outcome("unknown", reason=res.reason or "normal forms differ; solver: not proved")

    def _closed_by_latest(self, work: list, limit: int) -> bool:
        """Does expanding the latest cut value the residues name close them all? A stage
        is most often an implementation value against one spec value's symbols, equal to
        that value's definition: this finds that expansion without first perturbing every
        value in the residues (`_culprits`). When it does not close them, nothing is kept."""
        latest, latest_order = None, None
        for w in work:
            for aid in w.syms if isinstance(w, T.Poly) else _syms(w[0]) | _syms(w[1]):
                o = self.owner.get(aid)
                if o is not None:
                    order = self.spec_order.get(o[0], 0)
                    if latest is None or order > latest_order:
                        latest, latest_order = o[0], order
        if latest is None:
            return False
        memo: dict = {}  # its own: a failed attempt leaves nothing behind

        def expand(e):
            return self._expand_term(e, lambda aid: self._definition(aid, latest), memo, limit)

        for w in work:
            try:
                if not _work_done(_map_work(w, expand)):
                    return False
            except T.TermTooLarge:
                return False
        self.stats.expansions += 1
        self.stats.proved_by_normal_form += 1
        return True

    def _by_representatives(self, pairs: list, timeout: float) -> _Outcome | None:
        """A stage's residues decided one renaming class at a time (`renaming_classes`):
        the solver proves one member of each class, which proves its renamings. None when
        that saves less than half the residues, when there are more than REPRESENTATIVES
        classes, when one is too large for the solver or when one is not proved: the
        obligation is then decided whole, as before (a model for one element is no
        refutation of a stage: it is only a candidate that did not match)."""
        if len(pairs) < 2:
            return None
        groups = renaming_classes(pairs)
        if groups is None or len(groups) * 2 > len(pairs) or len(groups) > REPRESENTATIVES:
            return None
        firsts = [pairs[g[0]] for g in groups]
        if any(_size(x) + _size(y) > STAGE_SMT_SIZE for x, y in firsts):
            return None
        for pair in firsts:
            left = self._check_time()
            res = smt.check_equal([pair], timeout_s=timeout if left is None else min(timeout, left))
            if res.status != "unsat":
                return None  # decided whole, as before (one element alone proves less)
        self.stats.proved_by_z3 += 1
        return _Outcome("proved", "z3")

    def _cut_definition(self, atom_id: int):
        """A cut symbol's definition over proved cut symbols and inputs (None: no cut
        symbol), as expansions substitute it."""
        o = self.owner.get(atom_id)
        return None if o is None else self.expr(o[0])[o[1]]

    def _symbols_of(self, work: list, target: int) -> set[int]:
        """The symbols of spec value `target` in the residues (what expanding it replaces)."""
        out: set[int] = set()
        for w in work:
            syms = w.syms if isinstance(w, T.Poly) else (_syms(w[0]) | _syms(w[1]))
            out.update(a for a in syms if (o := self.owner.get(a)) is not None and o[0] == target)
        return out

    # -- what the proof is working on (for reports that stop it midway) ------------------
    def _now_proving(self, impl_op, spec_vid: int, output: int | None = None) -> None:
        """Record the current obligation: implementation op `impl_op` (None: the one already
        recorded) against spec value `spec_vid` (output `output`, when it is one)."""
        if impl_op is None and self.obligation is not None:
            impl_op = self.obligation[0]
        self.obligation = (impl_op, spec_vid, output)

    def _stopped(self, why: str) -> Report:
        """`unknown`: the proof stopped (time or memory) midway; say where."""
        where = self._obligation_text()
        return self._report(
            UNKNOWN,
            reason=f"{why} ({self.stats.stages} stages proved by then"
            + (f"; {where})" if where else ")"),
        )

    def _obligation_text(self) -> str:
        """`while proving impl OP at FILE:LINE equal to spec candidate OP at FILE:LINE`."""
        if self.obligation is None:
            if self.spec_op is None:
                return ""
            return f"while evaluating the spec symbolically, at spec {_describe_op(self.spec_op)}"
        impl_op, spec_vid, output = self.obligation
        spec_op = _defining_op(self.spec.main, spec_vid)
        what = f"output {output}: " if output is not None else ""
        impl = _describe_op(impl_op) if impl_op is not None else "an implementation value"
        spec = _describe_op(spec_op) if spec_op is not None else "a spec input"
        return f"while proving {what}impl {impl} equal to spec candidate {spec}"

    def _expand_all(self, pairs, limit: int):
        """Every cut symbol replaced by its definition, down to the inputs (None if too big)."""
        memo: dict = {}

        def definition(aid):
            o = self.owner.get(aid)
            return None if o is None else self.expr(o[0])[o[1]]

        for _ in range(OUTPUT_LEVELS):
            if self._only_inputs(pairs):
                return pairs
            try:
                pairs = [
                    (
                        self._expand_term(x, definition, memo, limit),
                        self._expand_term(y, definition, memo, limit),
                    )
                    for x, y in pairs
                ]
            except T.TermTooLarge:
                return None
        return pairs if self._only_inputs(pairs) else None

    # -- simulation-guided expansion ------------------------------------------------------
    def _definition(self, aid: int, target: int):
        """The definition of a symbol of spec value `target` (None for other symbols)."""
        o = self.owner.get(aid)
        if o is None or o[0] != target:
            return None
        return self.expr(o[0])[o[1]]

    def _sim_value(self, aid: int) -> float:
        v = self.sim_env.get(aid)
        if v is None:
            o = self.owner.get(aid)
            if o is not None:
                v = float(self.spec_trace.values[o[0]][o[1]])
            elif aid in TABLE_VALUES:
                v = TABLE_VALUES[aid]
            elif aid in self.input_atoms:
                i, idx = self.input_atoms[aid]
                v = float(self.sim_inputs[i][idx])
            else:  # a device's share of a partial sum, or its buffer of a value on another
                v = 0.0  # device: zeros in the simulation (Placement.shard_inputs)
            self.sim_env[aid] = v
        return v

    def _culprits(self, work) -> set[int]:
        """Cut values whose definitions the residues need: perturbing their symbols (with all
        other symbols at their simulated values) makes a residue non-zero."""
        flagged: set[int] = set()
        rng = np.random.default_rng(1)
        for w in work:
            groups: dict[int, list[int]] = {}
            syms = w.syms if isinstance(w, T.Poly) else (_syms(w[0]) | _syms(w[1]))
            for aid in syms:
                o = self.owner.get(aid)
                if o is not None:
                    groups.setdefault(o[0], []).append(aid)
            pending = [g for g in groups if g not in flagged]
            if not pending:
                continue
            if not isinstance(w, T.Poly):
                flagged.update(pending)
                continue
            base = {aid: self._sim_value(aid) for aid in syms}
            try:
                points = T.Perturbations(w, base)
            except (ValueError, ZeroDivisionError, OverflowError, TvError):
                points = None  # the base point itself fails: every group is evaluated whole
            for g in pending:
                moved = {aid: base[aid] * 1.7 + float(rng.standard_normal()) for aid in groups[g]}
                try:
                    if points is None:
                        val, scale = T.evaluate_with_scale(w, base | moved)
                    else:
                        val, scale = points.at(moved)
                except (ValueError, ZeroDivisionError, OverflowError, TvError):
                    flagged.add(g)
                    continue
                if not (abs(val) <= 1e-7 * (1.0 + scale)):
                    flagged.add(g)
        return flagged

    def _has_cut(self, e) -> bool:
        if not isinstance(e, (T.Poly, T.Bool)):
            return False
        return any(self.owner.get(a) is not None for a in e.syms)

    def _only_inputs(self, pairs) -> bool:
        return not any(self._has_cut(x) or self._has_cut(y) for x, y in pairs)

    def _model_inputs(self, model: dict[int, float], spec_tr, impl_tr) -> list | None:
        """The inputs a solver model stands for (the first simulation's elsewhere). Where on
        them a program overflows floats (integers near their extremes converted to floats:
        floats are reals, so no counterexample), only outputs that do not read the overflow
        can show a difference (`localise.refutation`)."""
        base = [
            None if a is None else np.array(a, copy=True)
            for a in (spec_tr[0].values[v.id] for v in self.spec.main.args)
        ]
        for aid, val in model.items():
            where = self.input_atoms.get(aid)
            if where is not None:
                i, idx = where
                t = self.spec.main.arg_types[i]
                base[i][idx] = val if t.is_integer else bool(val) if t.is_bool else float(val)
        return base


def _likeliest_boxes(c, per_device: list, views: list):
    """`c` with each device's box chosen, among tiles that were equal in simulation, as the
    one whose elements have the device's normal forms most often, in any of `views` of the
    spec value (what users see: its symbols once proved; its definition, which a
    recomputed value meets). Masked attention tiles of
    different heads can hold the same numbers in every run (0 on the diagonal, the mask value
    elsewhere) while being different functions of the inputs: the first such tile found was
    often another head's, and the proof then failed (MaxText's step). Only which obligation
    is tried changes; it still has to be proved."""
    for d, boxes in enumerate(c.alternatives):
        if len(boxes) < 2:
            continue
        piece = np.asarray(per_device[d])

        def agreeing(box, piece=piece):
            blocks = [np.asarray(v)[box_index(box)] for v in views]
            if any(b.size != piece.size for b in blocks):
                return -1
            return sum(any(_same(a, b.flat[k]) for b in blocks) for k, a in enumerate(piece.flat))

        best = max(boxes, key=agreeing)  # the first of equally good boxes
        if best != c.boxes[d]:
            c = c.with_box(d, best)
    return c


def _describe_op(op) -> str:
    loc = op.loc
    where = f"{loc.file}:{loc.line}" if loc.file else "unknown source line"
    return f"{op.name} at {where}" + (f" ({loc.name})" if loc.name else "")


def _defining_op(fn, vid: int):
    """The op (at any depth of `fn`'s regions) whose result is value `vid`, else None."""
    stack = [fn.body]
    while stack:
        block = stack.pop()
        for op in block.ops:
            if any(r.id == vid for r in op.results):
                return op
            stack.extend(r.block for r in op.regions)
    return None


# ops that only relabel elements (each element once): an implementation value may hold a tile
# of their result that no cut value holds (XLA computes a gradient transposed differently)
RELABELLING_OPS = ("stablehlo.transpose", "stablehlo.reshape")


def _cuttable(op, v, per_device: list) -> bool:
    """A float value with terms, computed (not moved: a moved value's terms are an earlier
    value's), or looked up at indices that are data (`_looked_up`)."""
    return (
        isinstance(v.type, TensorType)
        and v.type.is_float
        and any(_is_sym(r) for r in per_device)
        and (op.name not in MOVEMENT_OPS or _looked_up(op, per_device))
    )


def _looked_up(op, per_device: list) -> bool:
    """A gather at indices that are data (an embedding lookup `emb[tokens]`): its elements
    are selects among the table's, not the table's own symbols. A cut there lets a lookup
    XLA splits over the table's shards (each device's masked local lookup, summed) meet the
    spec's lookup as a stage, instead of carrying the selects into every later op."""
    if op.name != "stablehlo.gather":
        return False
    # indices that are data make every element a select: the first one tells (either way
    # is sound; a cut is proved before it is used)
    first = next((r.flat[0] for r in per_device if _is_sym(r) and r.size), None)
    a = T.as_atom(first) if isinstance(first, T.Poly) else None
    return first is not None and (a is None or a.kind != "sym")


def _definition_key(v, definition) -> tuple:
    """What identifies a spec value: its dtype, shape and terms (hash-consed, so equal
    definitions over the same symbols give equal keys)."""
    arr = np.asarray(definition)
    return (v.type.dtype, arr.shape, tuple(arr.reshape(-1).tolist()))


def _carry_definedness(sym: np.ndarray, definition, deeper=None) -> None:
    """A cut symbol is defined where its definition is (where a division by zero made the
    spec value non-finite, so is the symbol standing for it), and has its definition's
    sign (a sum of squares stays >= 0 behind its symbol) and its conditions for being 0
    or 1 (AdamW's two bias corrections vanish together behind their symbols). A sign the
    definition does not show may show one op deeper (`deeper`): torch_xla hands
    batch_norm_grad `(1 / rsqrt(var + eps))**2 - eps` as the variance, so the gradient's
    `variance + eps` is a square only once the `- eps` below its symbol is seen."""
    definition = np.asarray(definition)
    if definition.dtype != object:
        return
    for idx in np.ndindex(*sym.shape):
        d = definition[idx]
        if isinstance(d, T.Poly):
            if T.size(d.dom, SETTLE_LIMIT + 1) <= SETTLE_LIMIT:
                d = T.settle(d)  # an equivalent condition, simpler; too costly when large
            # its sign (rsqrt(var + eps) stays defined past the cut) and where it is 0 or 1
            # (1 - b1**t and 1 - b2**t: zero where t is, past cuts), when first asked for
            T.note_later(sym[idx], d, deeper)
            T.note_extremum(sym[idx], d)  # sum(x == max(x)) >= 1, past cuts
            if d.dom is not T.TRUE:
                sym[idx] = T.with_dom(sym[idx], d.dom, d.infs)


def _element_pairs(a, b) -> list:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise Unsupported(f"cannot compare a {a.shape} piece with a {b.shape} block")
    return [(a[idx], b[idx]) for idx in np.ndindex(*a.shape)]


def _shaped(block: np.ndarray, like) -> np.ndarray:
    """A spec tile as the implementation value it was matched with: the same elements in
    the same order, with the value's unit dimensions (the identity when the shapes agree)."""
    shape = np.shape(like)
    if block.shape == shape or block.size != np.size(like):
        return block  # (a block of another size: the comparison refuses it)
    return block.reshape(shape)


def _block(array, box):
    return np.asarray(array)[box_index(box)]


def _trim(piece, box):
    """A device buffer without XLA's padding of uneven shards."""
    return np.asarray(piece)[(*(slice(0, hi - lo) for lo, hi in box), Ellipsis)]


def _by_device(outputs: list, n: int) -> list:
    """[output][device] -> [device][output]."""
    return [[out[d] for out in outputs] for d in range(n)]


def _is_sym(r) -> bool:
    return isinstance(r, np.ndarray) and r.dtype == object


def _stages_counted(vids: list[int]) -> int:
    """Stages a cut counts for, as when it is looked for: one when every device holds a
    block of the same spec value, else one per device cut."""
    return 1 if len(set(vids)) == 1 else len(vids)


def _residue(x, y):
    """A numeric pair as one residue x - y (proved when it is 0, where both are defined);
    booleans, pairs defined in different places, and pairs with an infinite side stay
    pairs (`-inf - s` is `-inf` whatever `s`: the residue would forget the symbol whose
    expansion, `-inf - m` for a masked score, makes the two sides equal)."""
    if isinstance(x, T.Bool) or isinstance(y, T.Bool):
        return (x, y)
    try:
        x, y = T.lift(x), T.lift(y)
        if x.dom is not y.dom or x.inf or y.inf:
            return (x, y)
        d = T.sub(x, y)
    except TvError:
        return (x, y)
    return d


def _map_work(w, f):
    if isinstance(w, T.Poly):
        return T.lift(f(w))
    return _residue(f(w[0]), f(w[1]))


def _work_done(w) -> bool:
    if isinstance(w, T.Poly):
        return not w.terms and not w.inf
    return _same(w[0], w[1])


def _work_size(w) -> int:
    return _size(w) if isinstance(w, T.Poly) else _size(w[0]) + _size(w[1])


def _as_pair(w):
    return (w, T.with_dom(T.ZERO, w.dom)) if isinstance(w, T.Poly) else w


def _syms(e) -> frozenset:
    return e.syms if isinstance(e, (T.Poly, T.Bool)) else frozenset()


def _size(e) -> int:
    return T.size(e) if isinstance(e, (T.Poly, T.Bool)) else 1


def _input_independent(runs: list[list]) -> bool:
    """Is every device's value the same in every simulation run (two runs at least)?"""
    return all(
        len(r) > 1 and all(np.array_equal(r[0], x, equal_nan=True) for x in r[1:]) for r in runs
    )
