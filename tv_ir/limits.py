"""The limits a run of tv works within, in one place each: program size, wall-clock time,
and nesting depth.

- **Size** (`refuse_oversized`): a tensor of more than `MAX_TENSOR_ELEMENTS` elements is
  refused up front as bad input (exit 3), naming the value; tv evaluates programs on
  concrete float64 arrays, so such a tensor could not even be simulated. This is the one
  check to relax when tv learns to reduce shapes.
- **Time** (`deadline`, `check_time`): `--time-limit S` bounds the whole run (import, loop
  unrolling, simulation, proof). Long loops check the clock and raise `OutOfTime`, which
  the pipeline turns into the verdict `unknown`.
- **Memory** (`memory_budget`, `check_memory`): `--memory-limit MB` bounds the memory the
  run adds to the process: its resident memory may grow by at most MB over what it held
  when the run started (a notebook or a test session already holding gigabytes gets the
  same budget for a check as a fresh `tv` process). It is polled (at most every
  `MEMORY_POLL_SECONDS`) wherever the clock is checked, i.e. between steps of import,
  simulation and proof, and running over raises `OutOfMemoryBudget` (verdict `unknown`).
  Not `setrlimit(RLIMIT_AS)`: XLA and tv's deep thread reserve far more address space than
  they use, so an address-space cap breaks them (threads fail to start) long before memory
  is short, and it would outlive the call.
- **Enforced** (`enforced_limits`): the polls above are cooperative, and one long step
  between two polls (a symbolic scatter over input-dependent indices, a library call) ran
  a check to 13 GB under a 3 GB limit. A watchdog thread watches the clock and resident
  memory and, when a poll has not stopped the run `ENFORCE_GRACE_S` past the deadline or
  with memory `ENFORCE_MEMORY_SLACK` over the limit, raises `OutOfTime` /
  `OutOfMemoryBudget` in the checking thread itself (CPython's asynchronous exceptions:
  delivered at the thread's next bytecode), and again every `ENFORCE_REFIRE_S` while the
  run goes on. One that lands in a callback the interpreter calls itself (jax's
  garbage-collection callback, a finaliser) would be dropped with an "Exception ignored"
  traceback on stderr: while limits are enforced, `sys.unraisablehook` swallows those
  silently and the watchdog sends the next at once (a 40 s limit ran 79 s, printing three
  tracebacks, when a long symbolic op triggered collections). A stop by a poll counts as
  the watchdog's own interrupt: the work it leads to (the report of how far the proof got,
  freeing millions of terms) has `ENFORCE_REFIRE_S`, not `ENFORCE_GRACE_S`; cut short, the
  report lost what the proof had reached and which classes shape reduction kept. Inside a C
  call (a z3 query, an XLA compile) it waits for the call to return; z3 queries have their
  own timeout and interrupt (prover/smt.py).
- **Depth** (`run_deep`): programs nest (regions in regions, loops unrolled thousands of
  times, terms built from terms) and tv's walks over them recurse; they run on a thread
  with a large stack and a high recursion limit, so depth is bounded by
  `RECURSION_LIMIT` rather than by Python's default of 1000. A program deeper than that
  gets the verdict `unknown` (`TooDeep`), never a RecursionError.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import gc
import importlib._bootstrap as import_system  # the import system's module locks
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .errors import BadInput, TvError

# -- size -----------------------------------------------------------------------------------

MAX_TENSOR_ELEMENTS = 2**31


def refuse_oversized(module, name: str) -> None:
    """BadInput naming the first value of `module` with more than MAX_TENSOR_ELEMENTS
    elements (arguments first, then results, then values computed inside), in the functions
    main calls (a function left uncalled, after inlining, is never run)."""
    for fn in _called_from_main(module):
        where = f"@{fn.name}" if fn.name != "main" else ""
        for k, t in enumerate(fn.arg_types):
            arg = fn.arg_names[k] if k < len(fn.arg_names) and fn.arg_names[k] else None
            label = f"argument {k}" + (f" ({arg})" if arg else "")
            _refuse(t, f"{label}{' of ' + where if where else ''}", name)
        for k, t in enumerate(fn.result_types):
            _refuse(t, f"result {k}{' of ' + where if where else ''}", name)
        stack = [fn.body]
        while stack:
            block = stack.pop()
            for op in block.ops:
                for r in op.results:
                    _refuse(r.type, f"{op.name} at {op.loc}", name)
                stack.extend(region.block for region in op.regions)


def _called_from_main(module) -> list:
    functions = module.functions
    if "main" not in functions:
        return list(functions.values())
    seen, order, stack = {"main"}, [], ["main"]
    while stack:
        fn = functions[stack.pop()]
        order.append(fn)
        blocks = [fn.body]
        while blocks:
            for op in blocks.pop().ops:
                for key in ("callee", "decomposition"):
                    callee = op.attrs.get(key)
                    if isinstance(callee, str) and callee in functions and callee not in seen:
                        seen.add(callee)
                        stack.append(callee)
                blocks.extend(region.block for region in op.regions)
    return order


def _refuse(t, what: str, name: str) -> None:
    shape = getattr(t, "shape", None)
    if shape is None:
        for inner in getattr(t, "types", ()) or ():
            _refuse(inner, what, name)
        return
    n = int(np.prod([int(d) for d in shape], dtype=object)) if shape else 1
    if n > MAX_TENSOR_ELEMENTS:
        raise BadInput(
            f"{name}: {what} is {t}: {n:,} elements, more than tv handles in one tensor "
            f"({MAX_TENSOR_ELEMENTS:,} = 2^31)"
        )


# -- time -----------------------------------------------------------------------------------


class OutOfTime(TvError):
    """The run's time limit ran out (the verdict becomes unknown)."""

    exit_code = 2


