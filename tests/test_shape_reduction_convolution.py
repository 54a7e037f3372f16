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


def _per_device(shardings: list[str], out: str, body: str) -> str:
    args = ", ".join(f'"{s}"' for s in shardings)
    return f"""
module @m attributes {{
    mhlo.spmd_parameters_shardings = [{args}], mhlo.spmd_output_sharding = "{out}"}} {{
{body}
}}
"""


def _conv(x: str, k: str, out: str, labels: str, window: str, groups: str, pre: str = "") -> str:
    return f"""
  func.func @main(%x: tensor<{x}xf32>, %k: tensor<{k}xf32>) -> tensor<{out}xf32> {{{pre}
    %0 = stablehlo.convolution(%x, %k) dim_numbers = {labels}, window = {{{window}}}
      {{{groups}}} : (tensor<{x}xf32>, tensor<{k}xf32>) -> tensor<{out}xf32>
    return %0 : tensor<{out}xf32>
  }}"""


NHWC = "[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]"
UNGROUPED = "batch_group_count = 1 : i64, feature_group_count = 1 : i64"

# a "same" 3x3 convolution (stride 1, padding 1 on each side), the batch split over 2 devices
SAME = _conv("8x24x24x4", "3x3x4x8", "8x24x24x8", NHWC, "pad = [[1, 1], [1, 1]]", UNGROUPED)
SAME_PER_DEVICE = _per_device(
    ["{devices=[2,1,1,1]0,1}", "{replicated}"],
    "{devices=[2,1,1,1]0,1}",
    _conv("4x24x24x4", "3x3x4x8", "4x24x24x8", NHWC, "pad = [[1, 1], [1, 1]]", UNGROUPED),
)


def test_same_padded_convolution_shrinks_its_spatial_dimensions() -> None:
    r = tv_ir.check("module {" + SAME + "\n}", SAME_PER_DEVICE)
    assert r.verdict == "equivalent", r.reason
    classes = _classes(r)
    height = classes["spec argument 0 dim 1"]
    assert height[2] is None and height[1] < 24  # the sliding window's input shrank
    assert height[1] >= 2 * 3  # two windows stay
    assert classes["spec argument 1 dim 0"][2].startswith("convolution window")  # taps kept


def test_same_padded_convolution_with_shifted_padding_is_refuted() -> None:
    shifted = SAME_PER_DEVICE.replace("pad = [[1, 1], [1, 1]]", "pad = [[2, 0], [1, 1]]")
    r = tv_ir.check("module {" + SAME + "\n}", shifted)
    assert r.verdict == "not_equivalent"


def test_strided_same_convolution_shrinks_its_spatial_dimensions() -> None:
    # a 7x7 window at stride 2 with padding 3 (ResNet's stem): 32 inputs give 16 outputs
    window = "stride = [2, 2], pad = [[3, 3], [3, 3]]"
    spec = _conv("4x32x32x3", "7x7x3x8", "4x16x16x8", NHWC, window, UNGROUPED)
    impl = _per_device(
        ["{devices=[2,1,1,1]0,1}", "{replicated}"],
        "{devices=[2,1,1,1]0,1}",
        _conv("2x32x32x3", "7x7x3x8", "2x16x16x8", NHWC, window, UNGROUPED),
    )
    r = tv_ir.check("module {" + spec + "\n}", impl)
    assert r.verdict == "equivalent", r.reason
    assert _classes(r)["spec argument 0 dim 1"][1] < 32
    wrong = impl.replace("pad = [[3, 3], [3, 3]]", "pad = [[2, 4], [3, 3]]")
    assert tv_ir.check("module {" + spec + "\n}", wrong).verdict == "not_equivalent"


# a depthwise convolution (feature_group_count = channels), the channels split over 2 devices
DEPTHWISE_GROUPS = "batch_group_count = 1 : i64, feature_group_count = {} : i64"
DEPTHWISE = _conv(
    "2x20x1x16",
    "5x1x1x32",
    "2x20x1x32",
    NHWC,
    "pad = [[2, 2], [0, 0]]",
    DEPTHWISE_GROUPS.format(16),
)
DEPTHWISE_SPLIT = ["{devices=[1,1,1,2]0,1}", "{devices=[1,1,1,2]0,1}"]


