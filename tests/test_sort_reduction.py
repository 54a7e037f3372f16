"""Sorts at reduced shapes: the sorted dimension shrinks when the comparator is a strict weak
order (passes/shape_reduction/sorts.py), XLA's bit-cast float comparator has a meaning
(passes/total_order_compare.py), and the concrete sort runs every lane at once
(tv_ir/semantics/ops/lane_merge_sort.py). Programs as users write them (`jax.jit` with
shardings, `shard_map`), and HLO as XLA's TopK lowering writes its comparator.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tv_ir.frontends.jax import verify
from tv_ir.passes import run_pipeline

import tv_ir
from tv_ir.ir.program import walk
from tv_ir.semantics.comparator_order import strict_weak_order_violation
from tv_ir.semantics.ops.lane_merge_sort import merge_sort_lanes

S = jax.ShapeDtypeStruct
LIMIT = 120.0  # seconds; never asserted (a run out of time is unknown, a failure)


@functools.cache
def mesh() -> Mesh:
    return Mesh(np.array(jax.devices()[:8]), ("x",))


def sorted_rows(x):
    return jnp.sort(x, axis=1)


def test_sort_along_sharded_dimension_shrinks_and_is_proved() -> None:
    sh = NamedSharding(mesh(), P(None, "x"))
    fn = jax.jit(sorted_rows, in_shardings=sh, out_shardings=sh)
    r = verify(fn, S((16, 1024), jnp.float32), time_limit=LIMIT)
    assert r.verdict == "equivalent", r
    assert "1024 -> " in str(r) and "sorted dimension" not in str(r), r


def test_sorting_each_shard_alone_is_refuted() -> None:
    """A sort of the shards without merging them (BUG) is refuted at reduced shapes, and
    the counterexample replays at the real sizes."""
    local = jax.shard_map(sorted_rows, mesh=mesh(), in_specs=P(None, "x"), out_specs=P(None, "x"))
    r = verify(local, S((16, 1024), jnp.float32), spec=sorted_rows, time_limit=LIMIT)
    assert r.verdict == "not_equivalent", r
    assert "1024 -> " in str(r), r
    assert any("replayed at the real sizes" in n for n in r.notes), r.notes


def argsort_rows(x):
    return jnp.argsort(x, axis=1)


def test_argsort_along_sharded_dimension_shrinks_and_is_proved() -> None:
    """XLA sorts (x, iota) after an all_to_all: the indices stay positions of the sorted
    dimension through its reshapes and per-device slices, so it shrinks."""
    sh = NamedSharding(mesh(), P(None, "x"))
    fn = jax.jit(argsort_rows, in_shardings=sh, out_shardings=sh)
    r = verify(fn, S((16, 1024), jnp.float32), time_limit=LIMIT)
    assert r.verdict == "equivalent", r
    assert "spec argument 0 dim 1: 1024 -> " in str(r), r


def test_argsort_of_each_shard_alone_is_refuted() -> None:
    """Indices of each shard's own sort (BUG: neither merged nor offset) are refuted."""
    local = jax.shard_map(argsort_rows, mesh=mesh(), in_specs=P(None, "x"), out_specs=P(None, "x"))
    r = verify(local, S((16, 1024), jnp.float32), spec=argsort_rows, time_limit=LIMIT)
    assert r.verdict == "not_equivalent", r


def descending(x):
    return jnp.sort(x, axis=1)[:, ::-1]


def test_descending_sort_two_ways_is_proved() -> None:
    """-sort(-x) is sort(x) reversed (ties are equal values): the two sorts differ as
    programs, and are proved equal at reduced shapes."""
    sh = NamedSharding(mesh(), P("x", None))
    negated = jax.jit(lambda x: -jnp.sort(-x, axis=1), in_shardings=sh, out_shardings=sh)
    r = verify(negated, S((8, 512), jnp.float32), spec=descending, time_limit=LIMIT)
    assert r.verdict == "equivalent" and "512 -> " in str(r), r


def test_ascending_for_descending_is_refuted() -> None:
    sh = NamedSharding(mesh(), P("x", None))
    wrong = jax.jit(sorted_rows, in_shardings=sh, out_shardings=sh)  # BUG: not reversed
    r = verify(wrong, S((8, 512), jnp.float32), spec=descending, time_limit=LIMIT)
    assert r.verdict == "not_equivalent", r


# a comparator that is not a strict weak order (`<=`: not irreflexive): the result of a sort
# by it depends on the algorithm, so its sorted dimension keeps its size
SORT_LE = """
func.func @main(%x: tensor<4x48xf32>) -> tensor<4x48xf32> {
  %0 = "stablehlo.sort"(%x) ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %c = stablehlo.compare DIRECTION, %a, %b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %c : tensor<i1>
  }) {dimension = 1 : i64, is_stable = true} : (tensor<4x48xf32>) -> tensor<4x48xf32>
  return %0 : tensor<4x48xf32>
}
"""


