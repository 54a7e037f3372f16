"""XLA's SPMD partitioner unit-test modules, partitioned by jaxlib's XLA and proved by tv.

A representative subset of ../shared/corpus/xla_spmd (or TV_XLA_SPMD_CORPUS; skipped when
absent; read in place): each module is partitioned as its unit test runs it (sharding
propagation off, the test's device count) and the per-device program XLA dumps after
`spmd-partitioning` is checked against the module (`tv check BEFORE AFTER`), as HLO text
and as StableHLO converted from XLA's proto dump (XLA's spmd module attributes, no
`mhlo.num_partitions`, against the module without its shardings). Modules proved stay
proved; no module is refuted except a partitioning XLA itself computes wrongly. The whole
corpus: `python bench/xla_spmd.py` (docs/distributed.md, "XLA SPMD corpus").
"""

from __future__ import annotations

import dataclasses
import re

import pytest
from xla_spmd_corpus import (
    ROOT,
    cases,
    partition_case,
    per_device_only,
    replay_on_xla,
    unpartitioned,
    xla_layouts,
)

import tv_ir
from tv_ir.pipeline import prepare

CASES = {c.name: c for c in cases()}
pytestmark = pytest.mark.skipif(not CASES, reason="XLA SPMD corpus folder is absent")

TIME_LIMIT = 120.0  # seconds (never asserted: a run out of time is an unknown, a failure)

