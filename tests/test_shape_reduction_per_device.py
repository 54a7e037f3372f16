"""Shape reduction folds a program's device-dependent integers once per distinct value
(passes/shape_reduction/per_device.py), not once per device: 4,096 devices whose offsets
take 4 values fold a few values, and every device still reads its own offset."""

from __future__ import annotations

import numpy as np
from tv_ir.passes.shape_reduction.classes import DimClasses
from tv_ir.passes.shape_reduction.per_device import PerDevice
from tv_ir.passes.shape_reduction.rules import ShapeRules

from tv_ir.pipeline import prepare
from tv_ir.semantics.interpreters.evaluator import BlockEvaluator

DEVICES = 4096

# each device reads the 16-element block ((p / 16) % 4) of its argument
PROGRAM = f"""
module @m attributes {{mhlo.num_partitions = {DEVICES} : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func public @main(%arg0: tensor<64xf32>) -> tensor<16xf32> {{
    %0 = stablehlo.partition_id : tensor<ui32>
    %1 = stablehlo.constant dense<16> : tensor<ui32>
    %2 = stablehlo.divide %0, %1 : tensor<ui32>
    %3 = stablehlo.constant dense<4> : tensor<ui32>
    %4 = stablehlo.remainder %2, %3 : tensor<ui32>
    %5 = stablehlo.convert %4 : (tensor<ui32>) -> tensor<i32>
    %6 = stablehlo.constant dense<16> : tensor<i32>
    %7 = stablehlo.multiply %5, %6 : tensor<i32>
    %8 = stablehlo.dynamic_slice %arg0, %7, sizes = [16]
      : (tensor<64xf32>, tensor<i32>) -> tensor<16xf32>
    return %8 : tensor<16xf32>
  }}
}}
"""


def test_offsets_fold_per_distinct_value_on_every_device(monkeypatch) -> None:
    module = prepare(PROGRAM, "impl")
    calls = []
    real = BlockEvaluator.evaluate_op
    monkeypatch.setattr(
        BlockEvaluator, "evaluate_op", lambda self, op: calls.append(op) or real(self, op)
    )
    rules = ShapeRules(DimClasses(), module, "impl", DEVICES, 1)
    rules.run(module.main)
    # one device at a time, the 5 folded ops cost 5 x 4,096 evaluations
    assert len(calls) < 50, len(calls)
    offset = module.main.body.ops[-1].operands[1]
    known = rules.pos.known[offset.id]
    assert isinstance(known, PerDevice) and len(known.values) == 4
    want = [(p // 16) % 4 * 16 for p in range(DEVICES)]
    assert [int(known[p]) for p in range(DEVICES)] == want
    (rescale,) = rules.pos.rescales
    assert rescale.values == [0, 16, 32, 48]  # in the order of the first device reading each
    assert [rescale.values[i] for i in rescale.which] == want
    assert list(rules.d.offsets[rescale.key]) == [0, 16, 32, 48]


def test_per_device_values_keep_every_devices_own() -> None:
    arrays = [np.asarray(p % 3, dtype=np.int32) for p in range(10)]
    held = PerDevice.of(arrays)
    assert len(held.values) == 3 and len(held) == 10
    assert [int(held[p]) for p in range(10)] == [p % 3 for p in range(10)]
    assert held.scalars() == [0, 1, 2]
    uneven = PerDevice.of([np.arange(2) + p for p in range(4)])
    assert uneven.scalars() is None  # not one number per device: no offset
