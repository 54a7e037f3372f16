"""JAX front end: hand tv a function and example arguments, get a report.

    from tv_ir.frontends.jax import verify, assert_equivalent
    report = verify(sharded_step, params, batch, spec=train_step)

Importing this module asks XLA for 8 host CPU devices and for full constants in its HLO
dumps (both only effective before JAX creates its CPU backend), so meshes of up to 8
devices work on a laptop.
"""

import os

from tv_ir.partitioner import ensure_host_devices

ensure_host_devices()
# tv reads XLA's per-device program from its HLO dump, which elides constants with more
# than a few elements (`constant({...})`) unless asked: the causal mask of an attention
# layer would be lost. (Core fix: the same option in tv_ir/partitioner.py.)
if "xla_dump_large_constants" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_dump_large_constants=true"
    ).strip()

from tv_ir.report import Report  # noqa: E402

from .testing import NotEquivalentError, assert_equivalent  # noqa: E402
from .verify import verify  # noqa: E402

__all__ = ["NotEquivalentError", "Report", "assert_equivalent", "ensure_host_devices", "verify"]
