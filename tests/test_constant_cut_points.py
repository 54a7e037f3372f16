"""A cut-point whose expression is a plain number (a splat constant the spec also holds)
substitutes into the terms that use it (was an internal error: `'float' object has no
attribute 'dom'`). The per-device program is XLA's partitioning of a pad then a slice
that shifts a 4-way sharded vector right by one (MergedPadThenSliceShiftRight)."""

from __future__ import annotations

import tv_ir

SPEC = """HloModule m

ENTRY entry {
  p = f32[4] parameter(0)
  init = f32[] constant(2.0)
  pad = f32[5] pad(p, init), padding=1_0
  copy = f32[5] copy(pad)
  ROOT slice = f32[4] slice(copy), slice={[0:4]}
}
"""

PER_DEVICE = """HloModule m, num_partitions=4

ENTRY main {
  iota = s32[1] iota(), iota_dimension=0
  offsets = s32[4] constant({0, 1, 2, 3})
  pid = u32[] partition-id()
  mine = s32[1] dynamic-slice(offsets, pid), dynamic_slice_sizes={1}
  at = s32[] reshape(mine)
  atb = s32[1] broadcast(at), dimensions={}
  pos = s32[1] add(iota, atb)
  one = s32[] constant(1)
  oneb = s32[1] broadcast(one), dimensions={}
  inside = pred[1] compare(pos, oneb), direction=GE
  p = f32[1] parameter(0), sharding={devices=[4]<=[4]}
  left = f32[1] collective-permute(p), channel_id=1, source_target_pairs={{0,1},{1,2},{2,3}}
  two = f32[] constant(2)
  twob = f32[1] broadcast(two), dimensions={}
  ROOT out = f32[1] select(inside, left, twob)
}
"""


def test_shift_right_through_a_padded_constant_is_proved() -> None:
    r = tv_ir.check(SPEC, PER_DEVICE, layouts=_tiled_output())
    assert r.verdict == "equivalent", r.reason


def test_wrong_fill_value_is_refuted() -> None:
    wrong = PER_DEVICE.replace("two = f32[] constant(2)", "two = f32[] constant(3)")
    assert tv_ir.check(SPEC, wrong, layouts=_tiled_output()).verdict == "not_equivalent"


def _tiled_output():
    from tv_ir.prover.boundary_layouts import GivenLayouts

    return GivenLayouts(out_shardings=["{devices=[4]<=[4]}"])