# one or a few per kind of op and sharding (each proves in about a second)
PROVED = [
    "SingleDeviceToTiled",
    "PartitionCallMultipleCallsitesMatchedByReshard",
    "PartitionConditionalMismatchedBranches",
    "TiledToReplicatedWhenV2ShardingGeneratesReplicaGroupV2",
    "TiledToTiledUneven",
    "GetTupleElementTiled",
    "TiledToReplicatedReduce",
    "BroadcastBothOldAndNewDimsShardedPartiallySharded",
    "ReduceWindowTiledOneSideHaloBeyondNeighbor",
    "ConvolutionBaseDilationStride1LhsTiledRhsReplicated",
    "ConvolutionLhsTiledRhsTiled_UnevenDilatedRHSPartitioned",
    "SelectAndScatterWithOverlap",
    "ConcatenateAlongBothDimensions",
    "LargeEdgePadAlongCrossPartitionDimension",
    "PartialReplicatePad",
    "PartialReplicateSliceAlongPartitionedDimension",
    "MergedPadThenSliceShiftRight",
    "MergedSliceThenConcatRotateRightWithUnalignedPadding",
    "DeviceMaximalTupleSort",
    # convolutions whose groups and same-padded windows shrink (passes/shape_reduction/
    # convolution.py): depthwise, a weight gradient (batch groups), features and filter split
    "PartitionConvWithFeatureGroupCount",
    "PartitionConvWithBathGroupCount",
    "ConvolutionFilterIFOFPartitionedInputPartialReplicate",
    # a sort along its sharded dimension (all-gathered, then sorted with its iota): the
    # sorted dimension shrinks (passes/shape_reduction/sorts.py)
    "SortShardedOnSortDim_RankOne",
    # manual values at the boundary, stacked by instance (tv_ir/prover/manual_boundary.py):
    # {manual} with a shard_map region, a device's own id, a partially manual all-reduce;
    # GSPMD manual regions, nested and partially manual, run on every device
    "MixWithManualPartitioning",
    "ManualPartitionId",
    "SubgroupManualAllReduce",
    "NestedManual",
    "PartitionCollectivePermute",
    # bit casts of inputs: an opaque function of the bits (tv_ir/semantics/bit_casts.py)
    "BitcastConvertSameRank",
    "BitcastConvertInputRankGreaterThanOutputRank",
    # 39295 split 2 and 4 ways (padded tiles, the last partial): affine classes
    # (passes/shape_reduction/affine.py), and a tile gathered by all-to-all and merged
    "EinsumRHSWindowedNonContractingReduce1",
    "BidirectionalEinsumRHSWindowedNonContractingNoSharedSharding",
    # 257 keys, a prime: the sorted dimension shrinks to 3 by an affine unit
    "SortAlongNonPartitionedDimension",
    # a weight gradient over a tile widened by halos (117 = 2 x 56 + 5): an affine unit
    "ConvolutionLhsTiledRhsTiledWindowDilate",
    # a pooling's batch and feature dimensions (windows of one position) shrink around the
    # input-dilated spatial window (passes/shape_reduction/rules.py, _windowed): 81 million
    # elements -> 861
    "InceptionV3_4_way_ReduceWindowDilated",
    # a min scatter on input indices, each device's part padded with +inf, combined by an
    # all-reduce min: guarded items of one flat min (terms._select_into_extremum), the
    # infinity as an order-only variable in SMT
    "IndexPassthroughScatter_Min",
    # 4096 update rows of 1024 scattered concretely at the real sizes (the confirmation): one
    # numpy block per window, not one Python step per element (ops/indexing.py)
    "PartitionPassthroughScatterCorrectOutputSharding",
    # a manual loop whose trip count is each device's own input (the devices stop at
    # different times): the same loop on both sides, an opaque function of its start
    # (tv_ir/semantics/ops/control.py, opaque_loop), fully and partially manual
    "WhileManual",
    "WhilePartialManual",
    # an outer product written as a convolution (one input position, a window of 176
    # padded by 175 on both sides): the window shrinks with the output, the padding with it
    "WindowedEinsumPreferMemoryFootprint",
    # a 32 x 32 triangular solve run whole on every device: opaque per column
    # (tv_ir/semantics/ops/linalg.py)
    "TriangularSolve",
    # a gather of an 8 x 4 integer table by clamped input indices, each device its block
    # and a masked all-reduce: one solver query of linear integer arithmetic, 8 devices'
    # copies of each difference asked once, decided by z3's QF_LIA solver in 10 to 13
    # million units (the general one: 10 to over 50 million by the order of its variables
    # and z3's state, against a budget of 30; tv_ir/prover/smt.py)
    "GatherMergedTrivialSlicedOperandAndIndexPassthrough_PartialGrouping",
]
# the same verdicts from the StableHLO form (XLA's proto dump) against the plain module
STABLEHLO_FORM = [
    "TiledToTiledUneven",
    "GetTupleElementTiled",
    "PartitionConditionalMismatchedBranches",
    "ReduceWindowTiledOneSideHaloBeyondNeighbor",
    # manual values: the module's own annotations are its meaning (and its device count)
    "MixWithManualPartitioning",
    "SubgroupManualAllReduce",
    "ManualPartitionId",
]
# partitionings jaxlib 0.10.2's XLA gets wrong: refuted by tv, confirmed by XLA itself
MISCOMPILES = {
    "Dot2DPartitionedNoncontractingAndContracting3": "a dot whose output sharding has a "
    "permuted device order ({devices=[2,2]1,0,3,2}): devices hold the wrong column blocks "
    "(on any input)",
    "IndexPassthroughScatterPartitionedIndexVectorDim": "a scatter whose indices are sharded "
    "along index_vector_dim: updates are lost (on in-bounds indices)",
    "DynamicUpdateSliceAlongPartitionedDimension2": "a dynamic_update_slice along the "
    "partitioned dimension with a start index past the end: HLO clamps it, the partitioned "
    "program writes nothing (in-range indices agree)",
}
# the programs differ (XLA too, on tv's input), but not by a miscompile: the reducer (an
# argmax by a strict `>`, ties to the right) is not commutative, so the order XLA reduces in
# is its choice (random inputs, without ties, agree): unknown (tv_ir/semantics/reduction_order.py)
ORDER_DEPENDENT = {"TiledToPartiallyTiledTupleReduce"}


