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
from tv_ir.ir.float_constants import exact_reciprocal
from tv_ir.pipeline import prepare
from tv_ir.semantics import terms


def test_a_float64_rounding_of_a_reciprocal_reads_as_it() -> None:
    for n in (3, 12, 96, 100_000, 5120):
        assert exact_reciprocal(1 / n) == Fraction(1, n), n
        assert terms._num(1 / n) == Fraction(1, n), n
    assert exact_reciprocal(-1 / 12) == Fraction(-1, 12)
    assert exact_reciprocal(float(np.float32(1 / 12))) is None  # float64's 1/n only
    assert exact_reciprocal(0.7) is None
    assert terms._num(0.1) == Fraction(1, 10)
    assert terms._num(0.3) == Fraction(0.3)  # no reciprocal: the value of its bits


def test_a_bfloat16_mean_folded_into_its_reciprocal_is_proved() -> None:
    spec = _divided(12.0).replace("f32", "bf16")
    impl = _times(ml_dtypes.bfloat16(1 / 12)).replace("f32", "bf16")
    assert tv_ir.check(spec, impl).verdict == "equivalent"


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
    # (1/12 * 7) * x against (x / 12) * 7: the constants multiply before they meet x (in
    # float64, 1/12 * 7 is not 7/12: 3 would be exact there and show nothing)
    c = float(np.float32(1 / 12))
    seven = _program(f"""  %c = stablehlo.constant dense<{c!r}> : tensor<8xf32>
  %k = stablehlo.constant dense<7.0> : tensor<8xf32>
  %ck = stablehlo.multiply %c, %k : tensor<8xf32>
  %y = stablehlo.multiply %ck, %x : tensor<8xf32>""")
    assert tv_ir.check(_divided_then_times(7.0), seven).verdict == "equivalent"


def _divided_then_times(k: float) -> str:
    """(x / 12) * k"""
    return _program(f"""  %n = stablehlo.constant dense<12.0> : tensor<8xf32>
  %k = stablehlo.constant dense<{k!r}> : tensor<8xf32>
  %d = stablehlo.divide %x, %n : tensor<8xf32>
  %y = stablehlo.multiply %d, %k : tensor<8xf32>""")


def test_a_constant_folded_with_the_reciprocal_is_read_as_their_product() -> None:
    # (x / 12) * 0.1 against x * c, c = 0.1 / 12 rounded to f32: the simplifier's fold of
    # both constants (AdamW's (1 - b1) times a mean's gradient)
    tenth = np.float32(0.1)
    spec = _divided_then_times(float(tenth))
    folded = np.float32(float(Fraction(float(tenth)) / 12))
    assert float(folded) != float(Fraction(float(tenth)) / 12)  # rounded: another number
    assert tv_ir.check(spec, _times(folded)).verdict == "equivalent"
    off = np.nextafter(folded, np.float32(1))  # one float away: no fold of the pair's
    assert tv_ir.check(spec, _times(off)).verdict == "not_equivalent"


def test_a_constant_folded_in_f32_arithmetic_is_read_as_the_product() -> None:
    # the simplifier writes x * f32(1/12), then folds 0.9 * f32(1/12) in f32 arithmetic:
    # 0.075, one float away from 0.9 / 12 rounded once (0.074999996)
    nine = np.float32(0.9)
    spec = _divided_then_times(float(nine))
    folded = np.multiply(nine, np.float32(1 / 12), dtype=np.float32)
    assert folded != np.float32(float(Fraction(float(nine)) / 12))
    assert tv_ir.check(spec, _times(folded)).verdict == "equivalent"
