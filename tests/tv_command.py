"""The `tv` command as the tests run it: `python -m tv_ir.cli ARGS` in a child process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def tv(*args: str, cwd: Path | None = None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tv_ir.cli", *args], capture_output=True, text=True, cwd=cwd, env=env
    )