def _present(names):
    return [
        pytest.param(n, marks=pytest.mark.skipif(n not in CASES, reason="not in corpus"))
        for n in names
    ]


@pytest.mark.parametrize("name", _present(PROVED))
def test_xla_partitioning_is_proved(name: str) -> None:
    case = CASES[name]
    _, parted = partition_case(case)
    r = tv_ir.check(
        case.path,
        parted.per_device_hlo,
        time_limit=TIME_LIMIT,
        layouts=xla_layouts(parted),
    )
    assert r.verdict == "equivalent", f"{name}: {r.verdict}: {r.reason}\n{r}"


@pytest.mark.parametrize("name", _present(STABLEHLO_FORM))
def test_stablehlo_form_with_spmd_attributes_is_proved(name: str) -> None:
    case = CASES[name]
    before, parted = partition_case(case, as_stablehlo=True)
    impl = parted.per_device_stablehlo
    assert "mhlo.spmd_output_sharding" in impl and "mhlo.num_partitions" not in impl
    # a module with manual values has no single-device form: it is the spec as it is
    spec = before if per_device_only(before, parted) else unpartitioned(before)
    r = tv_ir.check(spec, impl, time_limit=TIME_LIMIT)
    assert r.verdict == "equivalent", f"{name}: {r.verdict}: {r.reason}"


def test_stablehlo_form_that_lost_its_device_order_is_not_refuted() -> None:
    """XLA's mesh-axes all_to_all over devices ordered `[4,2]T(1,0)`: jaxlib's StableHLO of
    it keeps the groups but not the order, so that module sends pieces to other devices than
    XLA's program does. Refuting it would report a miscompile XLA did not make: unknown,
    naming the lost order; the HLO text (which keeps it) is proved."""
    name = "MultipleSourceTargetDimsInOneAllToAll1"
    if name not in CASES:
        pytest.skip("not in corpus")
    case = CASES[name]
    before, parted = partition_case(case, as_stablehlo=True)
    assert "device_ids=([4,2]T(1,0))" in parted.per_device_hlo
    r = tv_ir.check(unpartitioned(before), parted.per_device_stablehlo, time_limit=TIME_LIMIT)
    assert r.verdict == "unknown", r.verdict
    assert "gives no device order" in r.reason and "hlo_to_stablehlo" in r.reason, r.reason
    r = tv_ir.check(
        case.path, parted.per_device_hlo, time_limit=TIME_LIMIT, layouts=xla_layouts(parted)
    )
    assert r.verdict == "equivalent", r.reason


@pytest.mark.parametrize("name", _present(sorted(MISCOMPILES)))
def test_xla_miscompile_is_refuted_and_xla_confirms_it(name: str) -> None:
    case = CASES[name]
    before, parted = partition_case(case)
    r = tv_ir.check(
        case.path,
        parted.per_device_hlo,
        time_limit=TIME_LIMIT,
        layouts=xla_layouts(parted),
    )
    assert r.verdict == "not_equivalent", f"{name}: {r.verdict}: {r.reason}"
    replay = replay_on_xla(before, parted, list(r.counterexample.inputs.values()))
    assert replay["differs"], f"{name}: XLA does not confirm the counterexample"


@pytest.mark.parametrize("name", _present(sorted(ORDER_DEPENDENT)))
def test_order_dependent_reduction_is_unknown_not_refuted(name: str) -> None:
    case = CASES[name]
    _, parted = partition_case(case)
    r = tv_ir.check(
        case.path, parted.per_device_hlo, time_limit=TIME_LIMIT, layouts=xla_layouts(parted)
    )
    assert r.verdict == "unknown" and "not commutative" in r.reason, r.reason


