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
    from tv_ir.xla.partitioner import hlo_to_stablehlo_text, partition

    before = hlo_to_stablehlo_text(case.path.read_text(), case.num_devices)
    return before, partition(before, case.num_devices, propagate=False, as_stablehlo=as_stablehlo)


def xla_layouts(parted):
    """The executable's result shardings, as the caller's layouts: where the module leaves
    a result unannotated (replicated, as the unit tests read it) neither program says."""
    from tv_ir.prover.boundary_layouts import GivenLayouts

    return GivenLayouts(out_shardings=list(parted.out_shardings))


def unpartitioned(before: str) -> str:
    """The module for one device: every `mhlo.sharding` and the partition count dropped."""
    from jaxlib.mlir import ir

    from tv_ir.ir.importer import mlir_context

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


def per_device_only(before: str, parted) -> bool:
    """Whether the module runs only on devices: some argument or result is manual (fully
    or in part), or it holds GSPMD manual regions (`@SPMDFullToShardShape`); it has no run
    on one device."""
    from tv_ir.prover.manual_boundary import is_manual

    shardings = list(parted.arg_shardings) + list(parted.out_shardings)
    return any(is_manual(s) for s in shardings) or "SPMDFullToShardShape" in before


def argument_shapes(before: str, parted) -> list[tuple]:
    """The shapes of tv's counterexample inputs at the real sizes: the module's arguments,
    manual ones stacked one row per instance (tv_ir.prover.manual_boundary)."""
    if not per_device_only(before, parted):
        return [tuple(t.shape) for t in _argument_types(before)]
    return [lay.global_shape for lay in _stacked_placement(before, parted).args]


def _stacked_placement(before: str, parted):
    from tv_ir.prover.manual_boundary import stacked_placement

    main = _module(before).main
    return stacked_placement(
        list(main.arg_types),
        list(main.result_types),
        list(parted.arg_shardings),
        list(parted.out_shardings),
        parted.num_partitions,
    )


def replay_on_xla(
    before: str, parted, inputs: list[np.ndarray], reference_hlo: str | None = None
) -> dict:
    """Run the per-device program XLA dumped after partitioning on its devices (each device
    its piece of each input, padded as XLA pads, zeros off a maximal layout's device;
    `{manual}` shardings so XLA leaves it as it
    is) and the unpartitioned module on one device, on `inputs` (global values, argument
    order). `differs` is True when some device's piece of some result differs from its
    block of the single-device result (unreduced results: the sum over each group).

    A module with manual boundary values or GSPMD manual regions has no run on one device:
    its manual inputs are stacked by instance, and the reference is another per-device
    program on the same pieces (`reference_hlo`: XLA's own partitioning, which tv proved
    equal to the module, against a planted bug); without one this is an error, not a
    confirmation."""
    if per_device_only(before, parted):
        if reference_hlo is None:
            raise ValueError("a module that runs only on devices has no single-device reference")
        return _replay_per_device(before, parted, inputs, reference_hlo)
    import jax
    from jax._src import compiler
    from jax._src.lib import xla_client as xc

    from tv_ir.prover.placement import Placement

    n = parted.num_partitions
    devs = jax.devices("cpu")[:n]
    spec = _module(before)
    inputs = [_as_parameter(x, t) for x, t in zip(inputs, spec.main.arg_types, strict=True)]
    placement = Placement.from_shardings(spec.main, parted.arg_shardings, parted.out_shardings, n)
    with jax.enable_x64(True):
        opts = compiler.get_compile_options(num_replicas=1, num_partitions=1)
        single = devs[0].client.compile_and_load(
            unpartitioned(before), xc.DeviceList((devs[0],)), opts
        )
        want = [
            np.asarray(o)
            for o in single.execute([jax.device_put(np.asarray(x), devs[0]) for x in inputs])
        ]
        pieces = [
            [_piece(lay, x, d) for lay, x in zip(placement.args, inputs, strict=True)]
            for d in range(n)
        ]
        got = run_per_device(_manual_program(parted.per_device_hlo, n), pieces, n)
    for k, lay in enumerate(placement.results):
        held = lay.assemble_instances([got[d][k] for d in range(n)])[0]
        for d in lay.holders:
            box = tuple(slice(a, b) for a, b in lay.box(d))
            mine = np.asarray(got[d][k])[tuple(slice(0, b - a) for a, b in lay.box(d))]
            if lay.unreduced:
                mine = held[box]
            if mine.shape != want[k][box].shape or not _close(mine, want[k][box]):
                return {"differs": True, "output": k, "device": d}
    return {"differs": False}


