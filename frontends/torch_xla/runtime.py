"""torch / torch_xla on demand: the optional extra, its CPU SPMD runtime and XLA flags.

Nothing here imports torch at module import time; `require()` does, with a one-line error
when the `tv-ir[torch]` extra is not installed.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

from tv_ir.errors import BadInput

DEFAULT_DEVICES = 8
INSTALL_HINT = "pip install 'tv-ir[torch]' (torch==2.9.0, torch_xla==2.9.0)"


def configure_env(devices: int = DEFAULT_DEVICES) -> None:
    """Environment torch_xla reads when it starts (effective before its runtime starts):
    CPU PJRT with `devices` devices unless the user chose a device, and op metadata with
    Python source lines (XLA_HLO_DEBUG / XLA_IR_DEBUG) so reports can name user lines."""
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    os.environ.setdefault("CPU_NUM_DEVICES", str(devices))
    os.environ.setdefault("XLA_IR_DEBUG", "1")
    os.environ.setdefault("XLA_HLO_DEBUG", "1")


def require() -> SimpleNamespace:
    """Import torch and torch_xla (SPMD mode on); BadInput naming the extra if missing."""
    configure_env()
    try:
        import torch
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr
    except ImportError as e:
        raise BadInput(
            f"the torch_xla front end needs torch and torch_xla ({e.name or e}): {INSTALL_HINT}"
        ) from None
    if not xr.is_spmd():
        xr.use_spmd()
    return SimpleNamespace(torch=torch, torch_xla=torch_xla, xm=xm, xs=xs, xr=xr)


def sources_enabled() -> bool:
    """Whether torch_xla records Python source lines in its op metadata."""
    return os.environ.get("XLA_HLO_DEBUG", "0") not in ("", "0", "false", "False")
