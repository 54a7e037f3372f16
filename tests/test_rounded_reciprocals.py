"""A compiler's `x * (1/n)` for `x / n` is the same program: where the pair divides by n, a
one-number float constant that is 1/n rounded to its type is read as 1/n; every other
constant is the exact value of its bits (docs/equivalence.md, "Constants")."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from tv_ir.passes import reciprocal_constants

import tv_ir
from tv_ir.ir.float_constants import exact_reciprocal, integer_reciprocals
from tv_ir.pipeline import prepare


def test_which_floats_round_a_reciprocal() -> None:
    for n in (3, 12, 96, 100_000, 5120):
        assert integer_reciprocals(np.float32(1 / n)) == 1 / n, n
    assert integer_reciprocals(np.float32(-1 / 12)) == -1 / 12
    assert integer_reciprocals(np.float16(1 / 3)) == 1 / 3
    assert integer_reciprocals(np.asarray(1 / 3, ml_dtypes.bfloat16), ml_dtypes.bfloat16) == 1 / 3
    near = np.nextafter(np.float32(1 / 12), np.float32(1))  # rounds no 1/n
    assert integer_reciprocals(near) == float(near)
    for c in (np.float32(0.7), np.float32(3.0), np.float32(0.0)):
        assert integer_reciprocals(c) == float(c)
    # 1/n rounded to bf16 for large n is also 1/(n + 1): no one n, so the bits
    big = np.asarray(1 / 1000, ml_dtypes.bfloat16)
    assert integer_reciprocals(big, ml_dtypes.bfloat16) == float(big)
    assert exact_reciprocal(1 / 12) == Fraction(1, 12)
    assert exact_reciprocal(float(np.float32(1 / 12))) is None  # float64's 1/n only


def _program(body: str) -> str:
    return f"""func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {{
{body}
  return %y : tensor<8xf32>
}}"""


def _divided(n: float) -> str:
    return _program(f"""  %n = stablehlo.constant dense<{n!r}> : tensor<8xf32>
  %y = stablehlo.divide %x, %n : tensor<8xf32>""")


def _times(c) -> str:
    return _program(f"""  %c = stablehlo.constant dense<{float(c)!r}> : tensor<f32>
  %b = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<8xf32>
  %y = stablehlo.multiply %x, %b : tensor<8xf32>""")


def test_a_division_folded_into_a_rounded_reciprocal_is_proved() -> None:
    report = tv_ir.check(_divided(12.0), _times(np.float32(1 / 12)))
    assert report.verdict == "equivalent", report
    # either way round, and over a divisor JAX writes as a broadcast of a scalar
    assert tv_ir.check(_times(np.float32(1 / 96)), _divided(96.0)).verdict == "equivalent"


@pytest.mark.parametrize(
    "c", [np.nextafter(np.float32(1 / 12), np.float32(1)), np.float32(1 / 11)], ids=str
)
def test_only_rounding_is_forgiven(c) -> None:
    report = tv_ir.check(_divided(12.0), _times(c))
    assert report.verdict == "not_equivalent", report


def test_a_reciprocal_no_program_divides_by_keeps_its_bits() -> None:
    spec, impl = prepare(_times(np.float32(0.1)), "spec"), prepare(_times(np.float32(0.1)), "impl")
    assert reciprocal_constants.run(spec, impl) == 0
    spec, impl = prepare(_divided(10.0), "spec"), prepare(_times(np.float32(0.1)), "impl")
    assert reciprocal_constants.run(spec, impl) == 1


def test_read_reciprocals_are_exact_in_arithmetic_between_constants() -> None:
    # (1/12 * 3) * x against (x / 12) * 3: the constants multiply before they meet x
    c = float(np.float32(1 / 12))
    three = _program(f"""  %c = stablehlo.constant dense<{c!r}> : tensor<8xf32>
  %k = stablehlo.constant dense<3.0> : tensor<8xf32>
  %ck = stablehlo.multiply %c, %k : tensor<8xf32>
  %y = stablehlo.multiply %ck, %x : tensor<8xf32>""")
    spec = _program("""  %n = stablehlo.constant dense<12.0> : tensor<8xf32>
  %m = stablehlo.constant dense<3.0> : tensor<8xf32>
  %d = stablehlo.divide %x, %n : tensor<8xf32>
  %y = stablehlo.multiply %d, %m : tensor<8xf32>""")
    assert tv_ir.check(spec, three).verdict == "equivalent"
