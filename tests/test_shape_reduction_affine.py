"""Affine classes (`passes/shape_reduction/affine.py`): a dimension split unevenly over
devices, as XLA's SPMD partitioner writes it (pad to whole tiles, a tile per device at
offsets read from a table by `partition-id`, all-gather, slice back), shrinks with its
remainders kept: 1003 = 2 x 502 - 1 -> 2 x U' - 1.

Hand-written per-device HLO against its single-device module (`tv check BEFORE AFTER`):
correct partitions are proved at reduced shapes, planted bugs (a tile offset off by one, a
pad value that the remainder makes visible) stay refuted, with the real programs run and
as if they were too large to run (the witnesses at a larger unit decide).
"""

from __future__ import annotations

import pytest
from tv_ir.passes.shape_reduction.affine import Affine, affine_unit
from tv_ir.passes.shape_reduction.classes import DimClasses

import tv_ir
from tv_ir.prover import real_size

N, TILE = 1003, 502  # 1003 split 2 ways: tiles of 502, the last one 501 and a pad

SPEC_MUL = f"""HloModule spec

ENTRY e {{
  x = f32[{N}] parameter(0), sharding={{replicated}}
  y = f32[{N}] parameter(1), sharding={{replicated}}
  ROOT r = f32[{N}] multiply(x, y), sharding={{replicated}}
}}
"""


def impl_mul(offsets: str = f"0, {TILE}") -> str:
    """x * y computed tile by tile on 2 devices, as XLA partitions it."""
    return f"""HloModule impl, num_partitions=2

ENTRY e {{
  x = f32[{N}] parameter(0), sharding={{replicated}}
  y = f32[{N}] parameter(1), sharding={{replicated}}
  zero = f32[] constant(0)
  xp = f32[{2 * TILE}] pad(x, zero), padding=0_1
  yp = f32[{2 * TILE}] pad(y, zero), padding=0_1
  offsets = s32[2] constant({{{offsets}}})
  pid = u32[] partition-id()
  o1 = s32[1] dynamic-slice(offsets, pid), dynamic_slice_sizes={{1}}
  o = s32[] reshape(o1)
  xs = f32[{TILE}] dynamic-slice(xp, o), dynamic_slice_sizes={{{TILE}}}
  ys = f32[{TILE}] dynamic-slice(yp, o), dynamic_slice_sizes={{{TILE}}}
  m = f32[{TILE}] multiply(xs, ys)
  g = f32[{2 * TILE}] all-gather(m), channel_id=1, replica_groups={{{{0,1}}}}, dimensions={{0}},
    use_global_device_ids=true
  ROOT r = f32[{N}] slice(g), slice={{[0:{N}]}}
}}
"""


def impl_mul_merged(window: str = f"0:{N}") -> str:
    """x * y with the tiles gathered as a new major dimension and merged by a reshape
    (2 x 502 -> 1004: the class is its own merged dimension's minor part), then sliced."""
    return f"""HloModule impl, num_partitions=2

ENTRY e {{
  x = f32[{N}] parameter(0), sharding={{replicated}}
  y = f32[{N}] parameter(1), sharding={{replicated}}
  zero = f32[] constant(0)
  xp = f32[{2 * TILE}] pad(x, zero), padding=0_1
  yp = f32[{2 * TILE}] pad(y, zero), padding=0_1
  offsets = s32[2] constant({{0, {TILE}}})
  pid = u32[] partition-id()
  o1 = s32[1] dynamic-slice(offsets, pid), dynamic_slice_sizes={{1}}
  o = s32[] reshape(o1)
  xs = f32[{TILE}] dynamic-slice(xp, o), dynamic_slice_sizes={{{TILE}}}
  ys = f32[{TILE}] dynamic-slice(yp, o), dynamic_slice_sizes={{{TILE}}}
  m = f32[{TILE}] multiply(xs, ys)
  m1 = f32[1,{TILE}] reshape(m)
  g = f32[2,{TILE}] all-gather(m1), channel_id=1, replica_groups={{{{0,1}}}}, dimensions={{0}},
    use_global_device_ids=true
  w = f32[{2 * TILE}] reshape(g)
  ROOT r = f32[{N}] slice(w), slice={{[{window}]}}
}}
"""


