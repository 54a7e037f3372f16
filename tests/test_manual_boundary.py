"""`{manual}` and partially manual (`last_tile_dims={manual}`) values at a pre-partition
module's boundary (`tv check BEFORE AFTER`; `tv_ir.prover.manual_boundary`): each manual
instance's value is one row of a stacked global value, the module runs on every device.
"""

from __future__ import annotations

import pytest

import tv_ir
from tv_ir.ir.importer import load
from tv_ir.prover.manual_boundary import is_manual, lift_manual_boundary

# a tiled argument taken into a manual region, added to a manual argument, taken back to the
# global view, multiplied, and returned manual (XLA's MixWithManualPartitioning)
MIX = """HloModule mix, num_partitions=2
ENTRY e {
  p0 = f32[8,2] parameter(0), sharding={devices=[2,1]0,1}
  p1 = f32[4,2] parameter(1), sharding={manual}
  s = f32[4,2] custom-call(p0), custom_call_target="SPMDFullToShardShape", sharding={manual}
  a = f32[4,2] add(s, p1), sharding={manual}
  f = f32[8,2] custom-call(a), custom_call_target="SPMDShardToFullShape",
    sharding={devices=[2,1]0,1}
  m = f32[8,2] multiply(f, p0), sharding={devices=[2,1]0,1}
  ROOT r = f32[4,2] custom-call(m), custom_call_target="SPMDFullToShardShape", sharding={manual}
}
"""


def mix_impl(p1: str = "p1") -> str:
    permuted = (
        "  q = f32[4,2] collective-permute(p1), channel_id=1, source_target_pairs={{0,1},{1,0}}\n"
        if p1 == "q"
        else ""
    )
    return f"""HloModule mix_spmd, num_partitions=2
ENTRY e {{
  p0 = f32[4,2] parameter(0), sharding={{devices=[2,1]0,1}}
  p1 = f32[4,2] parameter(1), sharding={{manual}}
{permuted}  a = f32[4,2] add(p0, {p1})
  ROOT m = f32[4,2] multiply(a, p0)
}}
"""


def test_manual_and_tiled_arguments_in_and_out_of_a_manual_region_are_proved() -> None:
    r = tv_ir.check(MIX, mix_impl(), time_limit=60)
    assert r.verdict == "equivalent", r


def test_a_manual_argument_read_from_the_other_device_is_refuted() -> None:
    r = tv_ir.check(MIX, mix_impl("q"), time_limit=60)
    assert r.verdict == "not_equivalent", r
    assert r.counterexample is not None


PARTITION_ID = """HloModule m, num_partitions=4
ENTRY e {
  ROOT id = u32[] partition-id(), sharding={manual}
}
"""


def test_each_devices_own_partition_id_is_its_manual_result() -> None:
    good = "HloModule m_spmd, num_partitions=4\nENTRY e {\n  ROOT id = u32[] partition-id()\n}\n"
    assert tv_ir.check(PARTITION_ID, good, time_limit=60).verdict == "equivalent"
    # XLA names its output's entry `*_spmd`: what says a program without a device op is
    # per-device
    bad = "HloModule m_spmd, num_partitions=4\nENTRY e_spmd {\n  ROOT z = u32[] constant(0)\n}\n"
    r = tv_ir.check(PARTITION_ID, bad, time_limit=60)
    assert r.verdict == "not_equivalent", r
    assert r.counterexample.device != 0  # device 0's id is 0: the others differ


# two manual instances ({0,1} and {2,3}), each a f32[2,2] tiled by rows over its two devices
# (XLA's SubgroupManualAllReduce): the all-reduce joins the instances row by row
SUBGROUP = "{devices=[2,1,2]0,2,1,3 last_tile_dims={manual}}"


def subgroup_before(groups: str) -> str:
    return f"""HloModule m, num_partitions=4
sum {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT add = f32[] add(a, b)
}}
ENTRY e {{
  p = f32[2,2] parameter(0), sharding={SUBGROUP}
  ROOT r = f32[2,2] all-reduce(p), to_apply=sum, replica_groups={groups},
    use_global_device_ids=true, channel_id=1, sharding={SUBGROUP}
}}
"""


