"""Run a bench script's worker in a fresh child process: its last stdout line as JSON, its
peak resident memory (`ru_maxrss` from `os.wait4`, so it includes the interpreter and
jaxlib), killed after a timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading


def run_worker(
    script: str, args: list[str], timeout: float, env: dict | None = None
) -> tuple[dict | None, float, int, list[str]]:
    """`python SCRIPT --worker ARGS`: (its JSON or None, peak MB, exit status, the last
    line of its stderr)."""
    err = tempfile.TemporaryFile()
    p = subprocess.Popen(
        [sys.executable, script, "--worker", *args], stdout=subprocess.PIPE, stderr=err, env=env
    )
    killer = threading.Timer(timeout, p.kill)
    killer.start()
    try:
        out = p.stdout.read()
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
    finally:
        killer.cancel()
    peak = usage.ru_maxrss / 1024  # kilobytes on Linux
    try:
        return json.loads(out.decode().strip().splitlines()[-1]), peak, p.returncode, []
    except (ValueError, IndexError):
        err.seek(0)
        tail = err.read().decode(errors="replace").strip().splitlines()[-1:]
        return None, peak, p.returncode, tail