_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "tv_deadline", default=None
)
_limit: contextvars.ContextVar[float | None] = contextvars.ContextVar("tv_limit", default=None)


@contextlib.contextmanager
def deadline(seconds: float | None):
    """Bound the enclosed work to `seconds` from now (None: no bound). Nested bounds keep
    the earliest deadline."""
    if seconds is None:
        yield
        return
    end = time.perf_counter() + seconds
    outer = _deadline.get()
    token = _deadline.set(end if outer is None else min(outer, end))
    token_limit = _limit.set(seconds if outer is None or end < outer else _limit.get())
    try:
        yield
    finally:
        _deadline.reset(token)
        _limit.reset(token_limit)


@contextlib.contextmanager
def past_deadline(seconds: float):
    """Let short enclosed work run up to `seconds` past the deadline (the watchdog's
    ENFORCE_GRACE_S bounds it anyway): what a run stopped at its limit found, a difference
    seen in simulation, is replayed before the run reports."""
    end = _deadline.get()
    token = _deadline.set(None if end is None else max(end, time.perf_counter() + seconds))
    try:
        yield
    finally:
        _deadline.reset(token)


def time_left() -> float | None:
    """Seconds left before the deadline (None: no deadline; may be negative)."""
    end = _deadline.get()
    return None if end is None else end - time.perf_counter()


# interpreters poll the limits at every block's first op and every CHECK_EVERY + 1 ops after
CHECK_EVERY = 15


# when a poll last stopped each thread (thread id -> perf_counter): the watchdog counts it as
# an interrupt of its own, so the work a stop leads to (the report of how far the proof got,
# freeing its arrays) is not cut short by a second stop that loses the first one's report;
# a stop older than ENFORCE_REFIRE_S matters to no watchdog and is dropped at the next one
_polled_stops: dict[int, float] = {}


def check_time() -> None:
    """Raise OutOfTime when the deadline has passed, OutOfMemoryBudget when the memory limit
    is (cheap: call it in long loops)."""
    end = _deadline.get()
    if end is not None:
        now = time.perf_counter()
        if now > end:
            for thread, at in list(_polled_stops.items()):
                if now - at > ENFORCE_REFIRE_S:  # threads long done (a pool's, a run's)
                    _polled_stops.pop(thread, None)
            _polled_stops[threading.get_ident()] = now
            raise OutOfTime(time_limit_reason())
    check_memory()


def time_limit_reason(detail: str = "") -> str:
    limit = _limit.get()
    what = f"time limit of {limit:g} s reached" if limit is not None else "time limit reached"
    return f"{what}{' ' + detail if detail else ''}"


# -- memory ---------------------------------------------------------------------------------

MEMORY_POLL_SECONDS = 0.02


class OutOfMemoryBudget(TvError):
    """The process's resident memory went over the run's memory limit (verdict unknown)."""

    exit_code = 2


