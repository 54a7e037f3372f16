"""Per-device programs as XLA emits them: where their layouts and device count come from.

The module's own `mhlo.sharding`s and XLA's `mhlo.spmd_parameters_shardings` /
`mhlo.spmd_output_sharding` (no `mhlo.num_partitions`: jaxlib's conversion drops it), the
pre-partition module given as spec (`tv check BEFORE AFTER`), or the caller's
`--num-partitions` / `--in-shardings` / `--out-shardings`; nothing guessed
(`tv_ir.prover.boundary_layouts`).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import tv_ir
from tv_ir.errors import BadInput
from tv_ir.prover.boundary_layouts import GivenLayouts

SPEC = """
func.func @main(%x: tensor<4x2xf32>) -> tensor<4x2xf32> {
  %0 = stablehlo.add %x, %x : tensor<4x2xf32>
  return %0 : tensor<4x2xf32>
}
"""


def per_device(attrs: str, body: str, results: str, args: str = "%x: tensor<2x2xf32>") -> str:
    return f"""
module @m attributes {{{attrs}}} {{
  func.func @main({args}) -> ({results}) {{
{body}
  }}
}}
"""


TILED = '"{devices=[2,1]0,1}"'
DOUBLE = """    %0 = stablehlo.add %x, %x : tensor<2x2xf32>
    return %0 : tensor<2x2xf32>"""


def test_spmd_module_attributes_give_the_layouts_and_device_count() -> None:
    impl = per_device(
        f"mhlo.spmd_parameters_shardings = [{TILED}], mhlo.spmd_output_sharding = {TILED}",
        DOUBLE,
        "tensor<2x2xf32>",
    )
    r = tv_ir.check(SPEC, impl)
    assert r.verdict == "equivalent", r.reason


def test_a_wrong_spmd_output_sharding_is_refuted() -> None:
    impl = per_device(
        f"mhlo.spmd_parameters_shardings = [{TILED}], "
        'mhlo.spmd_output_sharding = "{devices=[2,1]1,0}"',
        DOUBLE,
        "tensor<2x2xf32>",
    )
    r = tv_ir.check(SPEC, impl)
    assert r.verdict == "not_equivalent"


def test_tuple_output_sharding_gives_each_result_its_layout() -> None:
    spec = """