SPEC_DOT = f"""HloModule spec

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

ENTRY e {{
  x = f32[{N}] parameter(0), sharding={{replicated}}
  y = f32[{N}] parameter(1), sharding={{replicated}}
  m = f32[{N}] multiply(x, y)
  zero = f32[] constant(0)
  ROOT r = f32[] reduce(m, zero), dimensions={{0}}, to_apply=add, sharding={{replicated}}
}}
"""


def impl_dot(pad_value: str = "0") -> str:
    """sum(x * y): each device sums its padded tile, then an all-reduce. The pad is only
    harmless because it is 0: the last tile's remainder position holds pad x pad."""
    return f"""HloModule impl, num_partitions=2

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

ENTRY e {{
  x = f32[{N}] parameter(0), sharding={{replicated}}
  y = f32[{N}] parameter(1), sharding={{replicated}}
  p = f32[] constant({pad_value})
  xp = f32[{2 * TILE}] pad(x, p), padding=0_1
  yp = f32[{2 * TILE}] pad(y, p), padding=0_1
  offsets = s32[2] constant({{0, {TILE}}})
  pid = u32[] partition-id()
  o1 = s32[1] dynamic-slice(offsets, pid), dynamic_slice_sizes={{1}}
  o = s32[] reshape(o1)
  xs = f32[{TILE}] dynamic-slice(xp, o), dynamic_slice_sizes={{{TILE}}}
  ys = f32[{TILE}] dynamic-slice(yp, o), dynamic_slice_sizes={{{TILE}}}
  m = f32[{TILE}] multiply(xs, ys)
  zero = f32[] constant(0)
  s = f32[] reduce(m, zero), dimensions={{0}}, to_apply=add
  ROOT r = f32[] all-reduce(s), channel_id=1, replica_groups={{{{0,1}}}},
    use_global_device_ids=true, to_apply=add
}}
"""


@pytest.fixture(params=["real programs run", "too large to run"])
def confirmation(request, monkeypatch):
    """Proofs and refutations confirmed by running the real programs, or (as for the
    corpus's 72-billion-element modules) on the witnesses at a larger unit."""
    if request.param == "too large to run":
        monkeypatch.setattr(real_size, "REPLAY_LIMIT", 0)
    return request.param


def check(spec: str, impl: str) -> tv_ir.Report:
    # a bound, not a measurement: under a loaded machine a 60 s limit was reached
    return tv_ir.check(spec, impl, time_limit=600, memory_limit=1500)


def classes(report) -> dict[int, int]:
    return {c["real"]: c["reduced"] for c in report.reduction["classes"]}


def test_uneven_tiles_shrink_with_their_remainder(confirmation) -> None:
    report = check(SPEC_MUL, impl_mul())
    assert report.verdict == "equivalent", str(report)
    reduced = classes(report)[N]
    assert reduced < 16 and reduced % 2 == 1, report.reduction  # 2 U' - 1: still ragged


def test_tile_offset_off_by_one_stays_refuted(confirmation) -> None:
    report = check(SPEC_MUL, impl_mul(offsets=f"0, {TILE - 1}"))
    assert report.verdict == "not_equivalent", str(report)
    assert classes(report)[N] < N, report.reduction  # refuted at reduced shapes


def test_tiles_merged_by_a_reshape_shrink(confirmation) -> None:
    report = check(SPEC_MUL, impl_mul_merged())
    assert report.verdict == "equivalent", str(report)
    assert classes(report)[N] < 16, report.reduction


def test_tiles_merged_and_sliced_one_off_stay_refuted(confirmation) -> None:
    report = check(SPEC_MUL, impl_mul_merged(window=f"1:{N + 1}"))
    assert report.verdict == "not_equivalent", str(report)
    assert classes(report)[N] < 16, report.reduction


