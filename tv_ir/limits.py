"""The limits a run of tv works within, in one place each: program size, wall-clock time,
and nesting depth.

- **Size** (`refuse_oversized`): a tensor of more than `MAX_TENSOR_ELEMENTS` elements is
  refused up front as bad input (exit 3), naming the value; tv evaluates programs on
  concrete float64 arrays, so such a tensor could not even be simulated. This is the one
  check to relax when tv learns to reduce shapes.
- **Time** (`deadline`, `check_time`): `--time-limit S` bounds the whole run (import, loop
  unrolling, simulation, proof). Long loops check the clock and raise `OutOfTime`, which
  the pipeline turns into the verdict `unknown`.
- **Depth** (`run_deep`): programs nest (regions in regions, loops unrolled thousands of
  times, terms built from terms) and tv's walks over them recurse; they run on a thread
  with a large stack and a high recursion limit, so depth is bounded by
  `RECURSION_LIMIT` rather than by Python's default of 1000. A program deeper than that
  gets the verdict `unknown` (`TooDeep`), never a RecursionError.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import time

import numpy as np

from .errors import BadInput, TvError

# -- size -----------------------------------------------------------------------------------

MAX_TENSOR_ELEMENTS = 2**31


def refuse_oversized(module, name: str) -> None:
    """BadInput naming the first value of `module` with more than MAX_TENSOR_ELEMENTS
    elements (arguments first, then results, then values computed inside)."""
    for fn in module.functions.values():
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


def time_left() -> float | None:
    """Seconds left before the deadline (None: no deadline; may be negative)."""
    end = _deadline.get()
    return None if end is None else end - time.perf_counter()


def check_time() -> None:
    """Raise OutOfTime when the deadline has passed (cheap: call it in long loops)."""
    end = _deadline.get()
    if end is not None and time.perf_counter() > end:
        raise OutOfTime(time_limit_reason())


def time_limit_reason(detail: str = "") -> str:
    limit = _limit.get()
    what = f"time limit of {limit:g} s reached" if limit is not None else "time limit reached"
    return f"{what}{' ' + detail if detail else ''}"


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
    if "error" in box:
        e = box["error"]
        if isinstance(e, RecursionError):
            raise TooDeep(too_deep_reason()) from None
        raise e
    return box["result"]
