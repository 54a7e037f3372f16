"""table-differences: `A[partition_id] - B[partition_id]` of two integer tables is one table,
`(A - B)[partition_id]`, so that mesh reduction reads a tile start XLA writes as such a
difference (a jit pipeline's backward: (4 x fsdp + 2 x data) - 4 x fsdp)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from tv_ir.passes import table_differences

from tv_ir.ir.importer import load

BENCH = Path(__file__).resolve().parents[1] / "bench"

PROGRAM = """
func.func @main(%x: tensor<8xf32>) -> (tensor<2xf32>, tensor<i32>) {
  %a = stablehlo.constant dense<[0, 4, 2, 6]> : tensor<4xi32>
  %b = stablehlo.constant dense<[0, 4, 0, 4]> : tensor<4xi32>
  %p = stablehlo.partition_id : tensor<ui32>
  %sa = stablehlo.dynamic_slice %a, %p, sizes = [1] : (tensor<4xi32>, tensor<ui32>) -> tensor<1xi32>
  %ra = stablehlo.reshape %sa : (tensor<1xi32>) -> tensor<i32>
  %sb = stablehlo.dynamic_slice %b, %p, sizes = [1] : (tensor<4xi32>, tensor<ui32>) -> tensor<1xi32>
  %rb = stablehlo.reshape %sb : (tensor<1xi32>) -> tensor<i32>
  %s = stablehlo.subtract %ra, %rb : tensor<i32>
  %y = stablehlo.dynamic_slice %x, %s, sizes = [2] : (tensor<8xf32>, tensor<i32>) -> tensor<2xf32>
  return %y, %OTHER : tensor<2xf32>, tensor<i32>
}
"""


def ops(module) -> list:
    return module.main.body.ops


def test_the_difference_of_two_tables_is_one_table() -> None:
    m = table_differences.run(load(PROGRAM.replace("%OTHER", "%s")))
    names = [op.name.split(".")[1] for op in ops(m)]
    # B's look-up is gone, A's table holds the difference, the subtraction reads it
    assert names.count("constant") == 1, names
    assert "subtract" not in names, names
    table = next(op for op in ops(m) if op.name == "stablehlo.constant").attrs["value"]
    assert table.tolist() == [0, 0, 2, 2]
    start = m.main.body.results[1].owner
    assert start.name == "stablehlo.reshape", start
    # every device reads the same start as before
    for pid, want in enumerate([0, 0, 2, 2]):
        assert int(table[pid]) == [0, 4, 2, 6][pid] - [0, 4, 0, 4][pid] == want


def test_a_table_read_elsewhere_is_left_alone() -> None:
    m = table_differences.run(load(PROGRAM.replace("%OTHER", "%ra")))
    tables = [op.attrs["value"].tolist() for op in ops(m) if op.name == "stablehlo.constant"]
    assert tables == [[0, 4, 2, 6], [0, 4, 0, 4]]
    assert any(op.name == "stablehlo.subtract" for op in ops(m))


def test_the_jit_pipeline_shrinks_its_fsdp_axis() -> None:
    """XLA's partitioning of the AdamW Llama step pipelined under jit on 2 x 4 x 2 x 4
    (data x fsdp x stage x model; in a child with 64 host devices, as the bench runs it):
    "fsdp" kept its 4 devices ("its position times 2 is used"), 32 devices were simulated."""
    r = subprocess.run(
        [
            sys.executable, str(BENCH / "jit_mesh_scale.py"), "--step", "llama-pipeline",
            "--meshes", "2x4x2x4", "--no-xla",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    row = next(ln.split() for ln in r.stdout.splitlines() if ln.strip().startswith("2x4x2x4"))
    assert row[1:4] == ["64", "16", "equivalent"], r.stdout
    assert np.isfinite(float(row[4]))