def interrupting(base: type, message: str) -> type:
    """The exception class a watchdog raises in another thread: raised there without
    arguments, so it carries `message` itself; a handler that raises it again with a message
    of its own (`type(e)(...)`: a reason added) gets that one."""

    def init(self, *args) -> None:
        base.__init__(self, *(args or (message,)))

    return type(base.__name__, (base,), {"__init__": init})


class _Aside:
    """MB set aside for a forked child working beside the run (`memory_set_aside`), and how
    to stop it: the run takes its share back when it needs it (the child's work is then
    done in the process, later), rather than end `unknown` beside a child doing checks."""

    def __init__(self, mb: float, stop: Callable[[], None]) -> None:
        self.mb, self.stop, self.taken_back = mb, stop, False

    def take_back(self) -> None:
        if not self.taken_back:
            self.taken_back = True
            self.stop()


@dataclass(frozen=True)
class _Budget:
    mb: float  # what the user allowed the run (in a worker process: its share of it)
    ceiling: float  # resident MB the process may reach: its memory at the start, plus mb
    run_mb: float | None = None  # in a worker process: what the user allowed the whole run
    aside: _Aside | None = None  # MB lowering the ceiling for a child beside, until taken back
    default: bool = False  # no limit was given: mb is the default (`run_memory_budget`)

    def used(self, rss: float) -> float:
        """MB the run has added to the process."""
        return rss - (self.ceiling - self.mb)

    def limit(self) -> float:
        """The ceiling now: raised by the set-aside share once it is taken back."""
        back = self.aside is not None and self.aside.taken_back
        return self.ceiling + (self.aside.mb if back else 0.0)


_budget: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("tv_memory", default=None)
_memory_polled = [0.0]


DEFAULT_MEMORY_SHARE = 0.85  # of the memory available at the start, when no limit is given
# (the watchdog steps in at ENFORCE_MEMORY_SLACK times the limit: still under what was there)


def run_memory_budget(mb: float | None):
    """`memory_budget(mb)` for one run of tv; without a limit (None), `DEFAULT_MEMORY_SHARE`
    of the memory available now (`available_memory_mb`), or no bound where the OS does not
    say."""
    if mb is not None:
        return memory_budget(mb)
    available = available_memory_mb()
    if available is None:
        return memory_budget(None)
    return memory_budget(max(available * DEFAULT_MEMORY_SHARE, 1.0), default=True)


def available_memory_mb() -> float | None:
    """MB this process could still allocate before the machine (or its container's memory
    cgroup) runs out: the kernel's MemAvailable, less for a cgroup limit below it (None
    where the OS says neither)."""
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) / 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    for limit_path, usage_path in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            with open(limit_path) as f:
                limit = f.read().strip()
            with open(usage_path) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2**60:  # "max" / a huge number: no limit
            left = max(int(limit) - usage, 0) / 2**20
            available = left if available is None else min(available, left)
    return available


@contextlib.contextmanager
def memory_budget(mb: float | None, default: bool = False):
    """Let the enclosed work grow the process's resident memory by at most `mb` megabytes
    (2^20 bytes) over what it holds now (None: no bound; nested bounds keep the lower
    ceiling). `default`: no limit was given, and `mb` is what tv chose (the reason for
    stopping says so)."""
    if mb is None:
        yield
        return
    if not mb > 0:
        raise BadInput(f"memory limit must be a positive number of MB, not {mb!r}")
    outer = _budget.get()
    budget = _Budget(mb, rss_mb() + mb, default=default)
    if outer is not None and outer.limit() <= budget.ceiling:
        budget = outer
    token = _budget.set(budget)
    try:
        yield
    finally:
        _budget.reset(token)


@contextlib.contextmanager
def memory_set_aside(mb: float | None, stop: Callable[[], None] | None = None):
    """Lower the enclosed work's memory ceiling by `mb` MB: what a forked child working
    beside it may use (tv_ir.prover.workers.Beside), so the run's limit holds for both.
    With `stop` (which ends the child), work that reaches the lowered ceiling calls it and
    goes on under the whole one."""
    outer = _budget.get()
    if mb is None or outer is None:
        yield
        return
    aside = _Aside(mb, stop) if stop is not None else None
    token = _budget.set(_Budget(outer.mb, outer.limit() - mb, outer.run_mb, aside))
    try:
        yield
    finally:
        _budget.reset(token)


def memory_limit() -> float | None:
    """The MB the current run may add to the process (None: no limit)."""
    budget = _budget.get()
    return None if budget is None else budget.mb


