"""Partitioner bugs, planted after partitioning: XLA's per-device program is altered the way
a buggy SPMD partitioner would get it wrong, and tv must refute the result.

- `wrong_replica_group`: the first all-reduce sums over wrong device groups (two devices of
  different groups and positions swapped).
- `wrong_shard_offset`: the first all-gather concatenates its pieces in the wrong order (each
  device's shard lands at another's offset); without one, the first per-device offset table
  (`s32[N] constant`) is rotated by one device.

Also writes the per-device program as StableHLO with `mhlo.sharding` on its arguments and
results, so `tv check SPEC PER_DEVICE.mlir` reads it from a file.
"""

from __future__ import annotations

import re
from pathlib import Path

from tv_ir.errors import BadInput
from tv_ir.report.result import Report
from tv_ir.xla.partitioner import Partitioned, partition

PARTITIONER_BUGS = ("wrong_replica_group", "wrong_shard_offset")
_GROUPS = re.compile(r"replica_groups=\{(\{[\d,]+\}(?:,\{[\d,]+\})*)\}")


def _parse_groups(s: str) -> list[list[int]]:
    return [[int(x) for x in g.split(",")] for g in re.findall(r"\{([\d,]+)\}", s)]


def _format_groups(groups: list[list[int]]) -> str:
    return "replica_groups={" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"


def mutate(hlo: str, kind: str) -> str:
    """The per-device HLO text with one planted partitioner bug."""
    lines = hlo.splitlines()
    for i, line in enumerate(lines):
        m = _GROUPS.search(line)
        if m is None:
            continue
        groups = _parse_groups(m.group(1))
        if kind == "wrong_replica_group" and " all-reduce(" in line and len(groups) > 1:
            groups[0][0], groups[1][-1] = groups[1][-1], groups[0][0]
        elif kind == "wrong_shard_offset" and " all-gather(" in line and len(groups[0]) > 1:
            groups = [g[::-1] for g in groups]
        else:
            continue
        lines[i] = line[: m.start()] + _format_groups(groups) + line[m.end() :]
        return "\n".join(lines) + "\n"
    if kind == "wrong_shard_offset":
        for i, line in enumerate(lines):
            m = re.search(r"s32\[(\d+)\]\{0\} constant\(\{([-\d, ]+)\}\)", line)
            if m and len(set(m.group(2).split(","))) > 1:
                vals = [v.strip() for v in m.group(2).split(",")]
                rotated = ", ".join(vals[1:] + vals[:1])
                lines[i] = line[: m.start(2)] + rotated + line[m.end(2) :]
                return "\n".join(lines) + "\n"
    raise BadInput(f"no place to plant {kind} in this per-device program")


def per_device_mlir(parted: Partitioned, hlo: str | None = None) -> str:
    """The per-device program as StableHLO text, its layouts as `mhlo.sharding` attributes."""
    from jaxlib.mlir import ir

    from tv_ir.ir.importer import hlo_text_to_stablehlo_bytecode, mlir_context

    data = hlo_text_to_stablehlo_bytecode(hlo or parted.per_device_hlo, "per-device program")
    with mlir_context():
        m = ir.Module.parse(data)
        main = next(op for op in m.body.operations if op.attributes["sym_name"].value == "main")
        main.attributes["arg_attrs"] = ir.ArrayAttr.get(
            [_sharding(s) for s in parted.arg_shardings]
        )
        main.attributes["res_attrs"] = ir.ArrayAttr.get(
            [_sharding(s) for s in parted.out_shardings]
        )
        i32 = ir.IntegerType.get_signless(32)
        m.operation.attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(
            i32, parted.num_partitions
        )
        return m.operation.get_asm(enable_debug_info=True)


def _sharding(s: str):
    from jaxlib.mlir import ir

    return ir.DictAttr.get({"mhlo.sharding": ir.StringAttr.get(s)})


def check_partitioner_bug(annotated: str, kind: str, **options) -> Report:
    """Partition `annotated` with XLA, plant `kind`, and check it against the module's own
    unsharded meaning."""
    from tv_ir.pipeline import check

    parted = partition(annotated)
    return check(annotated, per_device_mlir(parted, mutate(parted.per_device_hlo, kind)), **options)


def write_all(out_dir: str, stem: str, export, manual_bugs) -> None:
    """Files for the CLI: `<stem>.impl.mlir` (annotated), `<stem>.spec.mlir`, the manual-region
    variants and the per-device programs with planted partitioner bugs."""
    out = Path(out_dir)
    exp = export(None)
    paths = exp.write(out, stem)
    parted = partition(exp.impl.text)
    (out / f"{stem}.per_device.mlir").write_text(per_device_mlir(parted))
    for kind in PARTITIONER_BUGS:
        text = per_device_mlir(parted, mutate(parted.per_device_hlo, kind))
        (out / f"{stem}.{kind}.mlir").write_text(text)
    for bug in manual_bugs:
        export(bug).write(out, f"{stem}.{bug}")
    print(f"wrote {sorted(p.name for p in out.glob(stem + '*'))} ({paths['impl'].parent})")
