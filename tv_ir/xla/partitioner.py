"""Run XLA's SPMD partitioner (through jaxlib) on an annotated module.

The input is a pre-partition module (StableHLO with `sdy.sharding` or `mhlo.sharding`
annotations, e.g. `jax.jit(f, in_shardings=...).lower(...)`). XLA compiles it for N CPU
devices; the HLO module right after the `spmd-partitioning` pass is the per-device program
tv verifies, and the executable's parameter/output shardings give the layouts of its
arguments and results. XLA needs N host devices: `ensure_host_devices(N)` must run before
JAX creates its CPU backend (past 2,048 devices it also gives XLA CPU collectives).
"""

from __future__ import annotations

import glob
import os
import re
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from tv_ir.errors import BadInput

DEFAULT_HOST_DEVICES = 8


# XLA's CPU client numbers a process's devices below this bound; a device assignment
# reaching past it is refused ("Multiprocess computations aren't implemented on the CPU
# backend") unless the client has CPU collectives
CPU_DEVICES_PER_PROCESS = 2048


def ensure_host_devices(n: int = DEFAULT_HOST_DEVICES) -> None:
    """Ask XLA for `n` CPU devices (effective only before JAX creates its CPU backend).

    More than `CPU_DEVICES_PER_PROCESS` devices (asked here or in `XLA_FLAGS`) also get a
    one-process distributed runtime with gloo collectives, so that XLA compiles, and
    partitions, for all of them."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # keep XLA's C++ logging off stderr
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    if host_device_count() > CPU_DEVICES_PER_PROCESS:
        _cpu_collectives()


def host_device_count() -> int:
    """The CPU device count `XLA_FLAGS` asks for (1 when it asks for none)."""
    found = re.findall(
        r"xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", "")
    )
    return int(found[-1]) if found else 1


def _cpu_collectives() -> None:
    """Gloo collectives over a distributed runtime of this one process, before JAX's CPU
    backend exists (afterwards it is too late, and `partition` says so)."""
    import socket

    import jax
    from jax._src import distributed, xla_bridge

    if xla_bridge.backends_are_initialized() or distributed.global_state.client is not None:
        return
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"localhost:{port}",
        num_processes=1,
        process_id=0,
        cluster_detection_method="deactivate",
    )


@dataclass
class Partitioned:
    per_device_hlo: str  # HLO text of the per-device program
    num_partitions: int
    num_replicas: int
    arg_shardings: list[str]  # HloSharding strings, one per @main argument
    out_shardings: list[str]  # one per result
    compile_seconds: float = 0.0  # XLA's compile_and_load (partitioning and the CPU backend)
    executable: Any = None  # XLA's loaded executable (runs the partitioned program)
    # the same program as StableHLO from XLA's proto dump: XLA's spmd module attributes
    # (mhlo.spmd_parameters_shardings / spmd_output_sharding), no mhlo.num_partitions
    per_device_stablehlo: str | None = None


def num_partitions_of(text: str) -> int:
    m = re.search(r"mhlo\.num_partitions\s*=\s*(\d+)", text)
    return int(m.group(1)) if m else 1


def hlo_to_stablehlo_text(hlo_text: str, num_partitions: int, num_replicas: int = 1) -> str:
    """An HLO module (text, e.g. with `sharding=` annotations) as StableHLO text XLA will
    partition for `num_partitions` devices (jaxlib's conversion keeps the shardings as
    `mhlo.sharding` but not the partition count, which is added)."""
    from jaxlib.mlir import ir

    from tv_ir.ir.importer import hlo_text_to_stablehlo_bytecode, mlir_context

    data = hlo_text_to_stablehlo_bytecode(hlo_text, "HLO module")
    with mlir_context():
        m = ir.Module.parse(data)
        i32 = ir.IntegerType.get_signless(32)
        m.operation.attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(i32, num_partitions)
        m.operation.attributes["mhlo.num_replicas"] = ir.IntegerAttr.get(i32, num_replicas)
        return m.operation.get_asm(enable_debug_info=True)


# the CPU code XLA generates after partitioning, cheaper to make (a half to two thirds of
# the compile): fusions emitted as LLVM IR by the older emitters in one module, not one
# module per kernel. The partitioned module and its shardings are the same; `pass_dumps`
# keeps XLA's own pipeline, whose passes it shows.
CHEAP_CODEGEN = {
    "xla_cpu_use_fusion_emitters": False,
    "xla_cpu_parallel_codegen_split_count": 1,
}


def partition(
    text: str,
    num_partitions: int | None = None,
    propagate: bool = True,
    as_stablehlo: bool = False,
    pass_dumps: str | None = None,
) -> Partitioned:
    """Partition an annotated StableHLO module with XLA; return the per-device program.

    `propagate=False` disables XLA's sharding propagation (`xla_disable_hlo_passes`), as
    XLA's partitioner unit tests run: an instruction without a sharding is replicated.
    `as_stablehlo` also gives the program as StableHLO converted from XLA's proto dump.
    `pass_dumps` is a directory where XLA dumps the module after every pass that changes it
    (`xla_dump_hlo_pass_re=.*`, what `tv passes` validates); a module without shardings
    is then compiled too, and `per_device_hlo` is empty.
    """
    import jax
    import numpy as np
    from jax._src import compiler
    from jax._src.lib import xla_client as xc

    n = num_partitions or num_partitions_of(text)
    devs = jax.devices("cpu")
    if len(devs) < n:
        raise BadInput(
            f"module asks for {n} partitions but XLA has {len(devs)} CPU devices "
            f"(set XLA_FLAGS=--xla_force_host_platform_device_count={n})"
        )
    devs = devs[:n]
    with tempfile.TemporaryDirectory() as scratch:
        dump = pass_dumps or scratch
        opts = compiler.get_compile_options(
            num_replicas=1,
            num_partitions=n,
            device_assignment=np.array(devs).reshape(1, n),
            env_options_overrides={
                "xla_dump_to": dump,
                "xla_dump_hlo_pass_re": ".*" if pass_dumps else "spmd-partitioning",
                # the module before partitioning carries the argument and result
                # shardings, read from it when the CPU backend cannot compile the program
                # without it XLA prints constants of more than a few elements as `{...}`
                "xla_dump_large_constants": True,
                # what tv reads is the module after partitioning and the shardings; the
                # CPU code XLA then generates is never run fast: not optimised (the same
                # partitioned module, a quarter of a second less per compile)
                "xla_backend_optimization_level": 0,
                **({} if pass_dumps else CHEAP_CODEGEN),
                **({} if propagate else {"xla_disable_hlo_passes": "sharding-propagation"}),
                **(
                    {"xla_dump_hlo_as_proto": True, "xla_dump_hlo_as_text": True}
                    if as_stablehlo
                    else {}
                ),
            },
        )
        if "sdy." not in text:
            opts.executable_build_options.use_shardy_partitioner = False
        t0 = time.perf_counter()
        exe, failure = None, None
        try:
            exe = devs[0].client.compile_and_load(text, xc.DeviceList(tuple(devs)), opts)
        except Exception as e:
            failure = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        seconds = time.perf_counter() - t0
        files = sorted(glob.glob(os.path.join(dump, "*after_spmd-partitioning*.txt")))
        if failure is not None and (pass_dumps or not files):
            if "Multiprocess" in failure and n > CPU_DEVICES_PER_PROCESS:
                failure += (
                    f" (XLA's CPU backend compiles for more than {CPU_DEVICES_PER_PROCESS} "
                    "devices only with CPU collectives: call tv_ir.xla.partitioner."
                    f"ensure_host_devices({n}), or import tv_ir.frontends.jax with XLA_FLAGS "
                    "set, before JAX's first computation)"
                )
            raise BadInput(f"XLA could not partition the module: {failure}")
        if not files and not pass_dumps:
            raise BadInput("XLA ran no SPMD partitioning on this module (no shardings?)")
        hlo = open(files[0]).read() if files else ""
        if exe is None:
            # partitioned, then the CPU backend failed (ops it cannot run, such as
            # ragged_all_to_all): the layouts are the partitioner input's annotations
            before = glob.glob(os.path.join(dump, "*before_spmd-partitioning*.txt"))
            if not before:
                raise BadInput(f"XLA could not partition the module: {failure}")
            args, outs = entry_shardings(open(before[0]).read())
            return Partitioned(hlo, n, 1, args, outs, seconds, None, None)
        stablehlo = None
        if as_stablehlo:
            with open(files[0].removesuffix(".txt") + ".hlo.pb", "rb") as f:
                stablehlo = _stablehlo_of_hlo_proto_dump(f.read())
    args = [str(xc.HloSharding.from_proto(s)) for s in exe.get_parameter_shardings()]
    outs = [str(xc.HloSharding.from_proto(s)) for s in exe.get_output_shardings()]
    return Partitioned(hlo, n, 1, args, outs, seconds, exe, stablehlo)


def entry_shardings(hlo_text: str) -> tuple[list[str], list[str]]:
    """The `sharding=` of each entry parameter and of each result (a tuple root's elements)
    in an HLO module's text, as `HloSharding` strings."""
    entry = hlo_text[hlo_text.index("\nENTRY ") :]
    params: dict[int, str] = {}
    outs: list[str] = []
    for line in entry.splitlines()[1:]:
        line = line.strip()
        if line == "}":
            break
        m = re.search(r"\bparameter\((\d+)\)", line)
        root = line.startswith("ROOT ")
        if not (m or root):
            continue
        at = line.find("sharding={")
        if at < 0:
            raise BadInput(f"entry {'result' if root else 'parameter'} without a sharding")
        sharding = _braced(line, at + len("sharding="))
        if m:
            params[int(m.group(1))] = sharding
        else:
            inner = sharding[1:-1].strip()
            outs = _top_level_items(inner) if inner.startswith("{") else [sharding]
    return [params[i] for i in range(len(params))], outs


def _braced(text: str, start: int) -> str:
    """The balanced `{...}` starting at `text[start]`."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start : i + 1]
    raise BadInput("unbalanced braces in a sharding")


def _top_level_items(inner: str) -> list[str]:
    """The `{...}` items of a tuple sharding's body, `{a}, {b}` -> [`{a}`, `{b}`]."""
    items, at = [], inner.find("{")
    while at >= 0:
        item = _braced(inner, at)
        items.append(item)
        at = inner.find("{", at + len(item))
    return items


def _stablehlo_of_hlo_proto_dump(data: bytes) -> str:
    """StableHLO text of XLA's `.hlo.pb` dump (an HloProto whose field 1 is the
    HloModuleProto that jaxlib's converter takes)."""
    from jax._src.lib import _jax
    from jaxlib.mlir import ir

    from tv_ir.ir.importer import mlir_context

    if not data or data[0] != 0x0A:  # field 1, length-delimited
        raise BadInput("XLA's HLO proto dump is not an HloProto")
    size, shift, i = 0, 0, 1
    while True:
        byte = data[i]
        size |= (byte & 0x7F) << shift
        shift, i = shift + 7, i + 1
        if byte < 0x80:
            break
    bytecode = _jax.mlir.hlo_to_stablehlo(data[i : i + size])
    with mlir_context():
        return ir.Module.parse(bytecode).operation.get_asm(enable_debug_info=True)
