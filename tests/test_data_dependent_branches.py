"""`case` / `if` on a value that depends on the inputs: every branch runs and the results
are chosen by it (tv_ir/semantics/ops/control.py; in lockstep on every device,
tv_ir/semantics/interpreters/spmd.py)."""

from __future__ import annotations

import tv_ir

CASE = """
func.func @main(%i: tensor<i32>, %x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "stablehlo.case"(%i) ({
    %a = stablehlo.floor %x : tensor<4xf32>
    stablehlo.return %a : tensor<4xf32>
  }, {
    %b = stablehlo.ceil %x : tensor<4xf32>
    stablehlo.return %b : tensor<4xf32>
  }) : (tensor<i32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""

# the same choice written with select: index 0 takes floor, any other index ceil
AS_SELECT = """
func.func @main(%i: tensor<i32>, %x: tensor<4xf32>) -> tensor<4xf32> {
  %z = stablehlo.constant dense<0> : tensor<i32>
  %p = stablehlo.compare EQ, %i, %z : (tensor<i32>, tensor<i32>) -> tensor<i1>
  %pb = stablehlo.broadcast_in_dim %p, dims = [] : (tensor<i1>) -> tensor<4xi1>
  %a = stablehlo.floor %x : tensor<4xf32>
  %b = stablehlo.ceil %x : tensor<4xf32>
  %0 = stablehlo.select %pb, %a, %b : tensor<4xi1>, tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


def test_case_on_an_input_index_is_proved_equal_to_its_select_form() -> None:
    r = tv_ir.check(CASE, AS_SELECT)
    assert r.verdict == "equivalent", r.reason


def test_swapped_branches_are_refuted() -> None:
    swapped = CASE.replace("floor", "TMP").replace("ceil", "floor").replace("TMP", "ceil")
    r = tv_ir.check(CASE, swapped)
    assert r.verdict == "not_equivalent"


IF_SPEC = """
func.func @main(%p: tensor<i1>, %x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "stablehlo.if"(%p) ({
    %a = stablehlo.add %x, %x : tensor<4xf32>
    stablehlo.return %a : tensor<4xf32>
  }, {
    stablehlo.return %x : tensor<4xf32>
  }) : (tensor<i1>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""

# per device on 2 devices: x split in halves, the doubling branch all-gathers (a collective
# inside a branch whose predicate every device reads from the same replicated input)
IF_PER_DEVICE = """
module @m attributes {mhlo.spmd_parameters_shardings = ["{replicated}", "{devices=[2]0,1}"],
                      mhlo.spmd_output_sharding = "{replicated}"} {
  func.func @main(%p: tensor<i1>, %x: tensor<2xf32>) -> tensor<4xf32> {
    %g = "stablehlo.all_gather"(%x) {all_gather_dim = 0 : i64,
      replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>,
      channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>,
      use_global_device_ids} : (tensor<2xf32>) -> tensor<4xf32>
    %0 = "stablehlo.if"(%p) ({
      %a = stablehlo.add %g, %g : tensor<4xf32>
      stablehlo.return %a : tensor<4xf32>
    }, {
      %h = "stablehlo.all_gather"(%x) {all_gather_dim = 0 : i64,
        replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>,
        channel_handle = #stablehlo.channel_handle<handle = 2, type = 0>,
        use_global_device_ids} : (tensor<2xf32>) -> tensor<4xf32>
      stablehlo.return %h : tensor<4xf32>
    }) : (tensor<i1>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""


def test_per_device_if_on_a_replicated_predicate_runs_both_branches_in_lockstep() -> None:
    r = tv_ir.check(IF_SPEC, IF_PER_DEVICE)
    assert r.verdict == "equivalent", r.reason
    wrong = IF_PER_DEVICE.replace("stablehlo.add %g, %g", "stablehlo.multiply %g, %g")
    assert tv_ir.check(IF_SPEC, wrong).verdict == "not_equivalent"


SLICE = """
func.func @main(%x: tensor<6xf32>, %i: tensor<i32>) -> tensor<2xf32> {
  %0 = stablehlo.dynamic_slice %x, %i, sizes = [2] : (tensor<6xf32>, tensor<i32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}
"""
# the same window read as a dynamic_slice of the reversed vector at the mirrored (clamped)
# offset, reversed back
MIRRORED = """
func.func @main(%x: tensor<6xf32>, %i: tensor<i32>) -> tensor<2xf32> {
  %lo = stablehlo.constant dense<0> : tensor<i32>
  %hi = stablehlo.constant dense<4> : tensor<i32>
  %c = stablehlo.clamp %lo, %i, %hi : tensor<i32>
  %four = stablehlo.constant dense<4> : tensor<i32>
  %j = stablehlo.subtract %four, %c : tensor<i32>
  %r = stablehlo.reverse %x, dims = [0] : tensor<6xf32>
  %s = stablehlo.dynamic_slice %r, %j, sizes = [2] : (tensor<6xf32>, tensor<i32>) -> tensor<2xf32>
  %0 = stablehlo.reverse %s, dims = [0] : tensor<2xf32>
  return %0 : tensor<2xf32>
}
"""


def test_dynamic_slice_at_an_input_offset_is_read_by_cases() -> None:
    r = tv_ir.check(SLICE, MIRRORED, reduce_shapes=False)
    assert r.verdict == "equivalent", r.reason
    off_by_one = MIRRORED.replace(
        "%four = stablehlo.constant dense<4>", "%four = stablehlo.constant dense<3>"
    )
    r = tv_ir.check(SLICE, off_by_one, reduce_shapes=False)
    assert r.verdict == "not_equivalent"
