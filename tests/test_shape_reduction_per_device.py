"""Shape reduction folds a program's device-dependent integers once per distinct value
(passes/shape_reduction/per_device.py), not once per device: 4,096 devices whose offsets
take 4 values fold a few values, and every device still reads its own offset."""

from __future__ import annotations

import numpy as np
import pytest
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


def _folded(text: str, monkeypatch, devices: int = DEVICES) -> tuple:
    """(module, its shape rules run on every device, the single-op evaluations made)."""
    module = prepare(text, "impl")
    calls = []
    real = BlockEvaluator.evaluate_op
    monkeypatch.setattr(
        BlockEvaluator, "evaluate_op", lambda self, op: calls.append(op) or real(self, op)
    )
    rules = ShapeRules(DimClasses(), module, "impl", devices, 1)
    rules.run(module.main)
    return module, rules, calls


def test_offsets_fold_per_distinct_value_on_every_device(monkeypatch) -> None:
    module, rules, calls = _folded(PROGRAM, monkeypatch)
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
    # a scalar broadcast to a mask's shape (8192 x 8192 in the 405B-shaped step) is one number,
    # read without comparing its elements; a partly broadcast one is compared
    wide = PerDevice.same(np.broadcast_to(np.int32(7), (8192, 8192)), 4)
    assert wide.scalars() == [7]
    rows = np.broadcast_to(np.arange(3, dtype=np.int32)[:, None], (3, 5))
    assert PerDevice.same(rows, 4).scalars() is None
    assert PerDevice.same(np.broadcast_to(np.int32(2), (3, 5)).copy(), 4).scalars() == [2]
    assert PerDevice.same(np.zeros((0, 3), np.int32), 4).scalars() is None


# XLA's form: a device's offset looked up in a constant table at `partition_id`, then in a
# second table at that coordinate (a start past the table's end is clamped, as the op says)
def _tables(devices: int) -> str:
    return f"""
module @m attributes {{mhlo.num_partitions = {devices} : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func public @main(%arg0: tensor<64xf32>) -> tensor<16xf32> {{
    %0 = stablehlo.partition_id : tensor<ui32>
    %1 = stablehlo.constant dense<{[(p // 16) % 4 for p in range(devices)]}>
      : tensor<{devices}xui32>
    %2 = stablehlo.dynamic_slice %1, %0, sizes = [1]
      : (tensor<{devices}xui32>, tensor<ui32>) -> tensor<1xui32>
    %3 = stablehlo.reshape %2 : (tensor<1xui32>) -> tensor<ui32>
    %4 = stablehlo.constant dense<[0, 16, 32, 48, 64]> : tensor<5xi32>
    %5 = stablehlo.constant dense<[[0, 1], [2, 3], [4, 5], [6, 7]]> : tensor<4x2xi32>
    %6 = stablehlo.constant dense<3> : tensor<ui32>
    %7 = stablehlo.add %3, %6 : tensor<ui32>
    %8 = stablehlo.constant dense<0> : tensor<ui32>
    %9 = stablehlo.dynamic_slice %5, %7, %8, sizes = [2, 2]
      : (tensor<4x2xi32>, tensor<ui32>, tensor<ui32>) -> tensor<2x2xi32>
    %10 = stablehlo.dynamic_slice %4, %3, sizes = [1]
      : (tensor<5xi32>, tensor<ui32>) -> tensor<1xi32>
    %11 = stablehlo.reshape %10 : (tensor<1xi32>) -> tensor<i32>
    %12 = stablehlo.dynamic_slice %arg0, %11, sizes = [16]
      : (tensor<64xf32>, tensor<i32>) -> tensor<16xf32>
    return %12 : tensor<16xf32>
  }}
}}
"""