func.func @main(%x: tensor<4x2xf32>) -> (tensor<4x2xf32>, tensor<4x2xf32>) {
  %0 = stablehlo.add %x, %x : tensor<4x2xf32>
  return %0, %x : tensor<4x2xf32>, tensor<4x2xf32>
}
"""
    body = """    %0 = stablehlo.add %x, %x : tensor<2x2xf32>
    %g = "stablehlo.all_gather"(%x) {all_gather_dim = 0 : i64,
      replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>,
      channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>,
      use_global_device_ids} : (tensor<2x2xf32>) -> tensor<4x2xf32>
    return %0, %g : tensor<2x2xf32>, tensor<4x2xf32>"""
    impl = per_device(
        f"mhlo.spmd_parameters_shardings = [{TILED}], "
        'mhlo.spmd_output_sharding = "{{devices=[2,1]0,1}, {replicated}}"',
        body,
        "tensor<2x2xf32>, tensor<4x2xf32>",
    )
    r = tv_ir.check(spec, impl)
    assert r.verdict == "equivalent", r.reason


def test_device_count_from_the_collectives_groups() -> None:
    body = """    %0 = "stablehlo.all_reduce"(%x) ({
      ^bb0(%a: tensor<f32>, %b: tensor<f32>):
        %s = stablehlo.add %a, %b : tensor<f32>
        stablehlo.return %s : tensor<f32>
      }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>,
          channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>,
          use_global_device_ids} : (tensor<4x2xf32>) -> tensor<4x2xf32>
    return %0 : tensor<4x2xf32>"""
    impl = per_device(
        'mhlo.spmd_parameters_shardings = ["{replicated}"], '
        'mhlo.spmd_output_sharding = "{replicated}"',
        body,
        "tensor<4x2xf32>",
        args="%x: tensor<4x2xf32>",
    )
    r = tv_ir.check(SPEC, impl)
    assert r.verdict == "equivalent", r.reason


def sum_over_mesh_axis(operand: str) -> str:
    """`%0`: the sum of a 4x2 f32 `operand` over axis "a" of `@mesh`, its groups named by
    mesh axes as jaxlib's StableHLO of XLA's output names them."""
    return (
        """    %0 = "stablehlo.all_reduce"(OPERAND) <{
        replica_groups = #stablehlo.replica_group_mesh_axes<mesh = @mesh,
          axes = [#stablehlo.axis_ref<name = "a">]>,
        channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>,
        use_global_device_ids}> ({
      ^bb0(%a: tensor<f32>, %b: tensor<f32>):
        %s = stablehlo.add %a, %b : tensor<f32>
        stablehlo.return %s : tensor<f32>
      }) : (tensor<4x2xf32>) -> tensor<4x2xf32>"""
    ).replace("OPERAND", operand)


@pytest.mark.parametrize("mesh_size, verdict", [(2, "equivalent"), (4, "not_equivalent")])
def test_device_count_from_the_mesh_the_groups_name(mesh_size: int, verdict: str) -> None:
    """jaxlib's StableHLO of XLA's output names its groups by the axes of a module mesh
    (`@mesh`): that mesh is every device, so it gives the count a partition_id needs. Each
    device adds half of x: twice x on 2 devices, four times on 4."""
    body = (
        """    %p = stablehlo.partition_id : tensor<ui32>
    %c0 = stablehlo.constant dense<0> : tensor<ui32>
    %first = stablehlo.compare EQ, %p, %c0 : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
    %c = stablehlo.constant dense<0.5> : tensor<4x2xf32>
    %h = stablehlo.multiply %x, %c : tensor<4x2xf32>
    %mine = stablehlo.select %first, %h, %h : tensor<i1>, tensor<4x2xf32>
"""
        + sum_over_mesh_axis("%mine")
        + """
    %1 = stablehlo.add %0, %0 : tensor<4x2xf32>
    return %1 : tensor<4x2xf32>"""
    )
    impl = per_device(
        'mhlo.spmd_parameters_shardings = ["{replicated}"], '
        'mhlo.spmd_output_sharding = "{replicated}"',
        body,
        "tensor<4x2xf32>",
        args="%x: tensor<4x2xf32>",
    )
    mesh = f'sdy.mesh @mesh = <["a"={mesh_size}]>'
    impl = impl.replace("{\n  func.func", "{\n  " + mesh + "\n  func.func", 1)
    assert mesh in impl
    r = tv_ir.check(SPEC, impl)
    assert r.verdict == verdict, r.reason


PARTITION_ID_BODY = """    %p = stablehlo.partition_id : tensor<ui32>
    %c5 = stablehlo.constant dense<5> : tensor<ui32>
    %is5 = stablehlo.compare EQ, %p, %c5 : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
    %0 = stablehlo.add %x, %x : tensor<4x2xf32>
    %1 = stablehlo.multiply %x, %x : tensor<4x2xf32>
    %2 = stablehlo.select %is5, %1, %0 : tensor<i1>, tensor<4x2xf32>
    return %2 : tensor<4x2xf32>"""


def _replicated_partition_id_program(tmp_path):
    impl = per_device(
        'mhlo.spmd_parameters_shardings = ["{replicated}"], '
        'mhlo.spmd_output_sharding = "{replicated}"',
        PARTITION_ID_BODY,
        "tensor<4x2xf32>",
        args="%x: tensor<4x2xf32>",
    )
    (tmp_path / "spec.mlir").write_text(SPEC)
    (tmp_path / "impl.mlir").write_text(impl)
    return impl


def test_partition_id_without_a_device_count_is_bad_input(tmp_path) -> None:
    impl = _replicated_partition_id_program(tmp_path)
    with pytest.raises(BadInput, match="--num-partitions"):
        tv_ir.check(SPEC, impl)
    r = _tv(tmp_path, "check", "spec.mlir", "impl.mlir")
    assert r.returncode == 3 and "--num-partitions" in r.stderr, r.stderr
    r = _tv(tmp_path, "check", "spec.mlir", "impl.mlir", "--num-partitions", "2")
    assert r.returncode == 0, r.stdout + r.stderr


# XLA's dump after spmd-partitioning: parameters keep their shardings, the root does not
BEFORE_HLO = """HloModule m

ENTRY entry {
  x = f32[4,2] parameter(0), sharding={devices=[2,1]0,1}
  ROOT y = f32[4,2] add(x, x), sharding={replicated}
}
"""
AFTER_HLO = """HloModule m, num_partitions=2

ENTRY main {
  x = f32[2,2] parameter(0), sharding={devices=[2,1]0,1}
  y = f32[2,2] add(x, x)
  ROOT g = f32[4,2] all-gather(y), channel_id=1, replica_groups={{0,1}}, dimensions={0},
    use_global_device_ids=true
}
"""


def test_before_after_hlo_result_layout_from_the_pre_partition_module(tmp_path) -> None:
    r = tv_ir.check(BEFORE_HLO, AFTER_HLO)
    assert r.verdict == "equivalent", r.reason
    wrong = BEFORE_HLO.replace("sharding={replicated}", "sharding={devices=[2,1]0,1}")
    with pytest.raises(BadInput, match="holds"):  # its layout would hold [2, 2]
        tv_ir.check(wrong, AFTER_HLO)


def test_missing_result_layout_names_it_and_explicit_shardings_supply_it(tmp_path) -> None:
    (tmp_path / "spec.mlir").write_text(SPEC)
    (tmp_path / "after.hlo").write_text(AFTER_HLO)
    r = _tv(tmp_path, "check", "spec.mlir", "after.hlo")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "result 0" in r.stderr and "--out-shardings" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    outs = json.dumps(["{replicated}"])
    r = _tv(tmp_path, "check", "spec.mlir", "after.hlo", "--out-shardings", outs)
    assert r.returncode == 0, r.stdout + r.stderr
    r = _tv(tmp_path, "check", "spec.mlir", "after.hlo", "--out-shardings", "[1]")
    assert r.returncode == 3 and "--out-shardings" in r.stderr


def _tv(cwd, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tv_ir.cli", *args], capture_output=True, text=True, cwd=cwd
    )


def test_xla_spmd_output_is_not_partitioned_again() -> None:
    """Global shapes, replicated shardings, no collectives: only the `_spmd` entry name that
    XLA's partitioner gives says this HLO is already per-device."""
    before = """HloModule m

ENTRY entry {
  x = f32[4] parameter(0), sharding={replicated}
  ROOT y = f32[4] add(x, x), sharding={replicated}
}
"""
    after = """HloModule m, num_partitions=2

ENTRY main_spmd {
  x = f32[4] parameter(0), sharding={replicated}
  ROOT y = f32[4] add(x, x)
}
"""
    r = tv_ir.check(before, after)
    assert r.verdict == "equivalent", r.reason
    assert "partitioning of" not in r.impl_name


def test_hlo_text_without_a_module_header_is_read() -> None:
    """XLA's tests write some modules as their entry computation alone."""
    headless = BEFORE_HLO.split("\n", 2)[2]
    assert headless.lstrip().startswith("ENTRY")
    r = tv_ir.check(headless, AFTER_HLO)
    assert r.verdict == "equivalent", r.reason


MAXIMAL_SPEC = """
func.func @main(%x: tensor<2x3xf32> {mhlo.sharding = "{maximal device=1}"})
    -> (tensor<2x3xf32> {mhlo.sharding = "{replicated}"}) {
  return %x : tensor<2x3xf32>
}
"""

# XLA's broadcast of a value on device 1: device 1 contributes it, the others zeros
MAXIMAL_BROADCAST = """HloModule m, num_partitions=2

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (x: f32[2,3]) -> f32[2,3] {
  %x = f32[2,3]{1,0} parameter(0), sharding={maximal device=1}
  %pid = u32[] partition-id()
  %one = u32[] constant(1)
  %holder = pred[] compare(%pid, %one), direction=EQ
  %mask = pred[2,3]{1,0} broadcast(%holder), dimensions={}
  %zero = f32[] constant(0)
  %zeros = f32[2,3]{1,0} broadcast(%zero), dimensions={}
  %mine = f32[2,3]{1,0} select(%mask, %x, %zeros)
  ROOT %all = f32[2,3]{1,0} all-reduce(%mine), channel_id=1, replica_groups={{0,1}}, \
use_global_device_ids=true, to_apply=%sum
}
"""


def test_maximal_argument_is_read_from_its_device_only() -> None:
    assert tv_ir.check(MAXIMAL_SPEC, MAXIMAL_BROADCAST).verdict == "equivalent"
    # device 0's buffer of a value that lives on device 1 holds nothing meaningful
    reads_elsewhere = MAXIMAL_BROADCAST.replace(
        "select(%mask, %x, %zeros)", "select(%mask, %zeros, %x)"
    )
    r = tv_ir.check(MAXIMAL_SPEC, reads_elsewhere)
    assert r.verdict == "not_equivalent", f"{r.verdict}: {r.reason}"


UNREDUCED_ADD = """
module @m attributes {mhlo.spmd_parameters_shardings = ["{unreduced}", "{unreduced}"],
                      mhlo.spmd_output_sharding = "{replicated}"} {
  func.func @main(%a: tensor<2x4xi32>, %b: tensor<2x4xi32>) -> tensor<2x4xi32> {
    %0 = stablehlo.add %a, %b : tensor<2x4xi32>
    return %0 : tensor<2x4xi32>
  }
}
"""
PLAIN_ADD = """
func.func @main(%a: tensor<2x4xi32>, %b: tensor<2x4xi32>) -> tensor<2x4xi32> {
  %0 = stablehlo.add %a, %b : tensor<2x4xi32>
  return %0 : tensor<2x4xi32>
}
"""


def test_unreduced_layouts_without_a_device_count_are_bad_input() -> None:
    """XLA's `UnreducedParam` as jaxlib's StableHLO gives it (no mhlo.num_partitions): each
    device adds its partial sums and calls the result replicated. On one device that is the
    spec; on the 2 XLA ran it on it is not. The count was taken to be 1 (a false proof)."""
    with pytest.raises(BadInput, match="sum over the devices"):
        tv_ir.check(PLAIN_ADD, UNREDUCED_ADD)
    r = tv_ir.check(PLAIN_ADD, UNREDUCED_ADD, layouts=GivenLayouts(num_partitions=2))
    assert r.verdict == "not_equivalent"


ALL_REDUCE_OVER_MESH = sum_over_mesh_axis("%x") + "\n    return %0 : tensor<4x2xf32>"


@pytest.mark.parametrize(
    "attrs, mesh, lost",
    [
        # jaxlib's StableHLO of XLA's dump: the mesh lost XLA's device_ids (if it had any:
        # nothing left says, whatever order the layouts give)
        (True, '<["a"=2, "b"=2]>', True),
        # the mesh gives its order, or the module is not XLA's dump converted by jaxlib
        (True, '<["a"=2, "b"=2], device_ids=[0, 2, 1, 3]>', False),
        (False, '<["a"=2, "b"=2]>', False),
        # a sum over every device: one group, in any order
        (True, '<["a"=4, "b"=1]>', False),
    ],
)
def test_a_mesh_without_its_device_order_is_named(attrs: bool, mesh: str, lost: bool) -> None:
    from tv_ir.pipeline import prepare
    from tv_ir.prover.boundary_layouts import lost_device_order

    impl = per_device(
        'mhlo.spmd_parameters_shardings = ["{replicated}"], '
        'mhlo.spmd_output_sharding = "{replicated}"'
        if attrs
        else "mhlo.num_partitions = 4 : i32",
        ALL_REDUCE_OVER_MESH,
        "tensor<4x2xf32>",
        args="%x: tensor<4x2xf32>",
    )
    impl = impl.replace("{\n  func.func", f"{{\n  sdy.mesh @mesh = {mesh}\n  func.func", 1)
    why = lost_device_order(prepare(impl, "impl", unroll=False))
    assert (why is not None) == lost, why
    if lost:
        assert "@mesh" in why and "hlo_to_stablehlo" in why


def test_no_module_is_bad_input_saying_what_it_got() -> None:
    # a harness that has no StableHLO form of a program passes None on
    with pytest.raises(BadInput, match="impl: no module: .* got NoneType"):
        tv_ir.check(SPEC, None)