def subgroup_after(groups: str) -> str:
    return f"""HloModule m_spmd, num_partitions=4
sum {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT add = f32[] add(a, b)
}}
ENTRY e {{
  p = f32[1,2] parameter(0), sharding={SUBGROUP}
  ROOT r = f32[1,2] all-reduce(p), to_apply=sum, replica_groups={groups},
    use_global_device_ids=true, channel_id=1
}}
"""


def test_partially_manual_all_reduce_across_instances_is_proved() -> None:
    groups = "{{2,0},{1,3}}"
    r = tv_ir.check(subgroup_before(groups), subgroup_after(groups), time_limit=60)
    assert r.verdict == "equivalent", r


def test_partially_manual_all_reduce_on_wrong_groups_is_refuted() -> None:
    before = subgroup_before("{{2,0},{1,3}}")
    r = tv_ir.check(before, subgroup_after("{{0,3},{1,2}}"), time_limit=60)
    assert r.verdict == "not_equivalent", r


def test_a_group_inside_one_instance_is_not_read_as_whole_values() -> None:
    # devices 0 and 1 hold rows 0 and 1 of one instance: no whole-instance reading
    groups = "{{0,1},{2,3}}"
    r = tv_ir.check(subgroup_before(groups), subgroup_after(groups), time_limit=60)
    assert r.verdict == "unknown"
    assert "one manual instance" in r.reason


def test_partition_id_in_a_partially_manual_module_is_unsupported() -> None:
    before = f"""HloModule m, num_partitions=4
ENTRY e {{
  p = u32[2,2] parameter(0), sharding={SUBGROUP}
  id = u32[] partition-id(), sharding={{replicated}}
  b = u32[2,2] broadcast(id), dimensions={{}}, sharding={SUBGROUP}
  ROOT r = u32[2,2] add(p, b), sharding={SUBGROUP}
}}
"""
    after = f"""HloModule m_spmd, num_partitions=4
ENTRY e {{
  p = u32[1,2] parameter(0), sharding={SUBGROUP}
  id = u32[] partition-id()
  b = u32[1,2] broadcast(id), dimensions={{}}
  ROOT r = u32[1,2] add(p, b)
}}
"""
    r = tv_ir.check(before, after, time_limit=60)
    assert r.verdict == "unknown"
    assert "partition_id" in r.reason


def test_an_instance_whose_devices_disagree_has_no_value() -> None:
    # instances {0,1} and {2,3}, each value whole on both of its devices; the permute sends
    # instance 0's value to device 2 only, so device 3 holds zeros: instance 1 has no value
    lay = "{devices=[1,2,2]<=[4] last_tile_dims={manual, replicated}}"
    before = f"""HloModule m, num_partitions=4
ENTRY e {{
  p = f32[2] parameter(0), sharding={lay}
  ROOT r = f32[2] collective-permute(p), channel_id=1, source_target_pairs={{{{0,2}}}},
    sharding={lay}
}}
"""
    after = f"""HloModule m_spmd, num_partitions=4
ENTRY e {{
  p = f32[2] parameter(0), sharding={lay}
  ROOT r = f32[2] collective-permute(p), channel_id=1, source_target_pairs={{{{0,2}}}}
}}
"""
    r = tv_ir.check(before, after, time_limit=60)
    assert r.verdict == "unknown", r
    assert "no single global value" in r.reason


@pytest.mark.parametrize(
    "sharding, manual",
    [
        ("{manual}", True),
        (SUBGROUP, True),
        ("{devices=[2,1]0,1}", False),
        ("{replicated}", False),
    ],
)
def test_is_manual(sharding: str, manual: bool) -> None:
    assert is_manual(sharding) is manual


