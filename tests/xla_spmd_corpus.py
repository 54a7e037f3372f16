"""XLA's SPMD partitioner unit-test modules (../shared/corpus/xla_spmd, read in place).

Each module goes through XLA's partitioner on CPU as its unit test runs it (sharding
propagation off, `num_devices` partitions) and tv checks the per-device program XLA dumps
right after `spmd-partitioning` against the module itself (`tv check BEFORE AFTER`: the
layouts of its results come from the module's annotations). A refutation is replayed on
XLA: the partitioned executable on its devices against the unpartitioned module on one.
Used by tests/test_xla_spmd_corpus.py and bench/xla_spmd.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("TV_XLA_SPMD_CORPUS", ROOT.parent / "shared" / "corpus" / "xla_spmd"))


@dataclass
class Case:
    name: str
    path: Path
    num_devices: int | None
    test_options: dict = field(default_factory=dict)
    expects_partitioner_error: bool = False
    tags: list = field(default_factory=list)


def cases() -> list[Case]:
    """Every module of the corpus (empty when the folder is absent)."""
    index = CORPUS / "cases.json"
    if not index.is_file():
        return []
    return [
        Case(
            c["name"],
            CORPUS / c["file"],
            c.get("num_devices"),
            c.get("test_options") or {},
            bool(c.get("expects_partitioner_error")),
            list(c.get("tags") or []),
        )
        for c in json.loads(index.read_text())
    ]


def partition_case(case: Case, as_stablehlo: bool = False):
    """(the module as StableHLO text, XLA's `Partitioned`) for `case` on its devices."""
    from tv_ir.partitioner import hlo_to_stablehlo_text, partition

    before = hlo_to_stablehlo_text(case.path.read_text(), case.num_devices)
    return before, partition(before, case.num_devices, propagate=False, as_stablehlo=as_stablehlo)


def xla_layouts(parted):
    """The executable's result shardings, as the caller's layouts: where the module leaves
    a result unannotated (replicated, as the unit tests read it) neither program says."""
    from tv_ir.boundary_layouts import GivenLayouts

    return GivenLayouts(out_shardings=list(parted.out_shardings))


def unpartitioned(before: str) -> str:
    """The module for one device: every `mhlo.sharding` and the partition count dropped."""
    from jaxlib.mlir import ir

    from tv_ir.importer import mlir_context

    def strip(op) -> None:
        if "mhlo.sharding" in op.attributes:
            del op.attributes["mhlo.sharding"]
        for key in ("arg_attrs", "res_attrs"):
            if key in op.attributes:
                dicts = [
                    ir.DictAttr.get({a.name: a.attr for a in d if a.name != "mhlo.sharding"})
                    for d in ir.ArrayAttr(op.attributes[key])
                ]
                op.attributes[key] = ir.ArrayAttr.get(dicts)
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    strip(inner.operation)

    with mlir_context():
        m = ir.Module.parse(before)
        strip(m.operation)
        i32 = ir.IntegerType.get_signless(32)
        m.operation.attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(i32, 1)
        return m.operation.get_asm(enable_debug_info=True)


def replay_on_xla(before: str, parted, inputs: list[np.ndarray]) -> dict:
    """Run XLA's partitioned executable on its devices and the unpartitioned module on one,
    on `inputs` (global values, argument order). `differs` is True when some device's piece
    of some result differs from its block of the single-device result."""
    import jax
    from jax._src import compiler
    from jax._src.lib import xla_client as xc
    from jax._src.sharding_impls import GSPMDSharding

    n = parted.num_partitions
    devs = jax.devices("cpu")[:n]
    exe = parted.executable
    inputs = [_as_parameter(x, t) for x, t in zip(inputs, _argument_types(before), strict=True)]
    with jax.enable_x64(True):
        opts = compiler.get_compile_options(num_replicas=1, num_partitions=1)
        single = devs[0].client.compile_and_load(
            unpartitioned(before), xc.DeviceList((devs[0],)), opts
        )
        want = [
            np.asarray(o)
            for o in single.execute([jax.device_put(np.asarray(x), devs[0]) for x in inputs])
        ]
        arrays = []
        for x, proto in zip(inputs, exe.get_parameter_shardings(), strict=True):
            x = np.asarray(x)
            sharding = GSPMDSharding(devs, xc.HloSharding.from_proto(proto))
            arrays.append(jax.make_array_from_callback(x.shape, sharding, lambda i, x=x: x[i]))
        outs = exe.execute_sharded(arrays).disassemble_into_single_device_arrays()
        worst = {"differs": False}
        for k, (per_device, proto) in enumerate(zip(outs, exe.get_output_shardings(), strict=True)):
            sharding = GSPMDSharding(devs, xc.HloSharding.from_proto(proto))
            boxes = sharding.devices_indices_map(want[k].shape)
            for d, piece in enumerate(per_device):
                block = want[k][boxes[devs[d]]]
                got = np.asarray(piece)
                if got.shape != block.shape or not _close(got, block):
                    return {"differs": True, "output": k, "device": d}
        return worst


def _argument_types(before: str) -> list:
    from tv_ir.pipeline import prepare

    return list(prepare(before, "module").main.arg_types)


def _as_parameter(x, t) -> np.ndarray:
    """A counterexample input (floats replayed in float64) in the parameter's own type."""
    import ml_dtypes

    names = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32, "f64": np.float64}
    dtype = names.get(t.dtype) or np.dtype(t.numpy_dtype)
    return np.asarray(x).astype(dtype)


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind in "fc" or b.dtype.kind in "fc":
        a, b = a.astype(np.float64), b.astype(np.float64)
        scale = max(1.0, float(np.nanmax(np.abs(b))) if b.size else 1.0)
        return bool(np.allclose(a, b, rtol=1e-3, atol=1e-3 * scale, equal_nan=True))
    return bool(np.array_equal(a, b))
