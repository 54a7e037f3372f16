"""openxla/shardy's executable tests, proved for all inputs instead of run on one.

Every sharded function of ../shared/corpus/shardy goes through the Shardy passes its folder
names (jaxlib's registered Shardy), and tv proves the per-device program equal to its
reference (see shardy_corpus.py). Where jaxlib's (older) Shardy cannot partition a function,
or partitions it wrongly, the same function goes through XLA's partitioner instead and is
proved there; each wrong partitioning is refuted with a counterexample that XLA itself
replays. docs/distributed.md lists what is not supported and why.
"""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from shardy_corpus import cases, split_bundle
from xla_oracle import run_xla

import tv_ir
from tv_ir.ir.importer import extract_function, parse_mlir
from tv_ir.pipeline import prepare, shardy_partition_and_check
from tv_ir.prover.placement import Placement
from tv_ir.semantics.interpreters.interp import evaluate
from tv_ir.xla.shardy_passes import run_shardy

CASES = cases()
pytestmark = pytest.mark.skipif(not CASES, reason="Shardy corpus folder is absent")

# jaxlib 0.10.2's Shardy cannot partition these (its passes reject the program)
SHARDY_FAILS = {
    "stablehlo_dot_general_indivisible": "sdy.all_gather on an operand without sharding",
    "stablehlo_reshape_2d_split_unrelated_axis": "sdy.all_to_all on an operand without sharding",
}
# ... and partitions these wrongly: a reshape that splits a padded sharded dimension is
# done on the padded local pieces (upstream Shardy fixed this with these very tests)
SHARDY_MISCOMPILES = {
    # (and this one slices by the major half of "y" where the sharding names the minor
    # sub-axis "y":(2)2; the corpus's own expected values agree with tv)
    "sdy_all_slice@all_slice_subaxis",
    "stablehlo_reshape_1d_to_2d_split",
    "stablehlo_reshape_1d_to_2d_split_2groups",
    "stablehlo_reshape_1d_to_2d_split_custom_device_ids",
    "stablehlo_reshape_1d_to_2d_split_gap_2",
    "stablehlo_reshape_1d_to_2d_split_passthrough_indivisible",
}
# what tv does not support yet, and why (docs/distributed.md repeats this list)
UNSUPPORTED = {
    "single_device_add": "partition_id in a program read as one computation: the global "
    "meaning depends on which device runs it (and jaxlib's Shardy lacks "
    "sdy-resolve-single-device-sharding)",
    "single_device_switch": "as single_device_add",
    "stablehlo_fft": "a complex output: the prover compares real elements (complex values "
    "are pairs of real terms inside a program, docs/ops.md)",
}


def _miscompiled(case) -> bool:
    return case.path.stem in SHARDY_MISCOMPILES or case.id in SHARDY_MISCOMPILES


def _needs_xla(case) -> bool:
    return case.path.stem in SHARDY_FAILS or _miscompiled(case)


def _marks(case):
    stem = case.path.stem
    if stem in UNSUPPORTED:
        return [pytest.mark.xfail(strict=True, reason=UNSUPPORTED[stem])]
    return []


def _params(select):
    return [pytest.param(c, id=c.id, marks=_marks(c)) for c in CASES if select(c)]


def _check(case):
    return shardy_partition_and_check(
        case.part1,
        function=case.function,
        spec=case.spec,
        spec_function=case.spec_function,
        pipeline=case.pipeline,
        halo_exchange=case.halo_exchange,
    )


@pytest.mark.parametrize(
    "case",
    _params(lambda c: not _needs_xla(c)),
)
def test_shardy_partitioning_proved(case):
    report = _check(case)
    assert report.verdict == "equivalent", str(report)


@pytest.mark.parametrize("case", _params(_miscompiled))
def test_shardy_miscompile_refuted_and_replayed_by_xla(case):
    report = _check(case)
    assert report.verdict == "not_equivalent", str(report)
    cex = report.counterexample
    spec, impl, placement = _programs(case)
    inputs = [
        np.asarray(x).astype(t.numpy_dtype)
        for x, t in zip(cex.inputs.values(), spec.main.arg_types, strict=True)
    ]
    if case.spec is not None:  # XLA runs the reference
        want = run_xla(extract_function(case.spec, case.spec_function, num_partitions=1), inputs)
    else:  # the reference is Shardy's global view (sdy collectives: identity), which XLA
        want = evaluate(spec, inputs)  # cannot run; tv's concrete interpreter does
    per_device = placement.shard_inputs(inputs)
    got = run_per_device(impl, per_device, placement.num_devices)
    # the copy held by the device the report names (every device's copy is compared)
    box = placement.results[cex.output].box(cex.device)
    local = tuple(i - lo for i, (lo, _) in zip(cex.index, box, strict=True))
    assert want[cex.output][cex.index] == cex.expected
    assert np.asarray(got[cex.device][cex.output])[local] == cex.actual
    assert cex.expected != cex.actual