def _replay_per_device(before: str, parted, inputs: list[np.ndarray], reference_hlo: str) -> dict:
    """`parted`'s per-device program against `reference_hlo` on every device, each device
    its piece of the stacked inputs; `differs` when some device's result differs within the
    box it holds."""
    n = parted.num_partitions
    placement = _stacked_placement(before, parted)
    types = _argument_types(before)
    pieces = []
    for d in range(n):
        args = []
        for lay, x, t in zip(placement.args, inputs, types, strict=True):
            x = _as_parameter(x, t)
            piece = _piece(lay, x, d)
            stacked = len(lay.global_shape) == len(t.shape) + 1  # one row per instance
            args.append(piece.reshape(piece.shape[1:]) if stacked else piece)
        pieces.append(args)
    got = run_per_device(_manual_program(parted.per_device_hlo, n), pieces, n)
    want = run_per_device(_manual_program(reference_hlo, n), pieces, n)
    for k, lay in enumerate(placement.results):
        if lay.unreduced:  # partial sums: only their sums mean something
            mine = lay.assemble([np.asarray(got[d][k]) for d in range(n)])
            if not _close(mine, lay.assemble([np.asarray(want[d][k]) for d in range(n)])):
                return {"differs": True, "output": k, "device": None}
            continue
        for d in lay.holders:
            local = lay.local_shape(d)[-np.ndim(want[d][k]) :] if np.ndim(want[d][k]) else ()
            box = tuple(slice(0, m) for m in local)
            if not _close(np.asarray(got[d][k])[box], np.asarray(want[d][k])[box]):
                return {"differs": True, "output": k, "device": d}
    return {"differs": False}


def _piece(lay, x: np.ndarray, d: int) -> np.ndarray:
    """Device d's buffer of input x: its piece, padded as XLA pads; zeros on the devices
    that do not hold a maximal layout's value (their buffers mean nothing, as tv reads them)."""
    piece = lay.shard(x, d, pad=np.zeros((), x.dtype))
    return np.zeros_like(piece) if lay.maximal not in (None, d) else piece


def run_per_device(text: str, per_device: list[list], n: int) -> list[list]:
    """Run a per-device StableHLO program on n XLA:CPU devices; [device][result]."""
    import jax
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
        local = [np.asarray(args[k]) for args in per_device]  # equal (padded) shapes
        shards = [jax.device_put(p[None], d) for p, d in zip(local, devs, strict=True)]
        shape = (n, *local[0].shape)
        arrays.append(jax.make_array_from_single_device_arrays(shape, sharding, shards))
    outs = exe.execute_sharded(arrays).disassemble_into_single_device_arrays()
    return [[np.asarray(o[d])[0] for o in outs] for d in range(n)]


def _manual_program(hlo: str, n: int) -> str:
    """The per-device HLO as StableHLO that XLA runs as it is on n partitions: every
    argument and result one more leading dimension of 1 (a device's slot of the stacked
    inputs) and `{manual}`."""
    from jaxlib.mlir import ir

    from tv_ir.ir.importer import hlo_text_to_stablehlo_bytecode, mlir_context

    with mlir_context():
        m = ir.Module.parse(hlo_text_to_stablehlo_bytecode(hlo, "per-device program"))
        text = m.operation.get_asm()
    return _wrap_manual(text, n)


def _wrap_manual(text: str, n: int) -> str:
    """Rename @main to @per_device and add a @main over [1, ...]-shaped values that calls it."""
    from jaxlib.mlir import ir

    from tv_ir.ir.importer import mlir_context

    with mlir_context(), ir.Location.unknown():
        m = ir.Module.parse(text)
        main = next(
            o.operation
            for o in m.body.operations
            if o.operation.name == "func.func"
            and ir.StringAttr(o.operation.attributes["sym_name"]).value == "main"
        )
        main.attributes["sym_name"] = ir.StringAttr.get("per_device")
        main.attributes["sym_visibility"] = ir.StringAttr.get("private")
        for key in ("arg_attrs", "res_attrs"):
            if key in main.attributes:
                del main.attributes[key]
        ftype = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        ins, outs = list(ftype.inputs), list(ftype.results)
        i32 = ir.IntegerType.get_signless(32)
        m.operation.attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(i32, n)
        m.operation.attributes["mhlo.num_replicas"] = ir.IntegerAttr.get(i32, 1)
        body = m.operation.get_asm()

    def stacked(t) -> str:
        t = str(t)
        inner = t[len("tensor<") : -1]
        return f"tensor<1x{inner}>"

    args = ", ".join(
        f'%a{k}: {stacked(t)} {{mhlo.sharding = "{{manual}}"}}' for k, t in enumerate(ins)
    )
    res = ", ".join(f'{stacked(t)} {{mhlo.sharding = "{{manual}}"}}' for t in outs)
    lines = [f"  func.func @main({args}) -> ({res}) {{"]
    for k, t in enumerate(ins):
        lines.append(f"    %l{k} = stablehlo.reshape %a{k} : ({stacked(t)}) -> {t}")
    call_args = ", ".join(f"%l{k}" for k in range(len(ins)))
    call_types = ", ".join(str(t) for t in ins)
    out_types = ", ".join(str(t) for t in outs)
    lines.append(
        f"    %r:{len(outs)} = func.call @per_device({call_args}) : ({call_types}) -> ({out_types})"
    )
    for k, t in enumerate(outs):
        lines.append(f"    %s{k} = stablehlo.reshape %r#{k} : ({t}) -> {stacked(t)}")
    rets = ", ".join(f"%s{k}" for k in range(len(outs)))
    lines.append(f"    return {rets} : {', '.join(stacked(t) for t in outs)}")
    lines.append("  }")
    head, _, _ = body.rpartition("}")
    return head + "\n".join(lines) + "\n}\n"


def _module(before: str):
    from tv_ir.pipeline import prepare

    return prepare(before, "module")


def _argument_types(before: str) -> list:
    return list(_module(before).main.arg_types)


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
