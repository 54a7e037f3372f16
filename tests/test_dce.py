"""passes/dce.py: pure ops nothing reads are dropped; effects and everything read stay."""

from __future__ import annotations

from tv_ir.passes import dce

from tv_ir.ir.importer import load
from tv_ir.ir.program import walk

PROGRAM = """
func.func @main(%x: tensor<4xf32>, %n: tensor<i32>) -> tensor<4xf32> {
  %c = stablehlo.constant dense<2.0> : tensor<f32>
  %dead = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<128x4xf32>
  %dead2 = stablehlo.negate %dead : tensor<128x4xf32>
  %sum = "stablehlo.all_reduce"(%x) ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
  }) {replica_groups = dense<[[0]]> : tensor<1x1xi64>} : (tensor<4xf32>) -> tensor<4xf32>
  %zero = stablehlo.constant dense<0> : tensor<i32>
  %r:2 = stablehlo.while(%i = %zero, %acc = %x) : tensor<i32>, tensor<4xf32>
    cond {
      %lt = stablehlo.compare LT, %i, %n : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    } do {
      %one = stablehlo.constant dense<1> : tensor<i32>
      %unread = stablehlo.multiply %acc, %acc : tensor<4xf32>
      %next = stablehlo.add %i, %one : tensor<i32>
      %wide = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<4xf32>
      %acc2 = stablehlo.add %acc, %wide : tensor<4xf32>
      stablehlo.return %next, %acc2 : tensor<i32>, tensor<4xf32>
    }
  return %r#1 : tensor<4xf32>
}
"""


def test_unread_pure_ops_go_and_the_rest_stays() -> None:
    module = dce.run(load(PROGRAM))
    names = [op.name.split(".")[-1] for op in walk(module.main.body)]
    assert "negate" not in names and "multiply" not in names  # read by nothing
    assert names.count("broadcast_in_dim") == 1  # the one the loop body reads
    assert "all_reduce" in names  # a collective is its own communication: kept
    assert "while" in names and "compare" in names
    # a constant read only inside the loop body (captured from outside) is live
    assert names.count("constant") == 3
