"""Independent obligations of one check in forked worker processes (`--workers N`).

Once the prover has built what several obligations read (the simulation, the symbolic
passes, the cut-points proved), the obligations themselves are independent: the outputs'
final proofs, the copies of a replicated box, the rest and loop-body obligations of a proof
by induction. `run_jobs` forks `workers` children that inherit that state copy-on-write,
hands them obligation numbers one at a time (a child asks for the next when it is done, so
a slow solver query does not hold up the others), and returns the results in obligation
order; the caller merges them exactly as it would have merged them one after another, so
the report is the one a single worker writes.

- Terms are hash-consed per process, so only small results cross back (outcomes, reports,
  counters), never terms; a child raises nothing across: its exception comes back as a
  value and is raised by the caller at that obligation's place in the order.
- z3: every query has a context of its own (`smt.check_equal`), made where it is asked, so
  none crosses the fork, and its variables are numbered by the query, not by term ids: a
  child asks z3 what one worker asks and gets the same model.
- Limits: the run's deadline holds in every child (the same monotonic clock) and the parent
  stops children that overrun it; the memory the run may still add is split between the
  children, each measuring its own private memory (pages it copied from the parent count).
- A child that dies (killed by the OS, say) loses no obligation: its unfinished one is
  proved again in the parent.

Which obligations run this way is the callers' choice (tv_ir.prover.engine,
tv_ir.prover.loop_induction); when a pool starts is `decided`'s rule; `requested()` is what the user
asked for: `--workers N` / `workers=N`, else the environment variable TV_WORKERS, else
None (automatic: the idle cores, once the obligations decided in one process have taken
PARALLEL_AFTER_S).
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import mmap
import multiprocessing
import os
import pickle
import select
import struct
import sys
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import BadInput, TvError
from ..limits import (
    OutOfMemoryBudget,
    OutOfTime,
    check_memory,
    enforced_limits,
    memory_left_mb,
    memory_set_aside,
    time_left,
    time_limit_reason,
    worker_memory_budget,
)
from . import machine_load

WORKERS_ENV = "TV_WORKERS"
# seconds past the deadline after which the parent stops children that have not stopped
# themselves (a child's own watchdog steps in at limits.ENFORCE_GRACE_S)
KILL_GRACE_S = 5.0

_requested: contextvars.ContextVar[int | None] = contextvars.ContextVar("tv_workers", default=None)


def validate(workers: Any, what: str = "workers") -> int | None:
    """`workers` as a count of processes (None: automatic); BadInput for anything but a
    whole number of at least 1."""
    if workers is None:
        return None
    if isinstance(workers, bool) or not isinstance(workers, int):
        if isinstance(workers, str) and workers.strip().lstrip("-").isdigit():
            workers = int(workers)
        else:
            raise BadInput(f"{what} must be a whole number of at least 1, not {workers!r}")
    if workers < 1:
        raise BadInput(f"{what} must be at least 1, got {workers}")
    return workers


def requested() -> int | None:
    """The worker count of the current run: `use_workers(n)`, else $TV_WORKERS, else None
    (automatic)."""
    n = _requested.get()
    if n is not None:
        return n
    env = os.environ.get(WORKERS_ENV, "").strip()
    return validate(env, WORKERS_ENV) if env else None


@contextlib.contextmanager
def use_workers(workers: int | None) -> Iterator[None]:
    """Run the enclosed check with `workers` processes (None: as before, i.e. automatic
    unless TV_WORKERS says otherwise)."""
    workers = validate(workers)
    if workers is None:
        yield
        return
    token = _requested.set(workers)
    try:
        yield
    finally:
        _requested.reset(token)


def cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def idle_cores() -> int:
    """Cores not busy with other work: this process's cores less the load on them since the
    check began (`machine_load`, which counts this process), at least 1. On a machine
    other jobs keep busy a pool gains no CPU time and only slows every obligation down
    (docs/benchmarks.md, "Workers")."""
    load = machine_load.load()
    if load is None:
        return cores()
    return max(1, min(cores(), int(cores() - load + 1.5)))


def pool_size(jobs: int, worth_it: bool) -> int:
    """Processes for `jobs` independent obligations: what the user asked for, or when
    nothing was asked, the idle cores if `worth_it` (the caller's rule) and 1 otherwise;
    never more than the jobs, never more than 1 inside a child."""
    if jobs < 2 or _in_child[0]:
        return 1
    n = requested()
    if n is None:
        n = idle_cores() if worth_it else 1
    return max(1, min(n, jobs))


# seconds of obligations decided in this process after which, when the user did not say how
# many workers to use, the rest go to a pool of the idle cores (docs/benchmarks.md, "Workers":
# starting a pool and warming its children costs 0.1-0.6 s, and most programs' obligations
# close by normal forms in milliseconds, where a pool only costs)
PARALLEL_AFTER_S = 1.0


def decided(job: Callable[[int], Any], jobs: list[int], timing: dict | None = None) -> Iterator:
    """job(i) for i in jobs, in order (each a result or a `Failed`): with the workers the
    user asked for from the first job; automatically, in this process until the jobs done
    here have taken PARALLEL_AFTER_S, then the rest in a pool of the idle cores (none on a
    busy machine: then all in this process). `timing` gets
    "pool" (seconds from the pool's start to its last result) when a pool ran. Close it
    (contextlib.closing) to stop a pool early."""
    t0 = time.perf_counter()
    for k, i in enumerate(jobs):
        late = time.perf_counter() - t0 > PARALLEL_AFTER_S
        n = pool_size(len(jobs) - k, worth_it=late)
        if n > 1:
            t_pool = time.perf_counter()
            with contextlib.closing(in_order(job, jobs[k:], n)) as rest:
                yield from rest
            if timing is not None:
                timing["pool"] = time.perf_counter() - t_pool
            return
        yield _attempt(job, i)


@dataclass
class Failed:
    """A job's exception, to be raised by the caller at the job's place in the order."""

    error: BaseException


_in_child = [False]
_LEN = struct.Struct("<q")
_relayed: list[tuple[int, str]] = []  # in a child: progress lines of the job in hand
_sinks: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


class Relayed:
    """A progress callback that also works in worker processes: a child keeps its lines
    and sends them with the job's result, and the parent passes them on when it takes that
    result in order (so the lines come in the order one worker writes them, each job's
    once it is done)."""

    def __init__(self, fn: Callable[[str], None]):
        self.fn = fn
        _sinks[id(self)] = self

    def __call__(self, line: str) -> None:
        if _in_child[0]:
            _relayed.append((id(self), line))
        else:
            self.fn(line)


def _pass_on(lines: list[tuple[int, str]]) -> None:
    for sink_id, line in lines:
        sink = _sinks.get(sink_id)
        if sink is not None:
            sink.fn(line)


def run_jobs(job: Callable[[int], Any], jobs: list[int], workers: int) -> list[Any]:
    """[job(i) for i in jobs], computed by `workers` forked children (in this process when
    `workers` is 1): each entry is job(i)'s result or a `Failed` with its exception."""
    with contextlib.closing(in_order(job, jobs, workers)) as results:
        return list(results)


def in_order(job: Callable[[int], Any], jobs: list[int], workers: int) -> Iterator[Any]:
    """job(i) for i in jobs, each yielded (a result or a `Failed`) as soon as it and every
    job before it are done, so a caller that stops at the first failure (as one worker
    would) stops there: closing the generator stops the children still working."""
    if workers <= 1 or len(jobs) < 2 or not hasattr(os, "fork"):
        for i in jobs:
            yield _attempt(job, i)
        return
    workers = min(workers, len(jobs))
    left = memory_left_mb()
    share = None if left is None else max(left, 1.0) / workers
    sys.stdout.flush()
    sys.stderr.flush()  # buffered output would be written again by each child
    children: list[_Child] = []
    try:
        for _ in range(workers):
            try:
                children.append(_spawn(job, share, children))
            except OSError:  # no more processes (or memory for one): fewer workers
                break
        results: dict[int, Any] = {}
        queue = list(jobs)
        busy: dict[int, int] = {}  # child index -> job in hand
        for c, child in enumerate(children):
            busy[c] = queue.pop(0)
            child.send(busy[c])  # (no child at all: the loop below does every job here)
        for i in jobs:
            while i not in results:
                if not busy:  # every child died: the rest is done here
                    results.update((j, (_attempt(job, j), [])) for j in queue)
                    queue.clear()
                    break
                for c in _wait(children, busy):
                    got = children[c].receive()
                    if got is None:  # the child died: its job is done here
                        children[c].close()
                        lost = busy.pop(c)
                        results[lost] = (_attempt(job, lost), [])
                        continue
                    result, lines = got
                    results[busy.pop(c)] = (result, lines)
                    if queue:
                        busy[c] = queue.pop(0)
                        children[c].send(busy[c])
            result, lines = results.pop(i)
            _pass_on(lines)
            yield result
    finally:
        for child in children:
            child.stop()


class Beside:
    """`job()` computed in a forked child while the caller goes on with other work (the
    concrete checks at the real layer count beside the proof at fewer layers), when a core
    is free for it; else computed in this process when asked for. The child may use `share`
    MB (None: no limit), which the caller sets aside (`ChecksBeside`), and ends once it has
    given its result, its memory with it. Use as a context manager: a result no one asked
    for is abandoned (the child stopped) on leaving."""

    def __init__(
        self, job: Callable[[], Any], core_free: bool | None = None, share: float | None = None
    ):
        """`core_free`: whether a core is free for the child, if the caller decided
        (default: `_core_free()`)."""
        self.job = job
        self.child: _Child | None = None
        self._got = None  # the child's (result, lines), received when it was stopped
        if _in_child[0] or not hasattr(os, "fork"):
            return
        if not (_core_free() if core_free is None else core_free):
            return
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            self.child = _spawn(lambda _: job(), share, [], once=True)
            self.child.send(0)
        except OSError:  # no process for it: computed here when asked
            self.child = None

    def __enter__(self) -> Beside:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def forked(self) -> bool:
        return self.child is not None

    def result(self) -> Any:
        """job()'s result (its exception raised here); computed in this process when no
        child ran it, or the child died or ran out of its share of the memory."""
        child, self.child = self.child, None
        got, self._got = self._got, None
        if child is not None:
            try:
                _wait([child], {0: 0})
                got = child.receive()
            finally:
                child.stop()
        if got is not None:
            out, lines = got
            _pass_on(lines)
            if not isinstance(out, Failed):
                return out
            if not isinstance(out.error, OutOfMemoryBudget):
                raise out.error
        return self.job()

    def stop(self) -> None:
        """Stop the child; a result it has already given is kept."""
        if self.child is not None:
            ready, _, _ = select.select([self.child.results], [], [], 0)
            if ready:
                self._got = self.child.receive()
            self.child.stop()
            self.child = None


# the share of the memory left that a child working beside the caller may use (the caller's
# ceiling is lowered by as much): a quarter, as the concrete checks it runs are small
BESIDE_SHARE = 0.25


class ChecksBeside:
    """Named concrete checks that do not depend on the proof they back (the pair at the
    real layer count and at a larger one; each reduced class at a larger size), added as
    they become known and computed in a forked child (`Beside`) from `start()` on, in
    order, while the proof runs; each is computed in this process when asked for if no child
    took it (no core free, the child died or ran out of memory) or the child has not begun
    it yet (the proof is done: this process's core is free again, and the child skips it).

    `start()` again forks a child for the checks added since, which waits for the child
    before it to be done (or for this process to ask for a result): the checks known early
    (the layer counts') start before those known only once the proof's pair is built, and
    the children never take the proof's core, nor more memory than one share, between
    them."""

    def __init__(self):
        self.jobs: dict[str, Callable[[], Any]] = {}
        self.confirms = None  # the shape reduction whose confirmation is a job here
        self.real_mesh = None  # the real pair whose run on its whole mesh is a job here
        self.larger_mesh = None  # the real pair whose run on a larger reduced mesh is one
        # a check made of parts (`add_parts`): its parts' names and how their results combine
        self._parts: dict[str, tuple[list[str], Callable[[list], Any]]] = {}
        self._here: dict[str, Any] = {}  # parts made here while a child made others
        self._children: list[_Checks] = []  # one per start, in order
        self._started: set[str] = set()
        self._core_free: bool | None = None  # decided at the first start, for every child
        self._share: float | None = None  # the MB set aside for the children, one at a time
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> ChecksBeside:
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def add(self, name: str, job: Callable[[], Any]) -> None:
        self.jobs[name] = job

    def add_parts(
        self, name: str, parts: list[Callable[[], Any]], combine: Callable[[list], Any]
    ) -> None:
        """Check `name` as independent parts (each a job of its own, so the processes
        can share them out: a child from the first, this process from the last once its
        proof is done); its result is `combine` of theirs, in order."""
        keys = [f"{name} / {k}" for k in range(len(parts))]
        for key, part in zip(keys, parts, strict=True):
            self.jobs[key] = part
        self._parts[name] = (keys, combine)

    def start(self) -> None:
        """Fork a child for the checks added since the last start (if any were)."""
        jobs = {k: f for k, f in self.jobs.items() if k not in self._started}
        if not jobs:
            return
        self._started.update(jobs)
        if self._core_free is None:
            self._core_free = _core_free()
            if self._core_free and not _in_child[0] and hasattr(os, "fork"):
                # one share for all the children: each works once the one before is done
                # (a child ends with its result); the proof reaching the lowered ceiling
                # stops them all
                left = memory_left_mb()
                self._share = None if left is None else max(left, 1.0) * BESIDE_SHARE
                self._stack.enter_context(memory_set_aside(self._share, self._stop_children))
        # no fork, no child: every check is made here when asked for
        claims = _Claims(list(jobs)) if hasattr(os, "fork") else None
        after = self._children[-1].done if self._children else None
        done = multiprocessing.get_context("fork").Event() if hasattr(os, "fork") else None

        def in_order() -> dict[str, Any]:
            if after is not None:
                after.wait()  # the child before is done, or this process is asking
            try:
                return {
                    k: _attempt(lambda _, f=f: f(), 0)
                    for k, f in jobs.items()
                    if claims is None or claims.take(k)
                }
            finally:
                if done is not None:
                    done.set()

        beside = Beside(in_order, core_free=self._core_free, share=self._share)
        self._stack.enter_context(beside)
        taken = set(jobs) if beside.forked else set()
        self._children.append(_Checks(beside, taken, claims, done))

    def result(self, name: str) -> Any:
        """Check `name`'s result (its exception raised here). Asked for while a child
        still works, this process first makes, from the last, the checks no child has
        begun (the children skip them): they then finish together."""
        if name in self._parts:
            keys, combine = self._parts[name]
            return combine([self.result(k) for k in keys])
        held = next((c for c in self._children if name in c.taken), None)
        if held is not None and held.results is None:
            self._make_unbegun()
        if name in self._here:
            out = self._here[name]
            if isinstance(out, Failed):
                raise out.error
            return out
        if held is not None:
            if held.results is None:
                try:
                    held.results = held.beside.result()
                except Exception:  # the child's wrapper failed: each check is made here
                    held.results = {}
            out = held.results.get(name)
            if out is not None and not isinstance(out, Failed):
                return out
            if isinstance(out, Failed) and not isinstance(out.error, OutOfMemoryBudget):
                raise out.error
            if name in held.results and out is None:
                return None
        return self.jobs[name]()

    def _stop_children(self) -> None:
        """Every child stopped (the proof takes their share back): their checks are made
        here when asked for."""
        for checks in self._children:
            checks.beside.stop()

    def _make_unbegun(self) -> None:
        """The checks no child has begun, made here, the last first (every child waiting
        for the one before it goes on: this process is done with the proof). The last is
        claimed before a waiting child is let go, so that child cannot take it first."""
        waiting = [c.done for c in self._children if c.done is not None]
        for checks in reversed(self._children):
            if checks.results is not None:
                continue
            for key in reversed([k for k in self.jobs if k in checks.taken]):
                if checks.claims.take(key):
                    checks.taken.discard(key)  # the child now skips it
                    for done in waiting:
                        done.set()
                    waiting = []
                    self._here[key] = _attempt(lambda _, f=self.jobs[key]: f(), 0)
        for done in waiting:  # nothing left to claim here
            done.set()


@dataclass
class _Checks:
    """One child's checks: the child, the checks it was given (less those this process
    took back), the claims shared with it, the event it sets once done (the next child
    waits for it), its results once in."""

    beside: Beside
    taken: set[str]
    claims: _Claims | None
    done: Any
    results: dict[str, Any] | None = None


class _Claims:
    """Which process makes each check beside a proof: the first to take it (the child in
    order, the caller when it asks for one). A flag per check in memory shared across the
    fork, set under a lock; a lock not got in time (its holder killed) takes nothing."""

    def __init__(self, names: list[str]):
        self._index = {k: i for i, k in enumerate(names)}
        self._flags = mmap.mmap(-1, max(1, len(names)))
        self._lock = multiprocessing.get_context("fork").Lock()

    def take(self, name: str) -> bool:
        """Whether this process takes check `name` (no one had)."""
        i = self._index.get(name)
        if i is None or not self._lock.acquire(timeout=CLAIM_WAIT_S):
            return False
        try:
            if self._flags[i]:
                return False
            self._flags[i] = 1
            return True
        finally:
            self._lock.release()


CLAIM_WAIT_S = 5.0  # the lock is held for a byte's test and set


def _core_free() -> bool:
    """Whether a child beside this process gets a core of its own: the user's --workers
    (2 or more), else at least half a core idle since the check began (`machine_load`,
    which counts this process). A child costs a fork, not a pool's start-up, so half a
    core is enough."""
    n = requested()
    if n is not None:
        return n >= 2
    load = machine_load.load()
    if load is None:
        return cores() >= 2
    return cores() >= 2 and load <= cores() - 0.5


def _attempt(job: Callable[[int], Any], i: int) -> Any:
    try:
        return job(i)
    except Exception as e:  # raised by the caller, in order (MemoryError included)
        return Failed(e)


def _wait(children: list[_Child], busy: dict[int, int]) -> list[int]:
    """Children (indices) with a result ready; raises OutOfTime when they overrun the run's
    deadline by KILL_GRACE_S (their own limits failed to stop them)."""
    while True:
        left = time_left()
        wait = 0.5 if left is None else max(0.05, min(0.5, left + KILL_GRACE_S))
        fds = {children[c].results: c for c in busy}
        ready, _, _ = select.select(list(fds), [], [], wait)
        if ready:
            return [fds[f] for f in ready]
        left = time_left()
        if left is not None and left < -KILL_GRACE_S:
            raise OutOfTime(time_limit_reason("(worker processes stopped)"))
        check_memory()


class _Child:
    """A forked worker: job numbers go down one pipe, pickled results come up another."""

    def __init__(self, pid: int, tasks: int, results: int):
        self.pid, self.tasks, self.results = pid, tasks, results
        self.alive = True

    def send(self, i: int) -> None:
        os.write(self.tasks, _LEN.pack(i))

    def receive(self) -> Any | None:
        """The next result, or None when the child died before sending it."""
        head = _read_exactly(self.results, _LEN.size)
        if head is None:
            return None
        body = _read_exactly(self.results, _LEN.unpack(head)[0])
        if body is None:
            return None
        return pickle.loads(body)

    def close(self) -> None:
        if self.alive:
            self.alive = False
            for fd in (self.tasks, self.results):
                with contextlib.suppress(OSError):
                    os.close(fd)
            _reap(self.pid)

    def stop(self) -> None:
        """Ask the child to exit (kill it if it is still busy), and reap it."""
        if not self.alive:
            return
        with contextlib.suppress(OSError):
            os.write(self.tasks, _LEN.pack(-1))
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(self.pid, 9)  # a child still working on a job no one waits for
        self.close()


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        try:
            b = os.read(fd, min(n - got, 1 << 20))
        except OSError:
            return None
        if not b:
            return None
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def _spawn(
    job: Callable[[int], Any], share_mb: float | None, siblings: list[_Child], once: bool = False
) -> _Child:
    """A forked child serving `job` (until told to stop, or after one job with `once`)."""
    task_r, task_w = os.pipe()
    result_r, result_w = os.pipe()
    with warnings.catch_warnings():
        # jax warns on every fork; the children never call into jax or XLA
        warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
        pid = os.fork()
    if pid == 0:  # the child: only its own ends of its own pipes
        for fd in [task_w, result_r] + [f for c in siblings for f in (c.tasks, c.results)]:
            with contextlib.suppress(OSError):
                os.close(fd)
        code = 0
        try:
            _serve(job, task_r, result_w, share_mb, once)
        except BaseException:  # noqa: BLE001 (nothing may escape a forked child)
            code = 1
            with contextlib.suppress(Exception):
                traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    os.close(task_r)
    os.close(result_w)
    return _Child(pid, task_w, result_r)


def _serve(
    job: Callable[[int], Any], tasks: int, results: int, share_mb: float | None, once: bool
) -> None:
    """The child's loop: a job number in, its result out, until told to stop (or after
    one job with `once`)."""
    _in_child[0] = True
    with worker_memory_budget(share_mb), enforced_limits():
        while True:
            head = _read_exactly(tasks, _LEN.size)
            if head is None:
                return
            i = _LEN.unpack(head)[0]
            if i < 0:
                return
            _relayed.clear()
            out = _attempt(job, i)
            body = _pickled(out, list(_relayed))
            os.write(results, _LEN.pack(len(body)))
            view = memoryview(body)
            while view:
                view = view[os.write(results, view) :]
            if once:
                return


def _pickled(out: Any, lines: list) -> bytes:
    """(`out`, progress `lines`) pickled; an exception anywhere in them whose class does not
    pickle (one made on the fly, such as the watchdog's; `Failed` inside a job's result
    tuple too) comes back as its nearest picklable base, with its message."""
    buffer = io.BytesIO()
    try:
        _ExceptionsAsBases(buffer).dump((out, lines))
    except Exception:
        if not isinstance(out, Failed):
            raise
        return pickle.dumps((Failed(TvError(str(out.error))), lines))
    return buffer.getvalue()


class _ExceptionsAsBases(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, BaseException) and not _importable(type(obj)):
            base = next((c for c in type(obj).__mro__ if _importable(c)), TvError)
            return _rebuilt_exception, (base, str(obj))
        return NotImplemented


def _importable(cls: type) -> bool:
    """Whether pickle finds the class again by its module and name."""
    obj: Any = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        obj = getattr(obj, part, None)
    return obj is cls


def _rebuilt_exception(cls: type, message: str) -> BaseException:
    try:
        return cls(message)
    except Exception:  # a base whose constructor wants more than a message
        return TvError(message)