# planted partitioning bugs: (pattern, replacement) on XLA's per-device HLO, first match
MUTATIONS = {
    "permuted pairs": (r"source_target_pairs=\{\{(\d+),(\d+)\}", r"source_target_pairs={{\2,\1}"),
    "wrong groups": (r"replica_groups=\{\{0,1,2,3\}\}", "replica_groups={{0,1},{2,3}}"),
    "shifted offsets": (r"constant\(\{0, (\d+)", r"constant({\1, 0"),
    "wrong reduction": (r"(ROOT [%\w.]+ = f32\[\] )add\(", r"\1maximum("),
}
MUTANTS = [
    ("GetTupleElementTiled", "shifted offsets"),
    ("TiledToReplicatedReduce", "wrong reduction"),
    ("ReduceWindowTiledOneSideHaloBeyondNeighbor", "shifted offsets"),
    ("ReduceWindowTiledOneSideHaloBeyondNeighbor", "wrong reduction"),
    ("ConvolutionBaseDilationStride1LhsTiledRhsReplicated", "permuted pairs"),
    ("ConvolutionLhsTiledRhsTiled_UnevenDilatedRHSPartitioned", "wrong groups"),
    ("ConvolutionLhsTiledRhsTiled_UnevenDilatedRHSPartitioned", "wrong reduction"),
    ("SelectAndScatterWithOverlap", "shifted offsets"),
    ("SelectAndScatterWithOverlap", "wrong reduction"),
    ("PartialReplicatePad", "permuted pairs"),
    ("PartialReplicateSliceAlongPartitionedDimension", "permuted pairs"),
    ("MergedPadThenSliceShiftRight", "shifted offsets"),
    # shards gathered in the wrong order: the sorted values agree, their indices do not
    ("SortShardedOnSortDim_RankOne", "shifted offsets"),
]


@pytest.mark.parametrize(
    ("name", "mutation"), [pytest.param(n, m, id=f"{n}-{m}") for n, m in MUTANTS]
)
def test_mutated_partition_is_refuted_and_xla_confirms_it(name: str, mutation: str) -> None:
    if name not in CASES:
        pytest.skip("not in corpus")
    case = CASES[name]
    before, parted = partition_case(case)
    pattern, replacement = MUTATIONS[mutation]
    mutant, count = re.subn(pattern, replacement, parted.per_device_hlo, count=1)
    assert count == 1 and mutant != parted.per_device_hlo
    r = tv_ir.check(case.path, mutant, time_limit=TIME_LIMIT, layouts=xla_layouts(parted))
    assert r.verdict == "not_equivalent", f"{name} ({mutation}): {r.verdict}: {r.reason}"
    inputs = list(r.counterexample.inputs.values())
    real = [tuple(t.shape) for t in prepare(before, "module").main.arg_types]
    if [x.shape for x in inputs] != real:  # too big to replay at the real sizes: tv replayed
        return  # the counterexample at the reduced shapes (see the report's note)
    replay = replay_on_xla(before, dataclasses.replace(parted, per_device_hlo=mutant), inputs)
    assert replay["differs"], f"{name} ({mutation}): XLA does not confirm the counterexample"