def _depthwise_per_device(pre: str = "", kernel: str = "%k") -> str:
    body = _conv(
        "2x20x1x8",
        "5x1x1x16",
        "2x20x1x16",
        NHWC,
        "pad = [[2, 2], [0, 0]]",
        DEPTHWISE_GROUPS.format(8),
        pre,
    ).replace("(%x, %k)", f"(%x, {kernel})")
    return _per_device(DEPTHWISE_SPLIT, "{devices=[1,1,1,2]0,1}", body)


def test_depthwise_convolution_shrinks_its_groups() -> None:
    r = tv_ir.check("module {" + DEPTHWISE + "\n}", _depthwise_per_device())
    assert r.verdict == "equivalent", r.reason
    classes = _classes(r)
    assert classes["spec argument 0 dim 3"][1] < 16  # the channels (= groups) shrank
    groups = [v for n, v in classes.items() if n.startswith("feature groups")]
    assert groups and all(reduced < real for real, reduced, _ in groups)


def test_depthwise_convolution_with_kernels_of_other_groups_is_refuted() -> None:
    # each group's two output kernels swapped with the next group's: reversed output features
    pre = """
    %kr = stablehlo.reverse %k, dims = [3] : tensor<5x1x1x16xf32>"""
    r = tv_ir.check("module {" + DEPTHWISE + "\n}", _depthwise_per_device(pre, "%kr"))
    assert r.verdict == "not_equivalent"


# a weight gradient: batch groups, the window as long as the input (801 in XLA's test)
WGRAD_LABELS = "[f, 0, 1, b]x[i, 0, 1, o]->[0, 1, b, f]"
WGRAD_GROUPS = "batch_group_count = {} : i64, feature_group_count = 1 : i64"
WGRAD = _conv(
    "4x30x1x8",
    "4x30x1x8",
    "5x1x1x8",
    WGRAD_LABELS,
    "pad = [[2, 2], [0, 0]]",
    WGRAD_GROUPS.format(8),
)


def _wgrad_per_device(window: str = "pad = [[2, 2], [0, 0]]") -> str:
    body = _conv("4x30x1x4", "4x30x1x4", "5x1x1x4", WGRAD_LABELS, window, WGRAD_GROUPS.format(4))
    split = "{devices=[1,1,1,2]0,1}"
    return _per_device([split, split], split, body)


def test_batch_grouped_weight_gradient_shrinks_its_window_and_groups() -> None:
    r = tv_ir.check("module {" + WGRAD + "\n}", _wgrad_per_device())
    assert r.verdict == "equivalent", r.reason
    classes = _classes(r)
    assert classes["spec argument 0 dim 1"][1] < 30  # input and kernel length shrank
    assert classes["spec argument 0 dim 3"][1] < 8  # the batch groups shrank
    shifts = [v for v in classes.values() if v[2] and "shifts of a window" in v[2]]
    assert shifts and shifts[0][:2] == (5, 5)  # the 5 shifts kept


def test_batch_grouped_weight_gradient_with_shifted_window_is_refuted() -> None:
    r = tv_ir.check("module {" + WGRAD + "\n}", _wgrad_per_device("pad = [[3, 1], [0, 0]]"))
    assert r.verdict == "not_equivalent"


def test_valid_window_keeps_its_spatial_dimensions_and_says_why() -> None:
    # 6 inputs, a 3-tap window, no padding: 4 outputs (6 = 4 + 2, as a tile widened by
    # halos from its neighbours, which XLA windows without padding)
    r = tv_ir.check(CONV, PER_DEVICE)
    why = _classes(r)["spec argument 0 dim 1"][2]
    assert "input 6, window 3, stride 1, padding 0_0" in why and "halos" in why


# the weight gradient of a stride-2 convolution: the kernel dilated by 2 spans the input
DILATED = "pad = [[2, 1], [0, 0]], rhs_dilate = [2, 1]"
DILATED_WGRAD = _conv(
    "4x48x1x8", "4x24x1x8", "5x1x1x8", WGRAD_LABELS, DILATED, WGRAD_GROUPS.format(8)
)


def _dilated_wgrad_per_device(window: str = DILATED) -> str:
    body = _conv("4x48x1x4", "4x24x1x4", "5x1x1x4", WGRAD_LABELS, window, WGRAD_GROUPS.format(4))
    split = "{devices=[1,1,1,2]0,1}"
    return _per_device([split, split], split, body)


