"""How busy this process's cores are with other work, measured since the current check began.

Whether a forked child or a pool gains anything depends on a core being idle now. The
1-minute load average answers late: a job that stopped seconds ago (another benchmark row,
XLA's compile of the previous program) still counts, and one that started seconds ago does
not yet. Instead, the CPU time spent on this process's cores (`/proc/stat`, only the cores
in its affinity set) since `start_window()`, less this process's own CPU time, over the
wall time since then, is the number of cores other work kept busy in that window. Where
`/proc/stat` cannot be read, or the window is too short to measure, the load average
stands in.
"""

from __future__ import annotations

import os
import time

# a window shorter than this says little: /proc/stat counts in 10 ms ticks
MIN_WINDOW_S = 0.25

_window: tuple[float, float, float] | None = None  # (wall, own CPU s, cores' busy s)


def _cores_busy_s() -> float | None:
    """CPU seconds the cores this process may run on have spent busy since boot."""
    try:
        allowed = os.sched_getaffinity(0)
        hz = os.sysconf("SC_CLK_TCK")
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except (AttributeError, OSError, ValueError):
        return None
    busy = 0
    seen = False
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        if int(name[3:]) not in allowed:
            continue
        ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
        busy += sum(ticks) - ticks[3] - ticks[4]
        seen = True
    return busy / hz if seen else None


def start_window() -> None:
    """Measure from now on (the start of a check)."""
    global _window
    busy = _cores_busy_s()
    _window = None if busy is None else (time.perf_counter(), time.process_time(), busy)


def busy_elsewhere() -> float | None:
    """Cores kept busy by other processes since `start_window()` (None: not measurable)."""
    if _window is None:
        return None
    wall0, own0, busy0 = _window
    wall = time.perf_counter() - wall0
    busy = _cores_busy_s()
    if busy is None or wall < MIN_WINDOW_S:
        return None
    others = (busy - busy0) - (time.process_time() - own0)
    return max(0.0, others / wall)


def load() -> float | None:
    """Runnable work on this process's cores, counting this process as one: the other
    processes' share of the window plus 1, else the 1-minute load average (None: neither
    is known)."""
    others = busy_elsewhere()
    if others is not None:
        return others + 1.0
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