def test_uneven_sum_proved(confirmation) -> None:
    report = check(SPEC_DOT, impl_dot())
    assert report.verdict == "equivalent", str(report)
    assert classes(report)[N] < 16, report.reduction


def test_pad_value_seen_through_the_remainder_is_refuted(confirmation) -> None:
    """Correct only because the last tile's one padded position holds 0: a reduction that
    made the last tile whole (a ratio, or a unit without the remainder) would prove it."""
    report = check(SPEC_DOT, impl_dot(pad_value="1"))
    assert report.verdict == "not_equivalent", str(report)
    assert classes(report)[N] < 16, report.reduction


def test_affine_map_keeps_sums_and_order() -> None:
    a = Affine(19648, 4)
    assert [a.at(n) for n in (39295, 39296, 19648, 1, 0)] == [7, 8, 4, 1, 0]
    assert a.at(-1) == -1 and a.grown().at(39295) == 9
    values = [0, 1, 19647, 19648, 19649, 39295, 39296]
    assert sorted(values, key=a.at) == values  # the order of every two numbers kept
    assert a.at(39295) + a.at(1) == a.at(39296)  # pad lo + n + hi stays exact


def test_unit_found_from_sizes_and_offsets() -> None:
    d = DimClasses()
    keys = [d.add((v, 0), n) for v, n in enumerate((39295, 39296, 19648, 39295))]
    for k in keys[1:]:
        d.tie(keys[0], k)
    d.divides(keys[1], 19648)  # a tile's offset
    d.divides(keys[1], 1)  # the pad
    aff = affine_unit(d, d.classes()[d.find(keys[0])])
    assert aff is not None and aff.unit == 19648 and aff.at(39295) == 2 * aff.reduced - 1
    # a slice [383:1000] of 1000: whatever the units, the start + size is still the end
    d2 = DimClasses()
    k1, k2 = d2.add((0, 0), 1000), d2.add((1, 0), 617)
    d2.tie(k1, k2)
    d2.divides(k1, 383)
    aff2 = affine_unit(d2, d2.classes()[d2.find(k1)])
    assert aff2 is None or aff2.at(383) + aff2.at(617) == aff2.at(1000), aff2


# a convolution whose spatial dimension XLA partitions: each device's tile of 100 widened
# by a halo row from each neighbour (102 = 100 + 2), windowed without padding
def _conv(pad: tuple[int, int]):
    import jax

    def conv(x, k):
        return jax.lax.conv_general_dilated(
            x, k, (1,), [pad], dimension_numbers=("NWC", "WIO", "NWC")
        )

    return conv


def _partitioned(pad: tuple[int, int]):
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    tiled = NamedSharding(mesh, P(None, "x", None))
    return jax.jit(_conv(pad), in_shardings=(tiled, NamedSharding(mesh, P())), out_shardings=tiled)


def _conv_args():
    import jax
    import jax.numpy as jnp

    return jax.ShapeDtypeStruct((2, 200, 4), jnp.float32), jax.ShapeDtypeStruct(
        (3, 4, 8), jnp.float32
    )


def test_halo_widened_convolution_tiles_shrink() -> None:
    from tv_ir.frontends.jax import verify

    report = verify(_partitioned((1, 1)), *_conv_args(), spec=_conv((1, 1)))
    assert report.verdict == "equivalent", str(report)
    assert classes(report)[200] < 20, report.reduction  # kept at 200 without affine units


def test_halo_widened_convolution_with_other_padding_is_refuted(confirmation) -> None:
    from tv_ir.frontends.jax import verify

    report = verify(_partitioned((2, 0)), *_conv_args(), spec=_conv((1, 1)))
    assert report.verdict == "not_equivalent", str(report)
    assert classes(report)[200] < 20, report.reduction


