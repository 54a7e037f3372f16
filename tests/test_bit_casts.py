"""`bitcast_convert` of values that depend on the inputs (tv_ir/semantics/bit_casts.py): an
opaque function of the bits, the same on both sides; its values known concretely."""

from __future__ import annotations

import numpy as np
import pytest

import tv_ir
from tv_ir.ir.program import TensorType
from tv_ir.semantics.algebra import UNARY
from tv_ir.semantics.bit_casts import bitcast_terms


def _numbers(terms: np.ndarray) -> np.ndarray:
    """Constant terms as floats (an undefined one, NaN)."""
    out = np.empty(terms.shape)
    for idx in np.ndindex(*terms.shape):
        p = terms[idx]
        assert p.is_const()
        out[idx] = float(p.const_value()) if repr(p) != "undefined" else np.nan
    return out


def module(arg: str, body: str, result: str) -> str:
    return f"""
func.func @main(%x: {arg}) -> {result} {{
{body}
}}
"""


SAME = module(
    "tensor<4xi32>",
    """  %0 = stablehlo.bitcast_convert %x : (tensor<4xi32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>""",
    "tensor<4xf32>",
)


def test_the_same_cast_of_the_same_values_is_proved() -> None:
    # cast, then reverse; reverse, then cast: the same function of the same elements
    other = module(
        "tensor<4xi32>",
        """  %r = stablehlo.reverse %x, dims = [0] : tensor<4xi32>
  %c = stablehlo.bitcast_convert %r : (tensor<4xi32>) -> tensor<4xf32>
  %0 = stablehlo.reverse %c, dims = [0] : tensor<4xf32>
  return %0 : tensor<4xf32>""",
        "tensor<4xf32>",
    )
    r = tv_ir.check(SAME, other, time_limit=60)
    assert r.verdict == "equivalent", r


def test_a_cast_of_other_values_is_refuted_and_replayed() -> None:
    shifted = module(
        "tensor<4xi32>",
        """  %one = stablehlo.constant dense<1> : tensor<4xi32>
  %y = stablehlo.add %x, %one : tensor<4xi32>
  %0 = stablehlo.bitcast_convert %y : (tensor<4xi32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>""",
        "tensor<4xf32>",
    )
    r = tv_ir.check(SAME, shifted, time_limit=60)
    assert r.verdict == "not_equivalent", r


def test_a_cast_to_floats_may_be_nan() -> None:
    # c - c is 0 only where the cast is finite (an exponent of all ones is inf or NaN)
    zero = module(
        "tensor<4xi32>",
        """  %0 = stablehlo.constant dense<0.0> : tensor<4xf32>
  return %0 : tensor<4xf32>""",
        "tensor<4xf32>",
    )
    diff = module(
        "tensor<4xi32>",
        """  %c = stablehlo.bitcast_convert %x : (tensor<4xi32>) -> tensor<4xf32>
  %0 = stablehlo.subtract %c, %c : tensor<4xf32>
  return %0 : tensor<4xf32>""",
        "tensor<4xf32>",
    )
    r = tv_ir.check(zero, diff, time_limit=60)
    assert r.verdict != "equivalent", r


def test_pieces_of_a_wider_value_in_the_wrong_order_are_refuted() -> None:
    spec = module(
        "tensor<3x2xi32>",
        """  %0 = stablehlo.bitcast_convert %x : (tensor<3x2xi32>) -> tensor<3xf64>
  return %0 : tensor<3xf64>""",
        "tensor<3xf64>",
    )
    swapped = module(
        "tensor<3x2xi32>",
        """  %r = stablehlo.reverse %x, dims = [1] : tensor<3x2xi32>
  %0 = stablehlo.bitcast_convert %r : (tensor<3x2xi32>) -> tensor<3xf64>
  return %0 : tensor<3xf64>""",
        "tensor<3xf64>",
    )
    assert tv_ir.check(spec, spec, time_limit=60).verdict == "equivalent"
    assert tv_ir.check(spec, swapped, time_limit=60).verdict == "not_equivalent"


@pytest.mark.parametrize(
    "src, dst, values",
    [
        ("i32", "f32", np.array([1065353216, -1082130432], dtype=np.int32)),  # 1.0, -1.0
        ("i64", "f32", np.array([1065353216 | (1073741824 << 32)], dtype=np.int64)),
        ("f32", "i32", np.array([1.5, -2.0], dtype=np.float32)),
    ],
)
def test_the_functions_values_are_the_bits(src: str, dst: str, values: np.ndarray) -> None:
    s = TensorType(values.shape, src)
    wide = values.dtype.itemsize > np.dtype(np.float32).itemsize
    d = TensorType((*values.shape, 2) if wide else values.shape, dst)
    want = values.view({"f32": np.float32, "i32": np.int32}[dst]).reshape(d.shape)
    terms = bitcast_terms(np.asarray(values.astype(np.float64), dtype=object), s, d)
    got = _numbers(terms)  # constants fold through the registered functions
    assert np.array_equal(got, want.astype(np.float64))


def test_a_packed_wider_value_decodes_its_pieces() -> None:
    pieces = np.array([[0, 1072693248], [-1, -1]], dtype=np.int32)  # 1.0 and NaN in f64
    terms = bitcast_terms(
        np.asarray(pieces.astype(np.float64), dtype=object),
        TensorType((2, 2), "i32"),
        TensorType((2,), "f64"),
    )
    got = _numbers(terms)
    assert got[0] == 1.0 and np.isnan(got[1])
    assert "bitcast_i32_f64" in UNARY


@pytest.mark.parametrize(
    "src, dst, shape",
    [(((), "f32"), ((), "i32"), (3, 4)), (((), "f64"), ((2,), "i32"), (5,))],
)
def test_a_cast_in_a_region_run_on_arrays_casts_each_element(src, dst, shape) -> None:
    # a sort's comparator runs on whole lanes (tv_ir/semantics/ops/reduction.py): a scalar
    # cast there sees an array of scalars, and casts each (it failed, and the comparator ran
    # once per comparison: minutes for a TopK's 200,000 keys)
    from tv_ir.semantics.algebra import NumpyAlgebra

    x = np.random.default_rng(0).standard_normal(shape)
    s, d = TensorType(src[0], src[1]), TensorType(dst[0], dst[1])
    got = NumpyAlgebra().bitcast(x, s, d)
    assert got.shape == shape + tuple(d.shape)
    one = [NumpyAlgebra().bitcast(v, s, d) for v in x.reshape(-1)]
    assert np.array_equal(got.reshape(-1, *d.shape), np.stack(one))
