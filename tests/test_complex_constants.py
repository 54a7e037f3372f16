"""Complex-valued constants (XLA's partitioned FFTs carry them; jnp writes `1j`) are read
from their printed form, since jaxlib's bindings cannot hand the attribute out."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import tv_ir
from tv_ir.semantics.interpreters.interp import evaluate

SPEC = """
func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {
  %c = stablehlo.constant dense<[(1.0, 2.0), (3.0, -4.5)]> : tensor<2xcomplex<f32>>
  %r = stablehlo.imag %c : (tensor<2xcomplex<f32>>) -> tensor<2xf32>
  %0 = stablehlo.add %x, %r : tensor<2xf32>
  return %0 : tensor<2xf32>
}
"""

IMPL = """
func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {
  %c = stablehlo.constant dense<[IMAG]> : tensor<2xf32>
  %0 = stablehlo.add %c, %x : tensor<2xf32>
  return %0 : tensor<2xf32>
}
"""


@pytest.mark.parametrize(("imag", "code"), [("2.0, -4.5", 0), ("1.0, -4.5", 1)])
def test_complex_constant_is_read(tmp_path, imag: str, code: int) -> None:
    (tmp_path / "spec.mlir").write_text(SPEC)
    (tmp_path / "impl.mlir").write_text(IMPL.replace("IMAG", imag))
    r = subprocess.run(
        [sys.executable, "-m", "tv_ir.cli", "check", "spec.mlir", "impl.mlir"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == code, r.stdout + r.stderr


NAN_1 = complex(np.nan, 1)


@pytest.mark.parametrize(
    ("literal", "dtype", "expected"),
    [
        ("dense<(1.5, -2.0)>", "complex<f64>", [1.5 - 2j] * 3),  # a splat
        ('dense<"0x0000C03F000000C00000803F00000000">', "complex<f32>", None),  # hex blob
        (
            "dense<[(0x7FC00000, 1.0), (0x7F800000, -0.0)]>",
            "complex<f32>",
            [complex(np.nan, 1), np.inf],
        ),
    ],
)
def test_complex_constant_forms(literal: str, dtype: str, expected) -> None:
    n = 3 if expected is not None and len(expected) == 3 else 2
    text = (
        f"func.func @main() -> tensor<{n}x{dtype}> {{\n"
        f"  %c = stablehlo.constant {literal} : tensor<{n}x{dtype}>\n"
        f"  return %c : tensor<{n}x{dtype}>\n}}\n"
    )
    (got,) = evaluate(tv_ir.load(text), [])
    if expected is None:  # (1.5, -2.0), (1.0, 0.0) as little-endian f32 pairs
        expected = [1.5 - 2j, 1 + 0j]
    np.testing.assert_array_equal(got, np.array(expected, dtype=np.complex128))