# the harness's kinds (tests/xla_spmd_mutations.py; bench/xla_spmd_mutants.py runs them all)
HARNESS_MUTANTS = [
    ("TiledToReplicatedReduce", "dropped collective"),
    ("PartialReplicatePad", "dropped collective"),
    ("PartialReplicatePad", "swapped operands"),
    ("PartialReplicatePad", "shifted slice"),
    ("ConvolutionLhsTiledRhsTiled_UnevenDilatedRHSPartitioned", "wrong groups"),
    # device 0 reads its buffer of a value that lives on device 1 (maximal): meaningless
    ("GetTupleElementSwapDevice", "swapped operands"),
    # manual boundary values: XLA confirms against its own partitioning (no single-device run)
    ("SubgroupManualAllReduce", "wrong groups"),
    ("SubgroupManualReduce", "dropped collective"),
    # devices padded with +inf, combined by max instead of min: inf where the spec is
    # finite, a difference (not a float overflow: the all-reduce's +inf comes from another
    # device's operand)
    ("IndexPassthroughScatter_Min", "wrong reduction"),
    # factorised matrices of another batch slice: random matrices are not positive definite
    # (NaN on both sides), one simulation run makes them diagonally dominant
    ("Cholesky", "shifted offsets"),
    ("WhileManual", "swapped operands"),
    # bodies that are not commutative (an argmax by a strict `>`; a variadic scatter adding
    # min/max of each update; an overwriting scatter), but on the counterexample every
    # order gives one result: no ties, no two updates of one position, or updates that reach
    # one value in any order (tv_ir/semantics/reduction_order.py, `order_free`)
    ("TiledToTiledTupleReduce", "wrong groups"),
    ("ScatterPartitionedOnTrivialSliceDimsVariadic", "shifted offsets"),
    ("b_356877097", "swapped operands"),
    # an argmax body whose value select is swapped: the outputs that differ read only its
    # value part (a min: order-free), not the index part that depends on the order
    ("TiledToTiledTupleReduce", "swapped operands"),
    ("DeviceMaximalTupleReduce", "swapped operands"),
    # the init all-reduced by max: the tied reduce the other device runs on zeros is thrown
    # away by a select on the partition id (tv_ir/semantics/liveness.py)
    ("DeviceMaximalTupleReduce", "wrong reduction"),
    # a TopK's comparator (bitcasts of its keys) with its operands swapped: run on whole
    # lanes, the 209,664 keys sort in a second (once per comparison: past any limit)
    ("NoPartitionSortInTopKWhenSliceInOtherDim", "swapped operands"),
]


@pytest.mark.parametrize(
    ("name", "kind"), [pytest.param(n, k, id=f"{n}-{k}") for n, k in HARNESS_MUTANTS]
)
def test_harness_mutant_is_refuted_and_xla_confirms_it(name: str, kind: str) -> None:
    from xla_spmd_mutations import mutants

    if name not in CASES:
        pytest.skip("not in corpus")
    case = CASES[name]
    before, parted = partition_case(case)
    [m] = mutants(parted.per_device_hlo, kinds=[kind])
    r = tv_ir.check(case.path, m.text, time_limit=TIME_LIMIT, layouts=xla_layouts(parted))
    assert r.verdict == "not_equivalent", f"{name} ({m.site}): {r.verdict}: {r.reason}"
    inputs = list(r.counterexample.inputs.values())
    mutated = dataclasses.replace(parted, per_device_hlo=m.text)
    replay = replay_on_xla(before, mutated, inputs, reference_hlo=parted.per_device_hlo)
    assert replay["differs"], f"{name} ({m.site}): XLA does not confirm the counterexample"


def test_dropped_all_reduce_of_a_branch_predicate_is_refuted_as_a_hang() -> None:
    """`Conditional` without the all-reduce that makes its predicate the same on every
    device: device 0 takes the branch holding an all-gather with device 1, which does not.
    XLA blocks there until its runtime aborts the process a minute later (the bench replays
    it in a process of its own: bench/xla_spmd_mutants.py, `_hangs_on_xla`)."""
    from xla_spmd_mutations import mutants

    if "Conditional" not in CASES:
        pytest.skip("not in corpus")
    case = CASES["Conditional"]
    before, parted = partition_case(case)
    [m] = mutants(parted.per_device_hlo, kinds=["dropped collective"])
    r = tv_ir.check(case.path, m.text, time_limit=TIME_LIMIT, layouts=xla_layouts(parted))
    assert r.verdict == "not_equivalent", r.reason
    ce = r.counterexample
    assert "all_gather" in ce.hang and "group [0, 1]" in ce.hang, ce.hang
    assert r.location.impl.op == "stablehlo.if"
    assert [s.op for s in r.location.related] == ["stablehlo.all_gather", "mhlo.copy"]


def test_corpus_is_read_in_place() -> None:
    assert not list(ROOT.rglob("cases.json")), "corpus files copied into the repository"
