"""The evaluator prepares an op it runs more than once (its evaluator, context and result
checks: a loop body's ops run once per iteration on every device), keeps nothing for an op
run once (kept contexts cost garbage collections: 2x on a whole verification), and prepares
it again when a pass has replaced its operands, results or attributes."""

from __future__ import annotations

import numpy as np

from tv_ir.ir.importer import load
from tv_ir.ir.program import Value
from tv_ir.semantics.algebra import NumpyAlgebra
from tv_ir.semantics.interpreters.interp import Interpreter

PROGRAM = """
func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {
  %c = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %y = stablehlo.add %x, %c : tensor<2xf32>
  return %y : tensor<2xf32>
}
"""


def test_an_op_is_prepared_when_it_runs_again():
    m = load(PROGRAM)
    interp = Interpreter(m, NumpyAlgebra())
    x = np.array([1.0, 1.0])
    interp.run(m.main, [x])
    assert not interp._prepared  # run once: nothing kept
    for _ in range(3):
        (y,) = interp.run(m.main, [x])
        assert y.tolist() == [2.0, 3.0]
    assert len(interp._prepared) == len(m.main.body.ops)  # prepared once each


def test_an_op_whose_attributes_a_pass_replaced_is_prepared_again():
    m = load(PROGRAM)
    interp = Interpreter(m, NumpyAlgebra())
    x = np.array([1.0, 1.0])
    assert interp.run(m.main, [x])[0].tolist() == [2.0, 3.0]
    const = m.main.body.ops[0]
    const.attrs = {**const.attrs, "value": np.array([5.0, 7.0], dtype=np.float32)}
    assert interp.run(m.main, [x])[0].tolist() == [6.0, 8.0]


def test_an_op_whose_results_a_pass_replaced_is_checked_against_the_new_type():
    m = load(PROGRAM)
    interp = Interpreter(m, NumpyAlgebra())
    x = np.array([1.0, 1.0])
    interp.run(m.main, [x])
    add = m.main.body.ops[1]
    old = add.results[0]
    add.results = [Value(old.type.__class__((2,), "i32"), None, add, 0)]
    m.main.body.results = [add.results[0]]
    (y,) = interp.run(m.main, [x])
    assert y.dtype == np.int32  # checked (and converted) against the new result type
