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

import pytest
from xla_spmd_corpus import (
    ROOT,
    cases,
    partition_case,
    replay_on_xla,
    unpartitioned,
    xla_layouts,
)

import tv_ir

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
]
# the same verdicts from the StableHLO form (XLA's proto dump) against the plain module
STABLEHLO_FORM = [
    "TiledToTiledUneven",
    "GetTupleElementTiled",
    "PartitionConditionalMismatchedBranches",
    "ReduceWindowTiledOneSideHaloBeyondNeighbor",
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
# is its choice (random inputs, without ties, agree): unknown (tv_ir/reduction_order.py)
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
    r = tv_ir.check(unpartitioned(before), impl, time_limit=TIME_LIMIT)
    assert r.verdict == "equivalent", f"{name}: {r.verdict}: {r.reason}"


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


def test_corpus_is_read_in_place() -> None:
    assert not list(ROOT.rglob("cases.json")), "corpus files copied into the repository"
