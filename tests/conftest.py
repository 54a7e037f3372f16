"""Test-session set-up: 16 host CPU devices for XLA, set before jax is first imported (the
Shardy corpus has 16-device meshes)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=16".strip()

# tests import helpers from their own folder (xla_oracle, programs)
sys.path.insert(0, str(Path(__file__).resolve().parent))
