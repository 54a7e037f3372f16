"""A refutation where a reduction's body is not commutative or associative is unknown: the
order XLA combines elements in is its choice (tv_ir/semantics/reduction_order.py)."""

from __future__ import annotations

import tv_ir

# an argmax by a strict `>`: keeps the right operand on ties
ARGMAX_REDUCER = """\
    reducer(%a: tensor<f32>, %c: tensor<f32>) (%b: tensor<i32>, %d: tensor<i32>) {
      %gt = stablehlo.compare GT, %a, %c : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %m = stablehlo.select %gt, %a, %c : tensor<i1>, tensor<f32>
      %k = stablehlo.select %gt, %b, %d : tensor<i1>, tensor<i32>
      stablehlo.return %m, %k : tensor<f32>, tensor<i32>
    }
"""
ARGMAX = """
func.func @main(%v: tensor<4xf32>, %i: tensor<4xi32>) -> (tensor<f32>, tensor<i32>) {
  %v0 = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %i0 = stablehlo.constant dense<-1> : tensor<i32>
  %r:2 = stablehlo.reduce(%V init: %v0), (%I init: %i0) across dimensions = [0]
    : (tensor<4xf32>, tensor<4xi32>, tensor<f32>, tensor<i32>) -> (tensor<f32>, tensor<i32>)
%REDUCER
  return %r#0, %r#1 : tensor<f32>, tensor<i32>
}
""".replace("%REDUCER\n", ARGMAX_REDUCER)
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


SUM = """
func.func @main(%v: tensor<4xf32>) -> tensor<f32> {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %r = stablehlo.reduce(%v init: %z) applies stablehlo.add across dimensions = [0]
    : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
  return %r : tensor<f32>
}
"""


def test_a_commutative_reduction_is_still_refuted() -> None:
    wrong = SUM.replace("applies stablehlo.add", "applies stablehlo.maximum")
    assert tv_ir.check(SUM, wrong).verdict == "not_equivalent"


def test_a_non_commutative_reduction_whose_values_do_not_tie_is_refuted() -> None:
    # an argmax that returns index + 1: on values without ties every order picks the same
    # element, so the difference is not one of order (the body is commutative and
    # associative on the values it combines there)
    shifted = (
        ARGMAX.replace(
            "  %v0 =",
            "  %one = stablehlo.constant dense<1> : tensor<4xi32>\n"
            "  %i1 = stablehlo.add %i, %one : tensor<4xi32>\n  %v0 =",
        )
        .replace("%V", "%v")
        .replace("%I", "%i1")
    )
    r = tv_ir.check(SPEC, shifted)
    assert r.verdict == "not_equivalent", str(r)
    assert any("same in every order" in n for n in r.notes)


SCATTER = """
func.func @main(%x: tensor<6xf32>, %u: tensor<2xf32>) -> tensor<6xf32> {
  %idx = stablehlo.constant dense<IDX> : tensor<2x1xi32>
  %r = "stablehlo.scatter"(%x, %idx, %U) ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      stablehlo.return %b : tensor<f32>
  }) {scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0],
      scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}
    : (tensor<6xf32>, tensor<2x1xi32>, tensor<2xf32>) -> tensor<6xf32>
  return %r : tensor<6xf32>
}
"""


def _scatter(indices: str, updates: str, before: str = "") -> str:
    text = SCATTER.replace("IDX", indices).replace("%U", updates)
    return text.replace("  %idx =", before + "  %idx =")


def test_an_overwriting_scatter_to_distinct_positions_is_refuted() -> None:
    # `.at[idx].set(u)` without unique_indices: its body is not commutative, but no position
    # is written twice, so there is no order to choose
    spec = _scatter("[[1], [4]]", "%u")
    doubled = _scatter("[[1], [4]]", "%u2", "  %u2 = stablehlo.add %u, %u : tensor<2xf32>\n")
    r = tv_ir.check(spec, doubled)
    assert r.verdict == "not_equivalent", str(r)
    assert any("same in every order" in n for n in r.notes)