@pytest.mark.parametrize("devices", [DEVICES, 8192])
def test_table_lookups_fold_for_all_devices_at_once_as_each_device_would(
    devices, monkeypatch
) -> None:
    # on 8,192 devices XLA's table has 8,192 entries: more than a folded value may hold,
    # but a constant is one array for all devices, and is read
    module, rules, calls = _folded(_tables(devices), monkeypatch, devices)
    assert len(calls) < 50, len(calls)  # not a lookup per device
    slices = [op for op in module.main.body.ops if op.name == "stablehlo.dynamic_slice"]
    coordinate = [(p // 16) % 4 for p in range(devices)]
    offset = rules.pos.known[slices[-1].operands[1].id]
    assert [int(offset[p]) for p in range(devices)] == [16 * c for c in coordinate]
    (block,) = [op for op in slices if op.results[0].type.shape == (2, 2)]
    rows = rules.pos.known[block.results[0].id]  # the 2 x 2 block from row 3 + c, clamped
    table = np.arange(8).reshape(4, 2)
    for p in (0, 16, 33, devices - 1):
        np.testing.assert_array_equal(rows[p], table[2:4])
    assert len(rows.values) == 1


def test_per_device_values_are_told_apart_byte_for_byte_in_either_path() -> None:
    # arrays of one shape are compared in one numpy step; mixed shapes one at a time: the
    # same distinct values (-0.0 and 0.0 differ in their bytes), in order of first holder
    one = [np.array([1.0, -0.0]), np.array([1.0, 0.0]), np.array([1.0, -0.0]), np.array([2.0, 0])]
    x = PerDevice.of(one)
    assert len(x.values) == 3 and x.which.tolist() == [0, 1, 0, 2]
    assert [v.tolist() for v in x.values] == [[1.0, -0.0], [1.0, 0.0], [2.0, 0.0]]
    mixed = [*one, np.array(5)]
    y = PerDevice.of(mixed)
    assert y.which.tolist() == [0, 1, 0, 2, 3]
    assert all(np.array_equal(y[d], a) for d, a in enumerate(mixed))
    ints = PerDevice.of([np.array(k % 3, np.int32) for k in range(5000)])
    assert ints.which.tolist() == [k % 3 for k in range(5000)]


# XLA's offset table with a different entry on each device (a shard's start along a merged
# axis): looked up, reshaped to a scalar and scaled, for 8,192 distinct values at once
def _own_offsets(devices: int) -> str:
    return f"""
module @m attributes {{mhlo.num_partitions = {devices} : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func public @main(%arg0: tensor<{devices * 2}xf32>) -> tensor<2xf32> {{
    %0 = stablehlo.partition_id : tensor<ui32>
    %1 = stablehlo.constant dense<{[(p * 5) % devices for p in range(devices)]}>
      : tensor<{devices}xui32>
    %2 = stablehlo.dynamic_slice %1, %0, sizes = [1]
      : (tensor<{devices}xui32>, tensor<ui32>) -> tensor<1xui32>
    %3 = stablehlo.reshape %2 : (tensor<1xui32>) -> tensor<ui32>
    %4 = stablehlo.constant dense<2> : tensor<ui32>
    %5 = stablehlo.multiply %3, %4 : tensor<ui32>
    %6 = stablehlo.dynamic_slice %arg0, %5, sizes = [2]
      : (tensor<{devices * 2}xf32>, tensor<ui32>) -> tensor<2xf32>
    return %6 : tensor<2xf32>
  }}
}}
"""


def test_a_distinct_offset_on_each_of_8192_devices_is_folded_at_once(monkeypatch) -> None:
    # the lookup, the reshape to a scalar and the scaling each fold all 8,192 values in one
    # numpy step (the reshape, one device's value at a time, cost 8,192 evaluations)
    devices = 8192
    module, rules, calls = _folded(_own_offsets(devices), monkeypatch, devices)
    assert len(calls) < 50, len(calls)
    offset = rules.pos.known[module.main.body.ops[-1].operands[1].id]
    assert offset.count == devices
    assert [int(offset[p]) for p in range(devices)] == [
        (p * 5) % devices * 2 for p in range(devices)
    ]
    (rescale,) = [r for r in rules.pos.rescales if r.op is module.main.body.ops[-1]]
    assert [rescale.values[i] for i in rescale.which] == [
        (p * 5) % devices * 2 for p in range(devices)
    ]


@pytest.mark.parametrize("counts", [(3, 4), (2, 1, 5), (100, 100, 100)])
def test_combinations_are_numbered_by_their_first_device(counts) -> None:
    # operands' values combine into the distinct combinations devices hold, numbered in the
    # order of the first device holding each: through a table of every key when the value
    # counts multiply to a few per device, by sorting the keys when they do not (100^3)
    from tv_ir.passes.shape_reduction.per_device import combinations

    rng = np.random.default_rng(len(counts))
    devices = 1000
    operands = []
    for n in counts:
        which = rng.integers(0, n, devices)
        _, first = np.unique(which, return_index=True)
        order = np.argsort(first)  # renumbered by first holder, as PerDevice's are
        rank = np.empty(n, dtype=np.intp)
        rank[which[np.sort(first)]] = np.arange(len(order))
        held = PerDevice([np.asarray(k) for k in range(len(order))], rank[which])
        operands.append(held)
    combos, which = combinations(operands)
    want: dict[tuple, int] = {}
    for d in range(devices):
        want.setdefault(tuple(int(x.which[d]) for x in operands), len(want))
    assert combos == list(want)
    assert which.tolist() == [
        want[tuple(int(x.which[d]) for x in operands)] for d in range(devices)
    ]


def test_values_folded_together_are_held_as_one_array() -> None:
    # 8,192 distinct values stay the rows of one array: read as numbers without a list
    rows = np.arange(8192, dtype=np.int32) * 3
    held = PerDevice(rows, np.arange(8192)[::-1].copy())
    assert held.count == 8192 and held.scalars() == (rows.astype(int)).tolist()
    assert int(held[0]) == 3 * 8191 and len(held.values) == 8192
    flat = PerDevice(np.array([[2, 2], [3, 4]], np.int32), np.array([0, 1]))
    assert flat.scalars() is None  # the second value is not one number
    assert PerDevice(np.array([[2, 2], [3, 3]]), np.array([1, 0])).scalars() == [2, 3]
    assert PerDevice(np.zeros((2, 0), np.int32), np.array([0, 1])).scalars() is None