@pytest.mark.parametrize(
    "case",
    _params(lambda c: _needs_xla(c) and c.halo_exchange),
)
def test_xla_partitioning_of_the_same_function_proved(case):
    spec = prepare(case.spec or case.part1, "spec").with_entry(case.spec_function or case.function)
    n = Placement.from_sdy(spec.main, prepare(case.part1, "m").with_entry(case.function))
    impl = extract_function(_for_xla(case.part1), case.function, num_partitions=n.num_devices)
    report = tv_ir.check(spec, impl)
    assert report.verdict == "equivalent", str(report)
    assert "XLA's SPMD partitioning" in report.impl_name


def test_shardy_pass_failure_is_a_clear_error():
    case = next(c for c in CASES if c.path.stem in SHARDY_FAILS)
    with pytest.raises(tv_ir.BadInput, match="Shardy's partitioner passes failed"):
        _check(case)


def run_per_device(text: str, per_device: list[list], n: int) -> list[list]:
    """Run a per-device program on n XLA:CPU devices; [device][result]."""
    from jax._src import compiler
    from jax._src.lib import xla_client as xc
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devs = jax.devices("cpu")[:n]
    opts = compiler.get_compile_options(
        num_replicas=1, num_partitions=n, device_assignment=np.array(devs).reshape(1, n)
    )
    opts.executable_build_options.use_shardy_partitioner = False
    exe = devs[0].client.compile_and_load(text, xc.DeviceList(tuple(devs)), opts)
    sharding = NamedSharding(Mesh(np.array(devs), ("d",)), P("d"))
    arrays = []
    for k in range(len(per_device[0])):
        pieces = [np.asarray(args[k]) for args in per_device]  # equal (padded) shapes
        shards = [jax.device_put(p, d) for p, d in zip(pieces, devs, strict=True)]
        shape = (n * pieces[0].shape[0], *pieces[0].shape[1:])
        arrays.append(jax.make_array_from_single_device_arrays(shape, sharding, shards))
    outs = exe.execute_sharded(arrays).disassemble_into_single_device_arrays()
    return [[np.asarray(o[d]) for o in outs] for d in range(n)]


def _for_xla(text: str) -> str:
    """XLA's Shardy import (jaxlib 0.10.2) rejects sdy.reshard and the explicit sdy
    collectives ("unknown mesh"); a sharding constraint says the same in the global view."""
    text = text.replace("sdy.reshard", "sdy.sharding_constraint")
    return re.sub(
        r"sdy\.all_slice \[.*?\] (%\w+) out_sharding=(<.*?>) :",
        r"sdy.sharding_constraint \1 \2 :",
        text,
    )


def _programs(case):
    annotated = prepare(case.part1, "m").with_entry(case.function)
    spec = prepare(case.spec or case.part1, "spec").with_entry(case.spec_function or case.function)
    placement = Placement.from_sdy(spec.main, annotated)
    per_device = run_shardy(case.part1, case.pipeline, case.halo_exchange)
    impl = _standalone(per_device, case.function, placement.num_devices)
    return spec, impl, placement


def _standalone(text: str, name: str, n: int) -> str:
    """One per-device function as @main of a module XLA runs on n partitions as it is
    (`{manual}` shardings: XLA's partitioner leaves it alone)."""
    from jaxlib.mlir import ir

    module, _ = parse_mlir(extract_function(text, name, num_partitions=n))
    with module.context:
        main = next(
            op.operation for op in module.body.operations if op.operation.name == "func.func"
        )
        ftype = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        manual = ir.DictAttr.get({"mhlo.sharding": ir.StringAttr.get("{manual}")})
        main.attributes["arg_attrs"] = ir.ArrayAttr.get([manual] * len(ftype.inputs))
        main.attributes["res_attrs"] = ir.ArrayAttr.get([manual] * len(ftype.results))
    return module.operation.get_asm(enable_debug_info=True)


def test_corpus_is_read_in_place():
    assert len({c.path for c in CASES}) == 71
    assert all(split_bundle(c.path.read_text())[0] == c.part1 for c in CASES[:3])
    assert jax.device_count() >= 8