def test_an_overwriting_scatter_whose_writes_collide_in_another_order_is_unknown() -> None:
    # both updates land on position 3: which one is left is the order's, XLA's choice
    spec = _scatter("[[3], [3]]", "%u")
    reversed_ = _scatter(
        "[[3], [3]]", "%ur", "  %ur = stablehlo.reverse %u, dims = [0] : tensor<2xf32>\n"
    )
    r = tv_ir.check(spec, reversed_)
    assert r.verdict == "unknown", str(r)
    assert "not commutative" in r.reason


# the argmax body with the value's select swapped (XLA's TupleReduce mutants): the value
# is min(a, b), an order-free part of the body, while the index still depends on the order
SWAPPED = (
    ARGMAX.replace("%m = stablehlo.select %gt, %a, %c", "%m = stablehlo.select %gt, %c, %a")
    .replace("%V", "%v")
    .replace("%I", "%i")
)


def test_an_output_that_reads_only_an_order_free_part_of_the_body_is_refuted() -> None:
    # output 0 (the minimum instead of the maximum) reads only the value components, which
    # the body combines by min: commutative and associative, so every order gives it
    r = tv_ir.check(SPEC, SWAPPED)
    assert r.verdict == "not_equivalent", str(r)
    assert r.counterexample.output == 0
    assert any("same in every order" in n for n in r.notes)


def test_a_reordered_reduction_is_still_unknown_where_its_order_dependent_part_differs() -> None:
    # only the index differs (on ties), and the index reads both components
    spec_index = (
        SPEC.replace("return %r#0, %r#1", "return %r#1, %r#1")
        .replace("-> (tensor<f32>, tensor<i32>) {\n  %v0", "-> (tensor<i32>, tensor<i32>) {\n  %v0")
        .replace(": tensor<f32>, tensor<i32>\n}", ": tensor<i32>, tensor<i32>\n}")
    )
    reversed_index = (
        REVERSED.replace("return %r#0, %r#1", "return %r#1, %r#1")
        .replace("-> (tensor<f32>, tensor<i32>) {\n  %rv", "-> (tensor<i32>, tensor<i32>) {\n  %rv")
        .replace(": tensor<f32>, tensor<i32>\n}", ": tensor<i32>, tensor<i32>\n}")
    )
    r = tv_ir.check(spec_index, reversed_index)
    assert r.verdict == "unknown", str(r)
    assert "not commutative" in r.reason


# a maximum instead of the sum, beside an argmax over ties (zeros) whose result a select
# throws away: |v| < 0 holds nowhere, so the tied reduction's order reaches no output
MAX_BESIDE_DEAD_ARGMAX = """
func.func @main(%v: tensor<4xf32>) -> tensor<f32> {
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %r = stablehlo.reduce(%v init: %ninf) applies stablehlo.maximum across dimensions = [0]
    : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
  %zeros = stablehlo.constant dense<0.0> : tensor<4xf32>
  %iota = stablehlo.iota dim = 0 : tensor<4xi32>
  %v0 = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %i0 = stablehlo.constant dense<-1> : tensor<i32>
  %t:2 = stablehlo.reduce(%zeros init: %v0), (%iota init: %i0) across dimensions = [0]
    : (tensor<4xf32>, tensor<4xi32>, tensor<f32>, tensor<i32>) -> (tensor<f32>, tensor<i32>)
%REDUCER
  %f = stablehlo.convert %t#1 : (tensor<i32>) -> tensor<f32>
  %first = stablehlo.slice %v [0:1] : (tensor<4xf32>) -> tensor<1xf32>
  %x = stablehlo.reshape %first : (tensor<1xf32>) -> tensor<f32>
  %ax = stablehlo.abs %x : tensor<f32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %never = stablehlo.compare LT, %ax, %zero : (tensor<f32>, tensor<f32>) -> tensor<i1>
  %out = stablehlo.select %never, %f, %r : tensor<i1>, tensor<f32>
  return %out : tensor<f32>
}
""".replace("%REDUCER\n", ARGMAX_REDUCER)


def test_a_tied_reduction_whose_result_is_thrown_away_does_not_make_a_difference_unknown() -> None:
    r = tv_ir.check(SUM, MAX_BESIDE_DEAD_ARGMAX)
    assert r.verdict == "not_equivalent", str(r)
    assert any("same in every order" in n for n in r.notes)
