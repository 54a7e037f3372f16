"""Large factorisations and triangular solves on symbolic matrices: each result element an
opaque function of the elements the op reads (tv_ir/semantics/ops/linalg.py), so a
partitioned program that runs the op itself on the same matrices is proved, and one that
feeds it other matrices, or asks for another factor, is refuted."""

from __future__ import annotations

import numpy as np
import pytest

import tv_ir
from tv_ir.semantics import terms as T
from tv_ir.semantics.interpreters.interp import evaluate
from tv_ir.semantics.ops.linalg import OPAQUE_N
from tv_ir.semantics.symbolic import SymbolicAlgebra

N = 16
assert N > OPAQUE_N

CHOLESKY = f"""
func.func @main(%a: tensor<4x{N}x{N}xf32>) -> tensor<4x{N}x{N}xf32> {{
  %0 = stablehlo.cholesky %a, lower = true : tensor<4x{N}x{N}xf32>
  return %0 : tensor<4x{N}x{N}xf32>
}}
"""

# per device on 2 devices: the batch split in halves, each device factorising its own
CHOLESKY_PER_DEVICE = f"""
module @m attributes {{
    mhlo.spmd_parameters_shardings = ["{{devices=[2,1,1]0,1}}"],
    mhlo.spmd_output_sharding = "{{devices=[2,1,1]0,1}}"}} {{
  func.func @main(%a: tensor<2x{N}x{N}xf32>) -> tensor<2x{N}x{N}xf32> {{
    %0 = stablehlo.cholesky %a, lower = true : tensor<2x{N}x{N}xf32>
    return %0 : tensor<2x{N}x{N}xf32>
  }}
}}
"""


def test_batch_split_cholesky_is_proved() -> None:
    r = tv_ir.check(CHOLESKY, CHOLESKY_PER_DEVICE)
    assert r.verdict == "equivalent", r.reason


def test_cholesky_of_the_other_triangle_is_refuted() -> None:
    upper = CHOLESKY_PER_DEVICE.replace("lower = true", "lower = false")
    r = tv_ir.check(CHOLESKY, upper)
    assert r.verdict == "not_equivalent", r.reason


def test_cholesky_of_another_batch_member_is_refuted() -> None:
    """Each device factorises its matrices in reverse order: random matrices are not
    positive definite (NaN everywhere on both sides), so one simulation run makes them
    diagonally dominant."""
    swapped = CHOLESKY_PER_DEVICE.replace(
        "%0 = stablehlo.cholesky %a,",
        f"%r = stablehlo.reverse %a, dims = [0] : tensor<2x{N}x{N}xf32>\n"
        "    %0 = stablehlo.cholesky %r,",
    )
    r = tv_ir.check(CHOLESKY, swapped)
    assert r.verdict == "not_equivalent", r.reason


SOLVE = f"""
func.func @main(%a: tensor<2x{N}x{N}xf32>, %b: tensor<2x{N}x6xf32>) -> tensor<2x{N}x6xf32> {{
  %0 = "stablehlo.triangular_solve"(%a, %b) {{left_side = true, lower = true,
    unit_diagonal = UNIT, transpose_a = #stablehlo<transpose NO_TRANSPOSE>}}
    : (tensor<2x{N}x{N}xf32>, tensor<2x{N}x6xf32>) -> tensor<2x{N}x6xf32>
  return %0 : tensor<2x{N}x6xf32>
}}
"""

# per device on 2 devices: the matrices whole on both, the right-hand sides' columns split
SOLVE_PER_DEVICE = f"""
module @m attributes {{
    mhlo.spmd_parameters_shardings = ["{{replicated}}", "{{devices=[1,1,2]0,1}}"],
    mhlo.spmd_output_sharding = "{{devices=[1,1,2]0,1}}"}} {{
  func.func @main(%a: tensor<2x{N}x{N}xf32>, %b: tensor<2x{N}x3xf32>) -> tensor<2x{N}x3xf32> {{
    %0 = "stablehlo.triangular_solve"(%a, %b) {{left_side = true, lower = true,
      unit_diagonal = UNIT, transpose_a = #stablehlo<transpose NO_TRANSPOSE>}}
      : (tensor<2x{N}x{N}xf32>, tensor<2x{N}x3xf32>) -> tensor<2x{N}x3xf32>
    return %0 : tensor<2x{N}x3xf32>
  }}
}}
"""


@pytest.mark.parametrize("unit", ["true", "false"])
def test_solve_with_columns_split_is_proved(unit: str) -> None:
    r = tv_ir.check(SOLVE.replace("UNIT", unit), SOLVE_PER_DEVICE.replace("UNIT", unit))
    assert r.verdict == "equivalent", r.reason


def test_solve_with_another_diagonal_is_refuted() -> None:
    r = tv_ir.check(SOLVE.replace("UNIT", "true"), SOLVE_PER_DEVICE.replace("UNIT", "false"))
    assert r.verdict == "not_equivalent", r.reason


@pytest.mark.parametrize("program", ["cholesky", "solve"])
def test_opaque_terms_evaluate_to_the_concrete_op(program: str) -> None:
    """The opaque elements, evaluated at numbers, are the op run on those numbers."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2 if program == "solve" else 4, N, N)) + N * np.eye(N)
    if program == "cholesky":
        text, args = CHOLESKY, [a]
    else:
        text, args = SOLVE.replace("UNIT", "false"), [a, rng.standard_normal((2, N, 6))]
    module = tv_ir.load(text)
    concrete = evaluate(module, args)
    env, symbols = {}, []
    for k, x in enumerate(args):
        s = T.symbol_array(f"in{k}", x.shape)
        env.update((T.as_atom(p).id, float(v)) for p, v in zip(s.flat, x.flat, strict=True))
        symbols.append(s)
    symbolic = evaluate(module, symbols, alg=SymbolicAlgebra())
    assert any(isinstance(e, T.Poly) and not e.is_const() for e in symbolic[0].flat)
    np.testing.assert_allclose(T.instantiate(symbolic[0], env), concrete[0], rtol=1e-9)
