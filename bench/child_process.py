"""Run a bench script's worker in a fresh child process: its last JSON line on stdout, its
peak resident memory (`ru_maxrss` from `os.wait4`, so it includes the interpreter and
jaxlib), killed past a wall-clock timeout or a resident-memory limit (tv's own limits are
polled between steps; XLA and a single long step are not)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from tv_ir.limits import rss_mb


@dataclasses.dataclass
class Child:
    """What a worker left: `result` its last JSON line (None without one), `killed` why it
    was stopped ("" when it ended by itself)."""

    result: dict | None
    peak_mb: float
    returncode: int
    stderr: str
    killed: str = ""

    def tail(self, lines: int = 1) -> str:
        """The last lines of its stderr, on one line."""
        return " ".join(self.stderr.strip().splitlines()[-lines:])


def run_worker(
    script: str,
    args: list[str],
    timeout: float,
    env: dict | None = None,
    rss_limit_mb: float | None = None,
    dump_stacks: bool = False,
) -> Child:
    """`python SCRIPT --worker ARGS`, watched. With `dump_stacks` the child is sent SIGUSR1
    a second before it is killed (a worker that registers `faulthandler` on it prints
    where it was)."""
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    p = subprocess.Popen(
        [sys.executable, script, "--worker", *args], stdout=out, stderr=err, env=env
    )
    killed: list[str] = []
    reaped = threading.Event()  # set once wait4 has the child: polling it here would reap it

    def watch() -> None:
        t0 = time.monotonic()
        while not reaped.wait(0.2):
            elapsed = time.monotonic() - t0
            if elapsed > timeout:
                killed.append(f"timeout ({timeout:.0f} s)")
            elif rss_limit_mb is not None and rss_mb(p.pid) > rss_limit_mb:
                killed.append(f"{rss_limit_mb:.0f} MB resident at {elapsed:.0f} s")
            if killed:
                if dump_stacks:
                    p.send_signal(signal.SIGUSR1)
                    time.sleep(1.0)
                p.kill()
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    _, status, usage = os.wait4(p.pid, 0)
    reaped.set()
    p.returncode = os.waitstatus_to_exitcode(status)
    watcher.join()
    out.seek(0)
    err.seek(0)
    lines = [ln for ln in out.read().decode(errors="replace").splitlines() if ln.startswith("{")]
    result = None
    if lines:
        try:
            result = json.loads(lines[-1])
        except ValueError:
            result = None
    stderr = err.read().decode(errors="replace")
    peak = usage.ru_maxrss / 1024  # kilobytes on Linux
    return Child(result, peak, p.returncode, stderr, killed[0] if killed else "")
