"""XLA's SPMD partitioner corpus as a regression suite for `tv check SUITE` (docs/regression.md).

    python bench/xla_spmd_suite.py OUT_DIR [--only NAME ...] [--limit N]
    tv check OUT_DIR/suite.jsonl --workers 2 --junit OUT_DIR/junit.xml   # then again: cached

For each module of ../shared/corpus/xla_spmd (or TV_XLA_SPMD_CORPUS), XLA partitions it on
CPU as bench/xla_spmd.py does (its unit test's way: no sharding propagation), and the
per-device program it dumps is written to OUT_DIR as `NAME.impl.hlo`. The manifest
`OUT_DIR/suite.jsonl` pairs it with the corpus module, read in place (never copied), and
gives XLA's output shardings. Modules XLA cannot partition on CPU are left out (listed).
Modules the corpus knows GSPMD miscompiles (docs/distributed.md) expect `not_equivalent`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from tv_ir.xla.partitioner import ensure_host_devices  # noqa: E402

ensure_host_devices(16)

# GSPMD miscompiles tv refutes and XLA confirms (docs/distributed.md, "The XLA SPMD corpus")
MISCOMPILED = {
    "Dot2DPartitionedNoncontractingAndContracting3",
    "IndexPassthroughScatterPartitionedIndexVectorDim",
    "DynamicUpdateSliceAlongPartitionedDimension2",
}


def worker(name: str, out: Path) -> None:
    """Child process (XLA aborts on some modules): partition one module, print its entry."""
    from xla_spmd_corpus import cases, partition_case

    case = next(c for c in cases() if c.name == name)
    _, parted = partition_case(case)
    impl = out / f"{case.name}.impl.hlo"
    impl.write_text(parted.per_device_hlo)
    entry = {
        "name": case.name,
        "spec": os.path.relpath(case.path, out),
        "impl": impl.name,
        "num_partitions": parted.num_partitions,
        "out_shardings": list(parted.out_shardings),
    }
    if case.name in MISCOMPILED:
        entry["expect"] = "not_equivalent"
    print(json.dumps(entry))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", nargs="*", help="these modules only")
    ap.add_argument("--limit", type=int, help="the first N modules only")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.worker:
        return worker(a.worker, a.out)
    from xla_spmd_corpus import cases

    chosen = [c for c in cases() if not a.only or c.name in a.only]
    if not chosen:
        sys.exit("no corpus modules (set TV_XLA_SPMD_CORPUS to ../shared/corpus/xla_spmd)")
    chosen = chosen[: a.limit] if a.limit else chosen
    entries, skipped, t0 = [], [], time.perf_counter()
    for case in chosen:
        run = subprocess.run(
            [sys.executable, __file__, str(a.out), "--worker", case.name],
            capture_output=True,
            text=True,
        )
        lines = run.stdout.strip().splitlines()
        if run.returncode != 0 or not lines:
            why = (run.stderr.strip().splitlines() or [f"exit {run.returncode}"])[-1]
            skipped.append(f"{case.name}: {why[:120]}")
            continue
        entries.append(json.loads(lines[-1]))
    manifest = a.out / "suite.jsonl"
    manifest.write_text("".join(json.dumps(e) + "\n" for e in entries))
    print(
        f"{manifest}: {len(entries)} pairs ({time.perf_counter() - t0:.0f} s of XLA "
        f"partitioning); {len(skipped)} modules XLA did not partition on CPU"
    )
    for line in skipped:
        print(f"  not partitioned: {line}")


if __name__ == "__main__":
    main()