def rss_mb(pid: int | None = None) -> float:
    """A process's resident memory now, in MB (this one's by default; for this one, its
    peak where /proc is not available; for another, 0.0 once it is gone)."""
    if pid is not None:
        try:
            with open(f"/proc/{pid}/statm") as f:
                return int(f.read().split()[1]) * _PAGE_SIZE / 2**20
        except (OSError, ValueError, IndexError):
            return 0.0
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * _PAGE_SIZE / 2**20
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def _page_size() -> int:
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4096


_PAGE_SIZE = _page_size()


def private_mb() -> float:
    """This process's private memory in MB (pages no other process shares: in a forked
    worker, what it allocated and what it copied from its parent on write), or its
    resident memory where /proc does not say."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            private = [ln for ln in f if ln.startswith(("Private_Clean:", "Private_Dirty:"))]
        kb = sum(int(ln.split()[1]) for ln in private)
        return kb / 1024
    except (OSError, ValueError, IndexError):
        return rss_mb()


# what the memory limit measures: resident memory (None), or private memory in a forked
# worker (`worker_memory_budget`), where the pages shared with the parent are the parent's
_meter: list = [None]


def release_freed_memory() -> None:
    """Collect garbage and give memory freed since back to the system (glibc's
    `malloc_trim`): the memory limit is measured as resident memory, which still counts
    what a large phase freed (a localisation walk's tile index: gigabytes) until the
    allocator returns it, and the next check of the limit would stop the run for it."""
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: what is freed is returned as it may be
        pass


def _measured_mb() -> float:
    return _meter[0]() if _meter[0] is not None else rss_mb()


class _PrivateMeter:
    """A forked worker's private memory, cheaply: reading it (`private_mb`, smaps_rollup)
    costs about 25 ms in a 900 MB process, far too slow for every poll, so it is read at
    most every PRIVATE_REFRESH_S (and never more than 1/40 of the time) and resident
    memory's change since then (statm, microseconds) is added to it. Pages copied on write
    since the last read are what it misses."""

    def __init__(self) -> None:
        self.offset, self.read_at, self.period = 0.0, float("-inf"), PRIVATE_REFRESH_S
        self()

    def __call__(self) -> float:
        now = time.perf_counter()
        if now - self.read_at >= self.period:
            private = private_mb()
            cost = time.perf_counter() - now
            self.offset = private - rss_mb()
            self.read_at, self.period = now, max(PRIVATE_REFRESH_S, 40 * cost)
        return rss_mb() + self.offset


PRIVATE_REFRESH_S = 1.0


@contextlib.contextmanager
def worker_memory_budget(share_mb: float | None):
    """In a forked worker process (tv_ir.prover.workers): the memory limit becomes
    `share_mb` MB of the worker's private memory (its share of what the run had left when
    the workers started; None: no limit)."""
    if share_mb is None:
        token = _budget.set(None)
    else:
        outer = _budget.get()
        _meter[0] = _PrivateMeter()
        run_mb = outer.run_mb or outer.mb if outer is not None else None
        default = outer is not None and outer.default
        token = _budget.set(_Budget(share_mb, _measured_mb() + share_mb, run_mb, None, default))
    try:
        yield
    finally:
        _budget.reset(token)


def memory_left_mb() -> float | None:
    """MB left under the memory limit (None: no limit; may be negative)."""
    budget = _budget.get()
    return None if budget is None else budget.limit() - _measured_mb()


def check_memory(force: bool = False) -> None:
    """Raise OutOfMemoryBudget when the run has grown the process's resident memory past
    its limit (polled at most every MEMORY_POLL_SECONDS unless `force`)."""
    budget = _budget.get()
    if budget is None:
        return
    now = time.perf_counter()
    if not force and now - _memory_polled[0] < MEMORY_POLL_SECONDS:
        return
    _memory_polled[0] = now
    rss = _measured_mb()
    if rss > budget.limit() and budget.aside is not None:
        budget.aside.take_back()  # the child beside stops; its checks are made here later
    if rss > budget.limit():
        raise OutOfMemoryBudget(memory_limit_reason(budget.used(rss)))


def physical_memory_mb() -> float | None:
    """The machine's memory in MB (None where the OS does not say)."""
    import os

    try:
        return os.sysconf("SC_PHYS_PAGES") * _PAGE_SIZE / 2**20
    except (ValueError, OSError, AttributeError):
        return None


