"""Capture a torch_xla program (and its spec) as StableHLO modules tv can check, and write
them to files for `tv check` / `tv partition`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tv_ir.errors import BadInput

from .capture import capture
from .rewrite import Program, build, signature


@dataclass
class Exported:
    impl: Program  # the annotated (pre-partition) program: mhlo.sharding on its arguments
    spec: Program | None  # the reference, unsharded, arguments in the impl's order

    def write(self, directory: str | Path, stem: str = "model") -> dict[str, Path]:
        """Write `<stem>.impl.mlir` (and `<stem>.spec.mlir`); return the paths."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        paths = {"impl": d / f"{stem}.impl.mlir"}
        paths["impl"].write_text(self.impl.text)
        if self.spec is not None:
            paths["spec"] = d / f"{stem}.spec.mlir"
            paths["spec"].write_text(self.spec.text)
        return paths


def export(
    model_or_fn: Any,
    *example_args: Any,
    mesh: Any = None,
    shardings: dict | None = None,
    input_shardings: Any = None,
    spec: Any = None,
) -> Exported:
    """Capture the sharded program and, with `spec=`, the reference (unsharded) program."""
    impl = build(
        capture(
            model_or_fn,
            example_args,
            mesh=mesh,
            shardings=shardings,
            input_shardings=input_shardings,
        )
    )
    if spec is None:
        return Exported(impl, None)
    ref_cap = capture(spec, example_args)
    ref_cap.num_devices = 1
    if ref_cap.outputs != impl.outputs:
        raise BadInput(
            f"spec and implementation return different outputs: {ref_cap.outputs} vs {impl.outputs}"
        )
    ref = build(ref_cap, order=signature(impl.text))
    return Exported(impl, ref)
