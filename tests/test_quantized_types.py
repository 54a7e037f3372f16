"""Quantized types: the spec's examples of uniform_quantize / uniform_dequantize, proofs
over dequantized storage integers, and programs whose other ops take quantized operands
(dequantize-compute-quantize in the spec) refused rather than read as integer programs."""

from __future__ import annotations

import numpy as np
import pytest

import tv_ir
from tv_ir.errors import Unsupported
from tv_ir.semantics.interpreters.interp import evaluate

PER_AXIS = "!quant.uniform<i8:f32:0, {0.1:-30,0.5:-20}>"
OTHER = "!quant.uniform<i8:f32:0, {0.1:-20,0.2:-30}>"


def program(body: str, args: str, results: str) -> str:
    return f"func.func @main({args}) -> ({results}) {{\n{body}\n}}\n"


def test_the_spec_examples() -> None:
    text = program(
        f"""  %q = stablehlo.uniform_quantize %x : (tensor<2xf32>) -> tensor<2x{PER_AXIS}>
  %qs = stablehlo.bitcast_convert %q : (tensor<2x{PER_AXIS}>) -> tensor<2xi8>
  %b = stablehlo.bitcast_convert %s : (tensor<2xi8>) -> tensor<2x{PER_AXIS}>
  %d = stablehlo.uniform_dequantize %b : (tensor<2x{PER_AXIS}>) -> tensor<2xf32>
  %r = "stablehlo.uniform_quantize"(%b) : (tensor<2x{PER_AXIS}>) -> tensor<2x{OTHER}>
  %rs = stablehlo.bitcast_convert %r : (tensor<2x{OTHER}>) -> tensor<2xi8>
  return %qs, %d, %rs : tensor<2xi8>, tensor<2xf32>, tensor<2xi8>""",
        "%x: tensor<2xf32>, %s: tensor<2xi8>",
        "tensor<2xi8>, tensor<2xf32>, tensor<2xi8>",
    )
    q, d, r = evaluate(tv_ir.load(text), [np.array([4.0, 15.0]), np.array([10, 10], np.int8)])
    np.testing.assert_array_equal(q, [10, 10])
    np.testing.assert_allclose(d, [4.0, 15.0], rtol=1e-7)
    np.testing.assert_array_equal(r, [20, 45])


def test_storage_range_and_rounding() -> None:
    t = "!quant.uniform<i8<-100:100>:f32, 0.5:4>"
    text = program(
        f"""  %q = stablehlo.uniform_quantize %x : (tensor<5xf32>) -> tensor<5x{t}>
  %s = stablehlo.bitcast_convert %q : (tensor<5x{t}>) -> tensor<5xi8>
  return %s : tensor<5xi8>""",
        "%x: tensor<5xf32>",
        "tensor<5xi8>",
    )
    (q,) = evaluate(tv_ir.load(text), [np.array([0.25, 0.75, -1000.0, 1000.0, -2.25])])
    # 0.25 / 0.5 + 4 = 4.5 -> 4 (to even), 5.5 -> 6, clamped to [-100, 100], -0.5 -> 0
    np.testing.assert_array_equal(q, [4, 6, -100, 100, 0])


DEQUANTIZED = program(
    f"""  %b = stablehlo.bitcast_convert %s : (tensor<2xi8>) -> tensor<2x{PER_AXIS}>
  %d = stablehlo.uniform_dequantize %b : (tensor<2x{PER_AXIS}>) -> tensor<2xf32>
  return %d : tensor<2xf32>""",
    "%s: tensor<2xi8>",
    "tensor<2xf32>",
)


@pytest.mark.parametrize(
    ("zero_points", "verdict"), [("-30.0, -20.0", "equivalent"), ("-30.0, 20.0", "not_equivalent")]
)
def test_dequantize_is_proved_against_its_arithmetic(zero_points: str, verdict: str) -> None:
    scales = f"{float(np.float32(0.1))!r}, 0.5"
    by_hand = program(
        f"""  %f = stablehlo.convert %s : (tensor<2xi8>) -> tensor<2xf32>
  %z = stablehlo.constant dense<[{zero_points}]> : tensor<2xf32>
  %k = stablehlo.constant dense<[{scales}]> : tensor<2xf32>
  %m = stablehlo.subtract %f, %z : tensor<2xf32>
  %d = stablehlo.multiply %m, %k : tensor<2xf32>
  return %d : tensor<2xf32>""",
        "%s: tensor<2xi8>",
        "tensor<2xf32>",
    )
    assert tv_ir.check(DEQUANTIZED, by_hand, time_limit=60).verdict == verdict


def test_quantizing_an_input_is_unknown() -> None:
    t = "!quant.uniform<i8:f32, 0.5:0>"
    text = program(
        f"""  %q = stablehlo.uniform_quantize %x : (tensor<2xf32>) -> tensor<2x{t}>
  %d = stablehlo.uniform_dequantize %q : (tensor<2x{t}>) -> tensor<2xf32>
  return %d : tensor<2xf32>""",
        "%x: tensor<2xf32>",
        "tensor<2xf32>",
    )
    r = tv_ir.check(text, text, time_limit=60)
    assert r.verdict == "unknown", r


def test_other_ops_on_quantized_types_are_refused() -> None:
    t = "!quant.uniform<i8:f32, 0.5:0>"
    text = program(
        f"""  %q = stablehlo.uniform_quantize %x : (tensor<2xf32>) -> tensor<2x{t}>
  %a = stablehlo.add %q, %q : tensor<2x{t}>
  %d = stablehlo.uniform_dequantize %a : (tensor<2x{t}>) -> tensor<2xf32>
  return %d : tensor<2xf32>""",
        "%x: tensor<2xf32>",
        "tensor<2xf32>",
    )
    with pytest.raises(Unsupported, match="stablehlo.add on quantized types"):
        tv_ir.load(text)


def test_rewriting_keeps_locations_and_storage_ranges() -> None:
    from tv_ir.ir.quantized_types import lower_quantized_types

    line = (
        "    %0 = stablehlo.uniform_quantize %arg0 : (tensor<4xf32>) -> "
        "tensor<4x!quant.uniform<i8<-127:127>:f32, 1.000000e+00:3>> loc(#loc3)"
    )
    out = lower_quantized_types(line)
    assert out.endswith("-> tensor<4xi8> loc(#loc3)")
    assert "lo = -127 : i64, hi = 127 : i64" in out
    assert "zero_points = array<i64: 3>" in out


def test_quantized_types_in_bytecode_are_unsupported_not_bad_input() -> None:
    import io

    from jaxlib.mlir import ir

    from tv_ir.ir.importer import mlir_context

    t = "tensor<2x!quant.uniform<i8:f32, 0.5>>"
    ctx = mlir_context()
    ctx.allow_unregistered_dialects = True  # to write such bytecode at all
    try:
        with ctx:
            m = ir.Module.parse(f"func.func @main(%x: {t}) -> {t} {{\n  return %x : {t}\n}}")
            buf = io.BytesIO()
            m.operation.write_bytecode(buf)
    finally:
        ctx.allow_unregistered_dialects = False
    with pytest.raises(Unsupported, match="quantized types in MLIR bytecode"):
        tv_ir.load(buf.getvalue())
