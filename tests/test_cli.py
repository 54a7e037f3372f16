"""The `tv` command: exit codes, one-line errors for bad input, JSON output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tv_command import tv

ADD = """func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = stablehlo.add %a, %a : tensor<2xf32>
  return %0 : tensor<2xf32>
}
"""
TWICE = """func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
  %c = stablehlo.constant dense<2.0> : tensor<2xf32>
  %0 = stablehlo.multiply %c, %a : tensor<2xf32>
  return %0 : tensor<2xf32>
}
"""
THRICE = TWICE.replace("dense<2.0>", "dense<3.0>")
OTHER_SHAPE = """func.func @main(%a: tensor<3xf32>) -> tensor<3xf32> {
  return %a : tensor<3xf32>
}
"""
CUSTOM = """func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = stablehlo.custom_call @my_kernel(%a) : (tensor<2xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}
"""


@pytest.fixture
def files(tmp_path: Path) -> Path:
    for name, text in [
        ("add.mlir", ADD),
        ("twice.mlir", TWICE),
        ("thrice.mlir", THRICE),
        ("other.mlir", OTHER_SHAPE),
        ("custom.mlir", CUSTOM),
    ]:
        (tmp_path / name).write_text(text)
    (tmp_path / "empty.mlir").write_text("")
    (tmp_path / "malformed.mlir").write_text("func.func @main( garbage")
    (tmp_path / "binary.mlir").write_bytes(bytes(range(256)) * 4)
    return tmp_path


def test_equivalent_exits_0(files: Path) -> None:
    r = tv("check", "add.mlir", "twice.mlir", cwd=files)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("EQUIVALENT")


def test_not_equivalent_exits_1_with_json_counterexample(files: Path) -> None:
    r = tv("check", "add.mlir", "thrice.mlir", "--json", cwd=files)
    assert r.returncode == 1, r.stderr
    d = json.loads(r.stdout)
    assert d["verdict"] == "not_equivalent"
    ce = d["counterexample"]
    a = ce["inputs"]["a"] if "a" in ce["inputs"] else next(iter(ce["inputs"].values()))
    i = ce["index"][0]
    assert ce["expected"] == pytest.approx(2 * a[i]) and ce["actual"] == pytest.approx(3 * a[i])
    assert d["location"]["impl"]["op"] == "stablehlo.multiply"


@pytest.mark.parametrize(
    "spec, impl, message",
    [
        ("missing.mlir", "add.mlir", "no such file"),
        ("empty.mlir", "add.mlir", "empty"),
        ("malformed.mlir", "add.mlir", "malformed IR"),
        ("binary.mlir", "add.mlir", "binary"),
        ("add.mlir", "other.mlir", "signatures differ"),
        (".", "add.mlir", "directory"),
    ],
)
def test_bad_input_is_one_line_exit_3(files: Path, spec: str, impl: str, message: str) -> None:
    r = tv("check", spec, impl, cwd=files)
    assert r.returncode == 3
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_usage_mistake_exits_3(files: Path) -> None:
    r = tv("check", "add.mlir", cwd=files)
    assert r.returncode == 3 and "Traceback" not in r.stderr


def test_unsupported_op_is_unknown_exit_2_naming_the_op(files: Path) -> None:
    r = tv("check", "add.mlir", "custom.mlir", "--json", cwd=files)
    assert r.returncode == 2
    d = json.loads(r.stdout)
    assert d["verdict"] == "unknown"
    assert d["unsupported"] == ["stablehlo.custom_call @my_kernel"]


SHARDED_NEGATE = """
sdy.mesh @mesh = <["x"=4]>
func.func @main(%arg0: tensor<8x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>})
    -> (tensor<8x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}) {
  %0 = stablehlo.negate %arg0
      {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"x"}, {}]>]>} : tensor<8x2xf32>
  %1 = sdy.reshard %0 <@mesh, [{}, {}]> : tensor<8x2xf32>
  return %1 : tensor<8x2xf32>
}
func.func @identity(%arg0: tensor<8x2xf32>) -> tensor<8x2xf32> {
  return %arg0 : tensor<8x2xf32>
}
"""


def test_partition_with_shardy_passes(tmp_path):
    m = tmp_path / "sharded.mlir"
    m.write_text(SHARDED_NEGATE)
    ok = tv("partition", "--shardy", "partitioner", "--function", "main", str(m))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "Shardy's partitioner passes on @main" in ok.stdout and "(4 devices)" in ok.stdout
    wrong = tv("partition", "--shardy", "partitioner", "--spec", f"{m}@identity", str(m))
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    assert f"stablehlo.negate at {m}:5" in wrong.stdout  # the sharded module's own line
    for bad in (["--function", "nope"], ["--shardy", "nope"]):
        r = tv(
            "partition",
            *(["--shardy", "partitioner"] if bad[0] != "--shardy" else []),
            *bad,
            str(m),
        )
        assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
    r = tv("partition", "--function", "main", str(m))
    assert r.returncode == 3 and "need --shardy" in r.stderr


A2A_EMPTY_GROUPS = """
module attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @main(%arg0: tensor<4x4xf32>) -> tensor<4x4xf32> {
    %0 = "stablehlo.all_to_all"(%arg0) {split_dimension = 0 : i64, concat_dimension = 0 : i64,
      split_count = 2 : i64, replica_groups = dense<> : tensor<0x0xi64>}
      : (tensor<4x4xf32>) -> tensor<4x4xf32>
    return %0 : tensor<4x4xf32>
  }
}
"""


def test_input_that_crashes_jaxlibs_verifier_is_refused(tmp_path):
    m = tmp_path / "a2a.mlir"
    m.write_text(A2A_EMPTY_GROUPS)
    r = tv("check", str(m), str(m))
    assert r.returncode == 3 and "empty replica_groups" in r.stderr, (r.returncode, r.stderr)


def test_time_limit_bounds_the_whole_proof(files: Path) -> None:
    from importlib import resources

    examples = resources.files("tv_ir") / "examples"
    spec, impl = str(examples / "block_spec.mlir"), str(examples / "block_fused_qkv.mlir")
    r = tv("check", "--time-limit", "0.001", "--json", spec, impl)
    assert r.returncode == 2, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["verdict"] == "unknown" and "time limit of 0.001 s" in out["reason"]
    # the limit covers the whole run (import and simulation too), refutations included
    r = tv("check", "--time-limit", "0.001", "twice.mlir", "thrice.mlir", cwd=files)
    assert r.returncode == 2 and "time limit of 0.001 s" in r.stdout, r.stdout + r.stderr
    r = tv("check", "--time-limit", "60", "twice.mlir", "thrice.mlir", cwd=files)
    assert r.returncode == 1, r.stdout + r.stderr
    assert tv("check", "--time-limit", "60", spec, impl).returncode == 0
