"""torch_xla front end: verify PyTorch programs sharded with torch_xla SPMD.

    from tv_ir.frontends.torch_xla import verify, TrainStep
    report = verify(model, x, mesh=mesh, shardings={"l1.weight": ("model", None)})

torch and torch_xla are the optional `tv-ir[torch]` extra, imported only when a program is
captured. Importing this module sets torch_xla's CPU runtime (PJRT_DEVICE=CPU, 8 devices)
and its source-line metadata (XLA_HLO_DEBUG) unless already set, and asks XLA (jax) for 8
host CPU devices; import it before torch_xla starts.
"""

from tv_ir.report.result import Report
from tv_ir.xla.partitioner import ensure_host_devices

from . import runtime

runtime.configure_env()
ensure_host_devices()

from .export import Exported, export  # noqa: E402
from .step import TrainStep  # noqa: E402
from .verify import check_exported, verify  # noqa: E402

__all__ = ["Exported", "Report", "TrainStep", "check_exported", "export", "verify"]
