"""JAX front end: hand tv a function and example arguments, get a report.

    from tv_ir.frontends.jax import verify, assert_equivalent
    report = verify(sharded_step, params, batch, spec=train_step)

Importing this module asks XLA for 8 host CPU devices (only effective before JAX creates
its CPU backend), so meshes of up to 8 devices work on a laptop, and registers tv's own
files with JAX as not user code (so ops traced through `verify` carry the user's lines).
"""

from tv_ir.ir.sources import register_with_jax
from tv_ir.xla.partitioner import ensure_host_devices

ensure_host_devices()
register_with_jax()  # tv's frames are not the user's: JAX records the user's line for ops

from tv_ir.report.result import Report  # noqa: E402

from .testing import NotEquivalentError, assert_equivalent  # noqa: E402
from .verify import verify  # noqa: E402

__all__ = ["NotEquivalentError", "Report", "assert_equivalent", "ensure_host_devices", "verify"]
