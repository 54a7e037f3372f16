"""Shape reduction through convolutions: batch and feature dimensions shrink like a dot's,
spatial dimensions (windows, strides, padding, dilations) keep their sizes."""

from __future__ import annotations

import tv_ir

CONV = """
func.func @main(%x: tensor<8x6x6x4xf32>, %k: tensor<3x3x4x8xf32>) -> tensor<8x4x4x8xf32> {
  %0 = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f],
    window = {stride = [1, 1], pad = [[0, 0], [0, 0]], rhs_dilate = [1, 1]}
    {batch_group_count = 1 : i64, feature_group_count = 1 : i64}
    : (tensor<8x6x6x4xf32>, tensor<3x3x4x8xf32>) -> tensor<8x4x4x8xf32>
  return %0 : tensor<8x4x4x8xf32>
}
"""

# per device on 2 devices: the batch split in halves, the kernel replicated
PER_DEVICE = """
module @m attributes {
    mhlo.spmd_parameters_shardings = ["{devices=[2,1,1,1]0,1}", "{replicated}"],
    mhlo.spmd_output_sharding = "{devices=[2,1,1,1]0,1}"} {
  func.func @main(%x: tensor<4x6x6x4xf32>, %k: tensor<3x3x4x8xf32>) -> tensor<4x4x4x8xf32> {
    %0 = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f],
      window = {stride = [1, 1], pad = [[0, 0], [0, 0]], rhs_dilate = [1, 1]}
      {batch_group_count = 1 : i64, feature_group_count = 1 : i64}
      : (tensor<4x6x6x4xf32>, tensor<3x3x4x8xf32>) -> tensor<4x4x4x8xf32>
    return %0 : tensor<4x4x4x8xf32>
  }
}
"""


def _classes(report) -> dict:
    return {c["name"]: (c["real"], c["reduced"], c["kept"]) for c in report.reduction["classes"]}


def test_batch_split_convolution_is_proved_at_reduced_batch_and_features() -> None:
    r = tv_ir.check(CONV, PER_DEVICE)
    assert r.verdict == "equivalent", r.reason
    classes = _classes(r)
    batch = classes["spec argument 0 dim 0"]
    assert batch[1] < batch[0] and batch[2] is None  # the batch shrank
    assert classes["spec argument 1 dim 3"][1] < 8  # output features shrank
    assert classes["spec argument 0 dim 1"][2].startswith("convolution window")  # spatial kept


def test_swapped_spatial_dimensions_are_refuted_at_reduced_sizes() -> None:
    wrong = PER_DEVICE.replace(
        "dim_numbers = [b, 0, 1, f]x[0, 1, i, o]", "dim_numbers = [b, 1, 0, f]x[0, 1, i, o]"
    )
    r = tv_ir.check(CONV, wrong)
    assert r.verdict == "not_equivalent"