def refuse_unaffordable(need_mb: float, what: str) -> None:
    """OutOfMemoryBudget (verdict unknown) before work that would need `need_mb` MB: more
    than the memory limit, or than the machine has. A step that allocates gigabytes at once
    runs past the polled limit (or is killed by the OS) before a poll can see it."""
    mb, budget = memory_limit(), _budget.get()
    have = mb if mb is not None else physical_memory_mb()
    if have is not None and need_mb > have:
        kind = "machine's memory" if budget is None else "memory limit"
        if budget is not None and budget.default:
            kind = f"default memory limit ({DEFAULT_MEMORY_SHARE:.0%} of the memory available)"
        raise OutOfMemoryBudget(
            f"{what} would take about {need_mb / 1024:.1f} GB, more than the {kind} of "
            f"{have / 1024:.1f} GB"
        )


def memory_limit_reason(used: float | None = None, detail: str = "") -> str:
    """`used`: the MB the run has added to the process."""
    return _over_budget(_budget.get(), used) + (f" {detail}" if detail else "")


def _over_budget(budget: _Budget | None, used: float | None) -> str:
    """`memory limit of MB reached (...)`, naming the user's limit (in a worker process
    too, with the worker's share), or saying it was the default."""
    if budget is None:
        return "memory limit reached"
    mb = budget.run_mb if budget.run_mb is not None else budget.mb
    said = []
    if budget.default:
        said.append(
            f"the default: {DEFAULT_MEMORY_SHARE:.0%} of the memory available when the run "
            "started; --memory-limit / memory_limit= sets another"
        )
    if used is not None:
        if budget.run_mb is not None:
            said.append(f"a worker process used {used:.0f} MB, its share {budget.mb:.0f} MB")
        else:
            said.append(f"{used:.0f} MB used by this run")
    what = (
        f"memory limit of {mb:.0f} MB reached"
        if budget.default
        else f"memory limit of {mb:g} MB reached"
    )
    return what + (f" ({'; '.join(said)})" if said else "")


# -- enforcement ----------------------------------------------------------------------------

ENFORCE_GRACE_S = 2.0  # past the deadline before the watchdog steps in
ENFORCE_MEMORY_SLACK = 1.10  # times the memory limit before the watchdog steps in
WATCH_INTERVAL_S = 0.1
# an interrupt is sent again while the run goes on: one raised inside a callback the
# interpreter calls on its own (a garbage-collection callback, a finaliser) is printed as
# "Exception ignored" and dropped, and the run would go on unbounded
ENFORCE_REFIRE_S = 10.0


@contextlib.contextmanager
def enforced_limits():
    """Make the current time and memory limits hold in the enclosed work even where no poll
    is reached (see the module docstring): a watchdog raises the limit's error in this
    thread."""
    end, budget = _deadline.get(), _budget.get()
    if end is None and budget is None:
        yield
        return
    target = threading.get_ident()
    lock = threading.Lock()
    armed = [True]
    stop = threading.Event()
    dropped = threading.Event()  # an interrupt landed where Python drops exceptions
    sent: set[type] = set()  # the classes this watchdog raised
    previous_hook = sys.unraisablehook

    def unraisable(u) -> None:
        if type(u.exc_value) in sent:
            dropped.set()  # not printed: the watchdog sends it again
            return
        previous_hook(u)

    limit_reason = time_limit_reason()  # this thread's context: the limit as the user gave it

    def interrupt(base: type, message: str) -> None:
        raised = interrupting(base, message)
        sent.add(raised)
        with lock:  # never once the run has ended (the `finally` below disarms under it)
            if armed[0]:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(target), ctypes.py_object(raised)
                )

    def watch() -> None:
        fired = None  # when the last interrupt was sent (or a poll stopped the run)
        while not stop.wait(WATCH_INTERVAL_S):
            now = time.perf_counter()
            polled = _polled_stops.get(target)
            if polled is not None and end is not None and polled > end:
                fired = polled if fired is None else max(fired, polled)
            if fired is not None and now - fired < ENFORCE_REFIRE_S and not dropped.is_set():
                continue
            dropped.clear()
            if _importing(target):
                continue  # wait: an exception inside an extension module's import crashes
            if end is not None and now > end + ENFORCE_GRACE_S:
                interrupt(OutOfTime, limit_reason)
                fired = now
                continue
            used = budget.used(_measured_mb()) if budget is not None else 0.0
            if budget is not None and used > budget.mb * ENFORCE_MEMORY_SLACK:
                interrupt(OutOfMemoryBudget, _over_budget(budget, used))
                fired = now

    watcher = threading.Thread(target=watch, name="tv-limits", daemon=True)
    try:
        watcher.start()
    except RuntimeError:
        # no thread to be had (an address-space cap, `ulimit -v`, a process at its thread
        # limit): the limits hold where tv polls them, as they do without a watchdog
        yield
        return
    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        # an interrupt the watchdog sent but this thread has not raised yet must not escape
        # the run: it is raised here (at the loop's first jump back at the latest) and
        # dropped. Not cleared with `PyThreadState_SetAsyncExc(id, NULL)`: under a trace or
        # profile function (coverage, a debugger, cProfile) CPython 3.11 then never runs
        # this thread's next statement
        try:
            with lock:
                armed[0] = False
            for _ in range(64 if sent else 0):
                pass
        except tuple(sent):
            pass
        stop.set()
        if sys.unraisablehook is unraisable:
            sys.unraisablehook = previous_hook