def test_dilated_weight_gradient_shrinks_its_window() -> None:
    r = tv_ir.check("module {" + DILATED_WGRAD + "\n}", _dilated_wgrad_per_device())
    assert r.verdict == "equivalent", r.reason
    classes = _classes(r)
    assert classes["spec argument 0 dim 1"][1] < 48  # the input and kernel shrank


def test_dilated_weight_gradient_with_shifted_padding_is_refuted() -> None:
    wrong = _dilated_wgrad_per_device(DILATED.replace("[[2, 1]", "[[1, 2]"))
    r = tv_ir.check("module {" + DILATED_WGRAD + "\n}", wrong)
    assert r.verdict == "not_equivalent"


# an outer product written as a convolution (XLA's windowed-einsum tests): one input
# position against a window of 12 padded by 11 on both sides; output o meets tap 11 - o
OUTER = _conv("8x1x1x4", "12x1x4x8", "8x12x1x8", NHWC, "pad = [[11, 11], [0, 0]]", UNGROUPED)
# the same as a dot of the input with the kernel reversed along its window
OUTER_AS_DOT = """
  func.func @main(%x: tensor<8x1x1x4xf32>, %k: tensor<12x1x4x8xf32>) -> tensor<8x12x1x8xf32> {
    %r = stablehlo.reverse %k, dims = [0] : tensor<12x1x4x8xf32>
    %x2 = stablehlo.reshape %x : (tensor<8x1x1x4xf32>) -> tensor<8x4xf32>
    %k2 = stablehlo.reshape %r : (tensor<12x1x4x8xf32>) -> tensor<12x4x8xf32>
    %d = stablehlo.dot_general %x2, %k2, contracting_dims = [1] x [1]
      : (tensor<8x4xf32>, tensor<12x4x8xf32>) -> tensor<8x12x8xf32>
    %0 = stablehlo.reshape %d : (tensor<8x12x8xf32>) -> tensor<8x12x1x8xf32>
    return %0 : tensor<8x12x1x8xf32>
  }"""


def test_outer_product_convolution_shrinks_its_window_with_its_output() -> None:
    impl = _per_device(
        ["{devices=[2,1,1,1]0,1}", "{replicated}"],
        "{devices=[2,1,1,1]0,1}",
        _conv("4x1x1x4", "12x1x4x8", "4x12x1x8", NHWC, "pad = [[11, 11], [0, 0]]", UNGROUPED),
    )
    r = tv_ir.check("module {" + OUTER + "\n}", impl)
    assert r.verdict == "equivalent", r.reason
    window = _classes(r)["spec argument 1 dim 0"]
    assert window[2] is None and 2 <= window[1] < 12  # the window shrank (its padding too)
    shifted = impl.replace("pad = [[11, 11], [0, 0]]", "pad = [[10, 12], [0, 0]]")
    assert tv_ir.check("module {" + OUTER + "\n}", shifted).verdict == "not_equivalent"


def test_outer_product_convolution_reduced_verdicts_are_the_real_ones() -> None:
    """Against the einsum it stands for (kernel reversed): equal, and without the reversal
    not, at reduced and at real sizes alike."""
    # the kernel negated instead of reversed, and the dot negated back: unreversed
    unreversed = OUTER_AS_DOT.replace("stablehlo.reverse %k, dims = [0]", "stablehlo.negate %k")
    unreversed = unreversed.replace("%d = ", "%d0 = ").replace(
        "-> tensor<8x12x8xf32>\n",
        "-> tensor<8x12x8xf32>\n    %d = stablehlo.negate %d0 : tensor<8x12x8xf32>\n",
    )
    for reduce in (True, False):
        spec = "module {" + OUTER_AS_DOT + "\n}"
        r = tv_ir.check(spec, "module {" + OUTER + "\n}", reduce_shapes=reduce)
        assert r.verdict == "equivalent", (reduce, r.reason)
        r = tv_ir.check(
            "module {" + unreversed + "\n}", "module {" + OUTER + "\n}", reduce_shapes=reduce
        )
        assert r.verdict == "not_equivalent", (reduce, r.reason)
