"""openxla/shardy's executable tests: Shardy's partitioning plus tv's proof, per function.

    python bench/shardy.py [--folder partitioner|global-to-local|batching]

For every sharded function of ../shared/corpus/shardy (read in place, as the tests do):
seconds for `shardy_partition_and_check` (jaxlib's Shardy passes, then the proof), the
verdict and stages, and beside it the seconds XLA takes to compile the same function for
its mesh (`compile_and_load` with the function as `@main`; sharding ops written as
constraints, as XLA's Shardy import needs). One process; XLA gets 16 host devices.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

FOLDERS = {
    "partitioner": "partitioner",
    "global-to-local": "global-to-local",
    "batching": "gather-scatter-batching",
}


def xla_compile_seconds(text: str, name: str, n: int) -> float | None:
    """XLA's compile time of function @name on n devices; None if XLA rejects it."""
    import jax
    import numpy as np
    from jax._src import compiler
    from jax._src.lib import xla_client as xc

    from tv_ir.ir.importer import extract_function

    text = text.replace("sdy.reshard", "sdy.sharding_constraint")
    text = re.sub(
        r"sdy\.all_slice \[.*?\] (%\w+) out_sharding=(<.*?>) :",
        r"sdy.sharding_constraint \1 \2 :",
        text,
    )
    try:
        module = extract_function(text, name, num_partitions=n)
        devs = jax.devices("cpu")[:n]
        opts = compiler.get_compile_options(
            num_replicas=1, num_partitions=n, device_assignment=np.array(devs).reshape(1, n)
        )
        t0 = time.perf_counter()
        devs[0].client.compile_and_load(module, xc.DeviceList(tuple(devs)), opts)
        return time.perf_counter() - t0
    except Exception:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", choices=list(FOLDERS), default="partitioner")
    a = ap.parse_args()
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=16")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from shardy_corpus import cases

    from tv_ir.errors import TvError
    from tv_ir.pipeline import prepare, shardy_partition_and_check
    from tv_ir.prover.placement import Placement

    rows, seen = [], set()
    for c in cases():  # each function once (halo exchange on, where upstream runs it)
        if c.pipeline == FOLDERS[a.folder] and (c.path, c.function) not in seen:
            seen.add((c.path, c.function))
            rows.append(c)
    if not rows:
        print("Shardy corpus not found (../shared/corpus/shardy or TV_SHARDY_CORPUS)")
        return
    print(f"{'function':<62} {'dev':>3} {'verdict':>14} {'stages':>6} {'tv s':>6} {'xla s':>6}")
    total_tv = total_xla = 0.0
    for c in rows:
        t0 = time.perf_counter()
        try:
            r = shardy_partition_and_check(
                c.part1, c.function, c.spec, c.spec_function, c.pipeline, c.halo_exchange
            )
            verdict, stages = r.verdict, r.stats.stages
        except TvError as e:
            verdict, stages = type(e).__name__, "-"
        tv_s = time.perf_counter() - t0
        annotated = prepare(c.part1, "m").with_entry(c.function)
        n = Placement.from_sdy(annotated.main, annotated).num_devices
        xla_s = xla_compile_seconds(c.part1, c.function, n)
        total_tv += tv_s
        total_xla += xla_s or 0.0
        xla = f"{xla_s:.3f}" if xla_s is not None else "-"
        print(f"{c.id[:62]:<62} {n:>3} {verdict:>14} {stages:>6} {tv_s:>6.3f} {xla:>6}")
    print(f"\n{len(rows)} functions: tv {total_tv:.2f} s in all, XLA compile {total_xla:.2f} s")
    print("tv s: Shardy's passes (jaxlib) + proof; xla s: XLA CPU compile of the same function")


if __name__ == "__main__":
    main()
