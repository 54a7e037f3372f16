"""A complex-valued constant (XLA's partitioned FFTs carry them) is unsupported (exit 2,
named), not an internal error: jaxlib's bindings cannot hand the attribute out."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {
  %c = stablehlo.constant dense<[(1.0, 2.0), (3.0, 4.0)]> : tensor<2xcomplex<f32>>
  %r = stablehlo.real %c : (tensor<2xcomplex<f32>>) -> tensor<2xf32>
  %0 = stablehlo.add %x, %r : tensor<2xf32>
  return %0 : tensor<2xf32>
}
"""


def test_complex_constant_is_unknown_not_an_internal_error(tmp_path) -> None:
    (tmp_path / "p.mlir").write_text(PROGRAM)
    r = subprocess.run(
        [sys.executable, "-m", "tv_ir.cli", "check", "p.mlir", "p.mlir"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "complex" in r.stderr + r.stdout