def test_lifted_layouts_stack_one_row_per_instance() -> None:
    spec = load(subgroup_before("{{2,0},{1,3}}"))
    impl = load(subgroup_after("{{2,0},{1,3}}"))
    _, lifted_impl, placement = lift_manual_boundary(spec, impl, [SUBGROUP], [SUBGROUP], 4)
    lay = placement.args[0]
    assert lay.global_shape == (2, 2, 2)  # 2 instances of f32[2,2]
    assert lay.tile_shape == (1, 1, 2)
    # instance {0,1} is row 0 (rows 0 and 1 of it on devices 0, 1), {2,3} is row 1
    assert [lay.box(d) for d in range(4)] == [
        ((0, 1), (0, 1), (0, 2)),
        ((0, 1), (1, 2), (0, 2)),
        ((1, 2), (0, 1), (0, 2)),
        ((1, 2), (1, 2), (0, 2)),
    ]
    assert [tuple(t.shape) for t in lifted_impl.main.arg_types] == [(1, 1, 2)]
    # the modules given stay as they were (a caller may check them again)
    assert all(v.owner is None for v in spec.main.args + impl.main.args)
    assert [tuple(t.shape) for t in impl.main.arg_types] == [(1, 2)]


def test_the_same_modules_check_twice() -> None:
    spec, impl = load(MIX), load(mix_impl())
    assert tv_ir.check(spec, impl, time_limit=60).verdict == "equivalent"
    assert tv_ir.check(spec, impl, time_limit=60).verdict == "equivalent"


# a GSPMD manual region over two instances of two devices (XLA's PartitionCollectivePermute):
# instance m takes elements [2m, 2m+2) of p, cuts them over its devices, squares them; back
# in the global view each device d's tile is its instance's element d % 2: p * p
PARTIAL_REGION = """HloModule m, num_partitions=4
ENTRY e {
  p = s32[4] parameter(0), sharding={devices=[4]<=[4]}
  c = s32[4] copy(p), sharding={devices=[2,2]<=[4] last_tile_dim_replicate}
  s = s32[2] custom-call(c), custom_call_target="SPMDFullToShardShape",
    sharding={devices=[1,2,2]<=[4] last_tile_dims={manual, replicated}}
  t = s32[2] copy(s), sharding={devices=[2,2]<=[2,2]T(1,0) last_tile_dims={manual}}
  m = s32[2] multiply(t, t), sharding={devices=[2,2]<=[2,2]T(1,0) last_tile_dims={manual}}
  ROOT f = s32[4] custom-call(m), custom_call_target="SPMDShardToFullShape",
    sharding={devices=[4]<=[4]}
}
"""


def partial_region_impl(neighbour: bool) -> str:
    x = "q" if neighbour else "p"
    permute = (
        "  q = s32[1] collective-permute(p), channel_id=1,\n"
        "    source_target_pairs={{0,1},{1,0},{2,3},{3,2}}\n"
        if neighbour
        else ""
    )
    return f"""HloModule m_spmd, num_partitions=4
ENTRY e_spmd {{
  p = s32[1] parameter(0), sharding={{devices=[4]<=[4]}}
{permute}  ROOT m = s32[1] multiply({x}, {x})
}}
"""


def test_a_partially_manual_gspmd_region_is_read_per_instance() -> None:
    r = tv_ir.check(PARTIAL_REGION, partial_region_impl(False), time_limit=60)
    assert r.verdict == "equivalent", r
    r = tv_ir.check(PARTIAL_REGION, partial_region_impl(True), time_limit=60)
    assert r.verdict == "not_equivalent", r


def test_a_collective_outside_manual_values_is_unsupported() -> None:
    before = """HloModule m, num_partitions=2
sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT add = f32[] add(a, b)
}
ENTRY e {
  p = f32[2] parameter(0), sharding={manual}
  ROOT r = f32[2] all-reduce(p), to_apply=sum, replica_groups={{0,1}}, channel_id=1,
    use_global_device_ids=true, sharding={replicated}
}
"""
    after = """HloModule m_spmd, num_partitions=2
sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT add = f32[] add(a, b)
}
ENTRY e_spmd {
  p = f32[2] parameter(0), sharding={manual}
  ROOT r = f32[2] all-reduce(p), to_apply=sum, replica_groups={{0,1}}, channel_id=1,
    use_global_device_ids=true
}
"""
    r = tv_ir.check(before, after, time_limit=60)
    assert r.verdict == "unknown"
    assert "only in a manual region" in r.reason
