"""after_all, async_start / async_done and rng in proofs: tokens order nothing tv needs,
an asynchronous collective is the collective, and rng has meaning only where the spec
fixes its numbers."""

from __future__ import annotations

import pytest

import tv_ir

SPEC = """
func.func @main(%x: tensor<4x2xf32>) -> tensor<4x2xf32> {
  %0 = stablehlo.add %x, %x : tensor<4x2xf32>
  return %0 : tensor<4x2xf32>
}
"""

ASYNC_ALL_GATHER = """
module attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @main(%a0: tensor<2x2xf32> {mhlo.sharding = "{devices=[2,1]<=[2]}"})
      -> (tensor<4x2xf32> {mhlo.sharding = "{replicated}"}) {
    %0 = "stablehlo.async_start"(%a0) ({
    ^bb0(%x: tensor<2x2xf32>):
      %1 = "stablehlo.all_gather"(%x) {all_gather_dim = 0 : i64,
          replica_groups = dense<[GROUP]> : tensor<1x2xi64>,
          channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
          use_global_device_ids} : (tensor<2x2xf32>) -> tensor<4x2xf32>
      "stablehlo.return"(%1) : (tensor<4x2xf32>) -> ()
    }) : (tensor<2x2xf32>) -> !stablehlo.future<tensor<4x2xf32>>
    %2 = "stablehlo.async_done"(%0) : (!stablehlo.future<tensor<4x2xf32>>) -> tensor<4x2xf32>
    %3 = stablehlo.add %2, %2 : tensor<4x2xf32>
    return %3 : tensor<4x2xf32>
  }
}
"""


@pytest.mark.parametrize(
    ("group", "verdict"), [("[0, 1]", "equivalent"), ("[1, 0]", "not_equivalent")]
)
def test_an_asynchronous_all_gather_is_the_all_gather(group: str, verdict: str) -> None:
    r = tv_ir.check(SPEC, ASYNC_ALL_GATHER.replace("GROUP", group), time_limit=60)
    assert r.verdict == verdict, r


def test_tokens_change_nothing() -> None:
    impl = """
func.func @main(%x: tensor<4x2xf32>) -> tensor<4x2xf32> {
  %t0 = stablehlo.create_token : !stablehlo.token
  %t = stablehlo.after_all %t0 : !stablehlo.token
  %r:2 = stablehlo.optimization_barrier %x, %t : tensor<4x2xf32>, !stablehlo.token
  %0 = stablehlo.add %r#0, %r#0 : tensor<4x2xf32>
  return %0 : tensor<4x2xf32>
}
"""
    assert tv_ir.check(SPEC, impl, time_limit=60).verdict == "equivalent"


def _rng(a: str, b: str, et: str = "i32", distribution: str = "UNIFORM") -> str:
    return f"""
func.func @main(%x: tensor<2xf32>) -> tensor<2x{et}> {{
  %a = stablehlo.constant dense<{a}> : tensor<{et}>
  %b = stablehlo.constant dense<{b}> : tensor<{et}>
  %s = stablehlo.constant dense<[2]> : tensor<1xi64>
  %r = stablehlo.rng %a, %b, %s, distribution = {distribution}
      : (tensor<{et}>, tensor<{et}>, tensor<1xi64>) -> tensor<2x{et}>
  return %r : tensor<2x{et}>
}}
"""


def test_rng_over_one_value_is_that_value() -> None:
    constant = """
func.func @main(%x: tensor<2xf32>) -> tensor<2xi32> {
  %c = stablehlo.constant dense<7> : tensor<2xi32>
  return %c : tensor<2xi32>
}
"""
    assert tv_ir.check(_rng("7", "8"), constant, time_limit=60).verdict == "equivalent"
    assert tv_ir.check(_rng("6", "7"), constant, time_limit=60).verdict == "not_equivalent"


@pytest.mark.parametrize(
    "program",
    [_rng("0", "2"), _rng("0.0", "1.0", "f32"), _rng("0.0", "1.0", "f32", "NORMAL")],
    ids=["two values", "float interval", "normal"],
)
def test_implementation_defined_rng_is_unknown(program: str) -> None:
    # the same program on both sides: equal only if XLA drew the same numbers twice
    r = tv_ir.check(program, program, time_limit=60)
    assert r.verdict == "unknown", r
    assert "stablehlo.rng" in str(r.unsupported)