# top k: 302 keys in 2 tiles of 151, sorted, the first 20 kept: no factor divides 302, 151,
# 20 and 282, no single unit fits 20 beside 151; two units do (151 -> U', 20 -> K')
TOPK_SORT = """
gt {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=GT
}
"""
SPEC_TOPK = f"""HloModule spec
{TOPK_SORT}
ENTRY e {{
  x = f32[302] parameter(0), sharding={{replicated}}
  s = f32[302] sort(x), dimensions={{0}}, is_stable=true, to_apply=gt
  ROOT r = f32[20] slice(s), slice={{[0:20]}}, sharding={{replicated}}
}}
"""


def impl_topk(window: str = "0:20") -> str:
    return f"""HloModule impl, num_partitions=2
{TOPK_SORT}
ENTRY e {{
  x = f32[302] parameter(0), sharding={{replicated}}
  offsets = s32[2] constant({{0, 151}})
  pid = u32[] partition-id()
  o1 = s32[1] dynamic-slice(offsets, pid), dynamic_slice_sizes={{1}}
  o = s32[] reshape(o1)
  t = f32[151] dynamic-slice(x, o), dynamic_slice_sizes={{151}}
  g = f32[302] all-gather(t), channel_id=1, replica_groups={{{{0,1}}}}, dimensions={{0}},
    use_global_device_ids=true
  s = f32[302] sort(g), dimensions={{0}}, is_stable=true, to_apply=gt
  ROOT r = f32[20] slice(s), slice={{[{window}]}}
}}
"""


def test_top_k_shrinks_by_two_units(confirmation) -> None:
    report = check(SPEC_TOPK, impl_topk())
    assert report.verdict == "equivalent", str(report)
    assert classes(report)[302] < 40, report.reduction  # kept at 302 by one unit


def test_top_k_off_by_one_stays_refuted(confirmation) -> None:
    report = check(SPEC_TOPK, impl_topk(window="1:21"))
    assert report.verdict == "not_equivalent", str(report)
    assert classes(report)[302] < 40, report.reduction


def test_two_units_keep_the_order_of_every_value() -> None:
    from tv_ir.passes.shape_reduction.affine import TwoUnits

    d = DimClasses()
    keys = [d.add((v, 0), n) for v, n in enumerate((209664, 104832, 2000))]
    for k in keys[1:]:
        d.tie(keys[0], k)
    for o in (104832, 207664):
        d.divides(keys[0], o)
    aff = affine_unit(d, d.classes()[d.find(keys[0])])
    assert isinstance(aff, TwoUnits), aff
    values = [0, 2000, 104832, 207664, 209664]
    mapped = [aff.at(v) for v in values]
    assert mapped == sorted(mapped) and len(set(mapped)) == len(mapped), mapped
    assert aff.at(209664) - aff.at(207664) == aff.at(2000)  # the slice's limit stays exact


def test_a_factor_replaced_by_units_comes_back_when_the_units_fail(monkeypatch) -> None:
    """2080 keys in tiles of 1040, the top 48: a factor of 16 leaves 130 keys, two units
    far fewer. When the units' reduced shapes are inconsistent (forced here), the class
    keeps its factor, not its real size."""
    import tv_ir.passes.shape_reduction as shape_reduction

    from tv_ir.pipeline import _boundary_placement, prepare

    spec_text = SPEC_TOPK.replace("302", "2080").replace("20]", "48]")
    impl_text = impl_topk("0:48").replace("302", "2080").replace("151", "1040")
    impl_text = impl_text.replace("f32[20]", "f32[48]")
    spec, impl = prepare(spec_text, "spec"), prepare(impl_text, "impl")
    placement = _boundary_placement(spec, impl, None)

    def reduced() -> dict[int, int]:
        red = shape_reduction.reduce_pair(spec, impl, placement)
        return {c.real: c.reduced for c in red.classes}

    assert reduced()[2080] < 40  # two units
    calls = []
    real_inconsistent = shape_reduction.inconsistent

    def first_fails(m):
        calls.append(m)
        return "forced" if len(calls) == 1 else real_inconsistent(m)

    monkeypatch.setattr(shape_reduction, "inconsistent", first_fails)
    assert reduced()[2080] == 130  # the factor of 16 again
