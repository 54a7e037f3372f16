"""dynamic_conv: with known padding it is the convolution with that padding; padding that
depends on the inputs is unknown (its result shape would too)."""

from __future__ import annotations

import tv_ir

DIMS = "dimension_numbers = #stablehlo.conv<[b, 0, f]x[0, i, o]->[b, 0, f]>"
GROUPS = "feature_group_count = 1 : i64, batch_group_count = 1 : i64"
TYPES = "tensor<1x4x1xf32>, tensor<2x1x1xf32>"


def dynamic(padding_arg: bool, low: int = 1) -> str:
    source = "%p: tensor<1x2xi64>" if padding_arg else "%unused: tensor<1x2xi64>"
    const = (
        "" if padding_arg else f"  %p = stablehlo.constant dense<[[{low}, 1]]> : tensor<1x2xi64>\n"
    )
    return (
        f"func.func @main(%x: tensor<1x4x1xf32>, %k: tensor<2x1x1xf32>, {source})"
        " -> tensor<1x5x1xf32> {\n"
        + const
        + f'  %r = "stablehlo.dynamic_conv"(%x, %k, %p) {{{DIMS}, {GROUPS}}}'
        f" : ({TYPES}, tensor<1x2xi64>) -> tensor<1x5x1xf32>\n"
        "  return %r : tensor<1x5x1xf32>\n}\n"
    )


STATIC = (
    "func.func @main(%x: tensor<1x4x1xf32>, %k: tensor<2x1x1xf32>, %unused: tensor<1x2xi64>)"
    " -> tensor<1x5x1xf32> {\n"
    f'  %r = "stablehlo.convolution"(%x, %k) {{{DIMS}, {GROUPS}, '
    "padding = dense<[[1, 1]]> : tensor<1x2xi64>}"
    f" : ({TYPES}) -> tensor<1x5x1xf32>\n"
    "  return %r : tensor<1x5x1xf32>\n}\n"
)


def test_known_padding_is_the_static_convolution() -> None:
    assert tv_ir.check(dynamic(False), STATIC, time_limit=60).verdict == "equivalent"


def test_other_known_padding_is_refuted() -> None:
    wrong = dynamic(False, low=2).replace("[[2, 1]]", "[[2, 0]]")
    assert tv_ir.check(wrong, STATIC, time_limit=60).verdict == "not_equivalent"


def test_input_dependent_padding_is_unknown() -> None:
    r = tv_ir.check(dynamic(True), dynamic(True), time_limit=60)
    assert r.verdict == "unknown", r
    assert "stablehlo.dynamic_conv" in str(r.unsupported)
