"""A refutation where a reduction's body is not commutative or associative is unknown: the
order XLA combines elements in is its choice (tv_ir/semantics/reduction_order.py)."""

from __future__ import annotations

import tv_ir

ARGMAX = """
func.func @main(%v: tensor<4xf32>, %i: tensor<4xi32>) -> (tensor<f32>, tensor<i32>) {
  %v0 = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %i0 = stablehlo.constant dense<-1> : tensor<i32>
  %r:2 = stablehlo.reduce(%V init: %v0), (%I init: %i0) across dimensions = [0]
    : (tensor<4xf32>, tensor<4xi32>, tensor<f32>, tensor<i32>) -> (tensor<f32>, tensor<i32>)
    reducer(%a: tensor<f32>, %c: tensor<f32>) (%b: tensor<i32>, %d: tensor<i32>) {
      %gt = stablehlo.compare GT, %a, %c : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %m = stablehlo.select %gt, %a, %c : tensor<i1>, tensor<f32>
      %k = stablehlo.select %gt, %b, %d : tensor<i1>, tensor<i32>
      stablehlo.return %m, %k : tensor<f32>, tensor<i32>
    }
  return %r#0, %r#1 : tensor<f32>, tensor<i32>
}
"""
SPEC = ARGMAX.replace("%V", "%v").replace("%I", "%i")
# the same argmax over the elements in reverse order: differs only where values tie
REVERSED = (
    ARGMAX.replace(
        "  %v0 =",
        "  %rv = stablehlo.reverse %v, dims = [0] : tensor<4xf32>\n"
        "  %ri = stablehlo.reverse %i, dims = [0] : tensor<4xi32>\n  %v0 =",
    )
    .replace("%V", "%rv")
    .replace("%I", "%ri")
)


def test_reordered_non_commutative_reduction_is_unknown_not_refuted() -> None:
    r = tv_ir.check(SPEC, REVERSED)
    assert r.verdict == "unknown", str(r)
    assert "not commutative" in r.reason and r.counterexample is None


def test_a_commutative_reduction_is_still_refuted() -> None:
    spec = """
func.func @main(%v: tensor<4xf32>) -> tensor<f32> {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %r = stablehlo.reduce(%v init: %z) applies stablehlo.add across dimensions = [0]
    : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
  return %r : tensor<f32>
}
"""
    wrong = spec.replace("applies stablehlo.add", "applies stablehlo.maximum")
    assert tv_ir.check(spec, wrong).verdict == "not_equivalent"
