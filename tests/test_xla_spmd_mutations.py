"""The planted partitioning bugs of tests/xla_spmd_mutations.py on small per-device programs:
each kind edits the instruction it names, and sites that would give the same program by
construction (dead code, self-reverse pairs, equal offsets, groups of one) are skipped."""

from __future__ import annotations

import pytest
from xla_spmd_mutations import KINDS, Program, groups_of, mutants

import tv_ir

SPEC = """
func.func @main(%x: tensor<8xf32> {mhlo.sharding = "{devices=[2]0,1}"},
                %y: tensor<8xf32> {mhlo.sharding = "{devices=[2]0,1}"})
    -> (tensor<f32> {mhlo.sharding = "{replicated}"}) {
  %0 = stablehlo.subtract %x, %y : tensor<8xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %1 = stablehlo.reduce(%0 init: %z) applies stablehlo.add across dimensions = [0]
      : (tensor<8xf32>, tensor<f32>) -> tensor<f32>
  return %1 : tensor<f32>
}
"""

PER_DEVICE = """HloModule module, num_partitions=2

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%sum.clone (a.1: f32[], b.1: f32[]) -> f32[] {
  %a.1 = f32[] parameter(0)
  %b.1 = f32[] parameter(1)
  ROOT %s.1 = f32[] add(%a.1, %b.1)
}

ENTRY %main (x: f32[4], y: f32[4]) -> f32[] {
  %x = f32[4]{0} parameter(0), sharding={devices=[2]0,1}
  %y = f32[4]{0} parameter(1), sharding={devices=[2]0,1}
  %unused = f32[4]{0} collective-permute(%x), channel_id=3, source_target_pairs={{0,1},{1,0}}
  %d = f32[4]{0} subtract(%x, %y)
  %zero = f32[] constant(0)
  %r = f32[] reduce(%d, %zero), dimensions={0}, to_apply=%sum
  ROOT %all = f32[] all-reduce(%r), channel_id=1, replica_groups={{0,1}}, GLOBAL_IDS
}
""".replace("GLOBAL_IDS", "use_global_device_ids=true, to_apply=%sum.clone")


def _changed(original: str, mutant: str) -> list[tuple[str, str]]:
    a, b = original.splitlines(), mutant.splitlines()
    return [(x.strip(), y.strip()) for x, y in zip(a, b, strict=True) if x != y]


def test_each_kind_edits_one_live_instruction() -> None:
    ms = {m.kind: m for m in mutants(PER_DEVICE)}
    assert set(ms) == {"dropped collective", "wrong groups", "wrong reduction", "swapped operands"}
    [(_, dropped)] = _changed(PER_DEVICE, ms["dropped collective"].text)
    assert dropped == "ROOT %all = f32[] copy(%r)"  # not the dead collective-permute
    [(_, groups)] = _changed(PER_DEVICE, ms["wrong groups"].text)
    assert "replica_groups={{0},{1}}" in groups
    [(_, reduction)] = _changed(PER_DEVICE, ms["wrong reduction"].text)
    assert reduction == "ROOT %s.1 = f32[] maximum(%a.1, %b.1)"  # the collective's, not reduce's
    [(_, swapped)] = _changed(PER_DEVICE, ms["swapped operands"].text)
    assert swapped == "%d = f32[4]{0} subtract(%y, %x)"


def test_self_reverse_pairs_and_equal_offsets_are_not_mutants() -> None:
    live = PER_DEVICE.replace(
        "%d = f32[4]{0} subtract(%x, %y)", "%d = f32[4]{0} subtract(%unused, %y)"
    ).replace(
        "%zero = f32[] constant(0)", "%zero = f32[] constant(0)\n  %t = s32[2]{0} constant({3, 3})"
    )
    assert [m.kind for m in mutants(live, kinds=["permuted pairs", "shifted offsets"])] == []
    one_way = live.replace("{{0,1},{1,0}}", "{{0,1}}")
    [m] = mutants(one_way, kinds=["permuted pairs"])
    assert "source_target_pairs={{1,0}}" in m.text


def test_iota_replica_groups_are_read() -> None:
    assert groups_of("replica_groups=[2,2]<=[4], x") == [[0, 1], [2, 3]]
    assert groups_of("replica_groups=[2,2]<=[2,2]T(1,0), x") == [[0, 2], [1, 3]]
    assert groups_of("replica_groups={{0,2},{1,3}}, x") == [[0, 2], [1, 3]]


def test_dead_instructions_are_not_live() -> None:
    p = Program(PER_DEVICE)
    names = {i.name for i in p.instrs if p.is_live(i)}
    assert "%unused" not in names and {"%all", "%r", "%d", "%s.1", "%s"} <= names


@pytest.mark.parametrize(
    "kind", ["dropped collective", "wrong groups", "wrong reduction", "swapped operands"]
)
def test_mutant_of_a_proved_program_is_refuted(kind: str) -> None:
    assert tv_ir.check(SPEC, PER_DEVICE).verdict == "equivalent"
    [m] = mutants(PER_DEVICE, kinds=[kind])
    r = tv_ir.check(SPEC, m.text)
    assert r.verdict == "not_equivalent", f"{kind}: {r.verdict}: {r.reason}"


def test_every_kind_has_sites() -> None:
    from xla_spmd_mutations import _SITES

    assert set(_SITES) == set(KINDS)