def _importing(thread_id: int) -> bool:
    """Whether the thread is importing a module (an asynchronous exception raised while a
    compiled extension such as jaxlib's MLIR bindings initialises ends the process with a
    segmentation fault).

    Read from the import system's module locks, which a thread holds (or waits for) for the
    whole of a module's load, not from the thread's frames: walking another thread's live
    frames (`sys._current_frames()` then `f_back`) while it runs crashed the process itself
    under CPython 3.11."""
    if thread_id in import_system._blocking_on:
        return True
    for ref in list(import_system._module_locks.values()):
        lock = ref()
        if lock is not None and getattr(lock, "owner", None) == thread_id:
            return True
    return False


# -- depth ----------------------------------------------------------------------------------

RECURSION_LIMIT = 60_000
STACK_BYTES = 1 << 30  # virtual; only the pages a deep walk touches are used

_deep = threading.local()


class TooDeep(TvError):
    """The program nests more deeply than tv's walks can follow (verdict unknown)."""

    exit_code = 2


def too_deep_reason() -> str:
    return (
        "the program nests too deeply for tv (more than Python's recursion limit of "
        f"{RECURSION_LIMIT:,} frames while walking it)"
    )


# a check allocates millions of small objects (terms, arrays of them) that live until it
# ends, few of them in reference cycles: Python's collector, run every 700 allocations by
# default, spent a sixth of the 32-layer Llama step scanning them (6.4 -> 5.4 s without
# it). Collected every 50,000 instead while a check runs; the same peak memory. What exists
# when a check begins (jax, the modules) is frozen out of the collector's scans until it
# ends (`gc.freeze`): a full collection of the 32-layer step scanned it all again, 0.2 s.
GC_YOUNG_THRESHOLD = 50_000


def run_deep(fn, *args, **kwargs):
    """`fn(*args, **kwargs)` on a thread with a large stack and a high recursion limit
    (directly when already on one); its exceptions are re-raised here."""
    if getattr(_deep, "active", False):
        return fn(*args, **kwargs)
    box: dict = {}
    ctx = contextvars.copy_context()

    def work():
        _deep.active = True
        try:
            box["result"] = ctx.run(fn, *args, **kwargs)
        except BaseException as e:  # re-raised on the caller's thread
            box["error"] = e

    old_limit, old_stack = sys.getrecursionlimit(), threading.stack_size()
    sys.setrecursionlimit(max(old_limit, RECURSION_LIMIT))
    old_gc = gc.get_threshold()
    gc.set_threshold(max(old_gc[0], GC_YOUNG_THRESHOLD), *old_gc[1:])
    gc.freeze()
    t = None
    try:
        threading.stack_size(STACK_BYTES)
        t = threading.Thread(target=work, name="tv", daemon=True)
        t.start()
        threading.stack_size(old_stack)
        while t.is_alive():
            t.join(0.2)  # short waits: Ctrl-C still reaches the main thread
    finally:
        threading.stack_size(old_stack)
        if t is None or not t.is_alive():  # the limit is global: the main thread's stack is small
            sys.setrecursionlimit(old_limit)
            gc.set_threshold(*old_gc)
            gc.unfreeze()
    if "error" in box:
        e = box["error"]
        if isinstance(e, RecursionError):
            raise TooDeep(too_deep_reason()) from None
        raise e
    return box["result"]