def test_comparator_that_is_not_a_strict_weak_order_keeps_the_sorted_dimension() -> None:
    le = SORT_LE.replace("DIRECTION", "LE")
    r = tv_ir.check(le, le, time_limit=LIMIT)
    assert "48 kept (sorted dimension of sort" in str(r) and "not a strict weak order" in str(r)
    lt = SORT_LE.replace("DIRECTION", "LT")
    r = tv_ir.check(lt, lt, time_limit=LIMIT)
    assert r.verdict == "equivalent" and "48 -> " in str(r), r


@pytest.mark.parametrize(
    ("direction", "violation"),
    [("LT", None), ("GT", None), ("LE", "itself"), ("NE", "but not less"), ("EQ", "itself")],
)
def test_strict_weak_order_on_small_values(direction: str, violation: str | None) -> None:
    m = tv_ir.load(SORT_LE.replace("DIRECTION", direction))
    [sort] = [op for op in walk(m.main.body) if op.name == "stablehlo.sort"]
    found = strict_weak_order_violation(m, sort.regions[0].block)
    assert (found is None) if violation is None else (violation in found), found


# XLA's TopK comparator (spmd_partitioner_test.cc): floats ordered by their bits
TOPK_IDIOM = """
HloModule module

gt {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ia = s32[] bitcast-convert(a)
  zero = s32[] constant(0)
  na = pred[] compare(ia, zero), direction=LT
  max = u32[] constant(MAXINT)
  ua = u32[] bitcast-convert(a)
  fa = u32[] subtract(max, ua)
  ka.neg = s32[] bitcast-convert(fa)
  ka = s32[] select(na, ka.neg, ia)
  ib = s32[] bitcast-convert(b)
  nb = pred[] compare(ib, zero), direction=LT
  ub = u32[] bitcast-convert(b)
  fb = u32[] subtract(max, ub)
  kb.neg = s32[] bitcast-convert(fb)
  kb = s32[] select(nb, kb.neg, ib)
  ROOT gt = pred[] compare(ka, kb), direction=GT
}

ENTRY entry {
  x = f32[4,40] parameter(0)
  ROOT s = f32[4,40] sort(x), dimensions={1}, is_stable=true, to_apply=gt
}
"""
TOTAL_ORDER = """
HloModule module

gt {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT gt = pred[] compare(a, b), direction=GT, type=TOTALORDER
}

ENTRY entry {
  x = f32[4,40] parameter(0)
  ROOT s = f32[4,40] sort(x), dimensions={1}, is_stable=true, to_apply=gt
}
"""


def test_bitcast_comparator_is_the_float_total_order() -> None:
    idiom = TOPK_IDIOM.replace("MAXINT", "2147483647")
    r = tv_ir.check(idiom, TOTAL_ORDER, time_limit=LIMIT)
    assert r.verdict == "equivalent", r
    m = run_pipeline(tv_ir.load(idiom))
    assert not any(op.name == "stablehlo.bitcast_convert" for op in walk(m.main.body))


def test_bitcast_comparator_off_by_one_is_not_rewritten() -> None:
    """0x7ffffffe in place of 0x7fffffff is not the total order (two negative floats one ulp
    apart tie): it keeps its bit casts, which have no symbolic meaning."""
    wrong = TOPK_IDIOM.replace("MAXINT", "2147483646")
    m = run_pipeline(tv_ir.load(wrong))
    assert any(op.name == "stablehlo.bitcast_convert" for op in walk(m.main.body))
    r = tv_ir.check(wrong, TOTAL_ORDER, time_limit=LIMIT)
    assert r.verdict != "equivalent", r


SPECIAL = np.array(
    [-np.inf, -2.5, -1e-40, -0.0, 0.0, 1e-40, 1.0, np.inf, np.nan, -np.nan], dtype=np.float32
)


def test_rewritten_comparator_agrees_on_every_special_float() -> None:
    """The pass keeps the comparator's meaning on infinities, signed zeros, subnormals and
    NaNs of both signs (run concretely before and after)."""
    from tv_ir.semantics.algebra import NumpyAlgebra
    from tv_ir.semantics.interpreters.evaluator import BlockEvaluator

    before = tv_ir.load(TOPK_IDIOM.replace("MAXINT", "2147483647"))
    after = run_pipeline(tv_ir.load(TOPK_IDIOM.replace("MAXINT", "2147483647")))

    def comparator(m):
        [sort] = [op for op in walk(m.main.body) if op.name == "stablehlo.sort"]
        run = BlockEvaluator(m, NumpyAlgebra())
        return lambda a, b: bool(run._block(sort.regions[0].block, [a, b], top=False)[0])

    old, new = comparator(before), comparator(after)
    for a in SPECIAL.astype(np.float64):
        for b in SPECIAL.astype(np.float64):
            assert old(np.asarray(a), np.asarray(b)) == new(np.asarray(a), np.asarray(b)), (a, b)


def test_lane_merge_sort_is_the_stable_sort() -> None:
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 3, 5, 8, 13, 33):
        keys = rng.integers(0, 4, size=(3, n)).astype(np.float64)
        payload = rng.integers(0, 1000, size=(3, n))
        got = merge_sort_lanes([keys, payload], lambda a: a[0] < a[1])
        order = np.argsort(keys, axis=1, kind="stable")
        assert (got[0] == np.take_along_axis(keys, order, 1)).all()
        assert (got[1] == np.take_along_axis(payload, order, 1)).all()
