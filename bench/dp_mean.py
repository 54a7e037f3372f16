"""A data-parallel mean written the ways users write it, at 512 devices (issue #12).

    python bench/dp_mean.py                          # every form, 512 devices x 8 rows, 4096
    python bench/dp_mean.py --devices 64 --forms steps,powers --time-limit 30

One `jax.shard_map` over a "data" axis: each device holds 8 rows of a (devices x 8, 4096)
batch and the whole (4096, 4096) weight, and returns the global mean of `tanh(x @ w) ** 2`;
the spec is that mean on one device. The forms (`--forms`) differ only in where the count
is divided:

- `global`: `psum(s) / (devices * rows * width)`, one constant;
- `before`: `psum(s / (devices * rows * width))`;
- `pmean`: `pmean(s / (rows * width))`;
- `mean-pmean`: `pmean(mean(y))`, the device's mean then the mean over devices;
- `steps`: `psum(s / rows / width) / devices`, three constants in turn;
- `powers`: `psum(s) * 2**-k * 2**-k`, the count as two powers of two (devices x rows and
  width powers of two, equal);
- `elementwise`: `psum(sum(y / width / rows)) / devices`, scaled before the sum;
- `split`: `psum(sum(y / width) / rows) / devices`, the count split across the sum;
- `steps-bug`: `psum(s / rows / width) / (devices / 2)`, twice the mean.

Each row runs in a fresh child: "tv s" is `verify` (tracing, shape and mesh reduction,
proof, the checks beside it), "process s" the child from start to exit (imports and the
freeing of what the check built included), "peak MB" its peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

FORMS = [
    "global", "before", "pmean", "mean-pmean", "steps", "powers", "elementwise", "split",
    "steps-bug",
]  # fmt: skip


def _program(form: str, devices: int, rows: int, width: int):
    import jax
    import jax.numpy as jnp
    from jax.sharding import AbstractMesh
    from jax.sharding import PartitionSpec as P

    count = devices * rows * width
    half = float(2 ** ((count.bit_length() - 1) // 2))  # count = half**2 for a power of 4

    def spec(x, w):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    def body(x, w):
        y = jnp.tanh(x @ w) ** 2
        s = jnp.sum(y)
        if form == "global":
            return jax.lax.psum(s, "data") / count
        if form == "before":
            return jax.lax.psum(s / count, "data")
        if form == "pmean":
            return jax.lax.pmean(s / (rows * width), "data")
        if form == "mean-pmean":
            return jax.lax.pmean(jnp.mean(y), "data")
        if form == "steps":
            return jax.lax.psum(s / rows / width, "data") / devices
        if form == "powers":
            return jax.lax.psum(s, "data") * (1 / half) * (1 / half)
        if form == "elementwise":
            return jax.lax.psum(jnp.sum(y / width / rows), "data") / devices
        if form == "split":
            return jax.lax.psum(jnp.sum(y / width) / rows, "data") / devices
        return jax.lax.psum(s / rows / width, "data") / (devices / 2)  # steps-bug

    impl = jax.shard_map(
        body,
        mesh=AbstractMesh((devices,), ("data",)),
        in_specs=(P("data"), P()),
        out_specs=P(),
        check_vma=False,
    )
    x = jax.ShapeDtypeStruct((devices * rows, width), jnp.float32)
    w = jax.ShapeDtypeStruct((width, width), jnp.float32)
    return spec, impl, (x, w)


def worker(form: str, devices: int, rows: int, width: int, time_limit: float) -> None:
    from tv_ir.frontends.jax import verify

    spec, impl, args = _program(form, devices, rows, width)
    t0 = time.perf_counter()
    report = verify(impl, *args, spec=spec, time_limit=time_limit)
    seconds = time.perf_counter() - t0
    summary = (report.reduction or {}).get("summary", "").splitlines()
    print(
        json.dumps(
            {
                "verdict": report.verdict,
                "seconds": seconds,
                "shape": summary[0].removeprefix("shape reduction: ") if summary else "",
                "reason": report.reason or "",
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forms", default=",".join(FORMS), help="comma-separated forms")
    ap.add_argument("--devices", type=int, default=512)
    ap.add_argument("--rows", type=int, default=8, help="rows per device")
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--time-limit", type=float, default=60.0, help="tv's time_limit per row")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker[0], a.devices, a.rows, a.width, a.time_limit)
        return
    from child_process import run_worker

    forms = a.forms.split(",")
    bad = [f for f in forms if f not in FORMS]
    if bad:
        sys.exit(f"error: unknown form {bad[0]!r} (forms: {', '.join(FORMS)})")
    count = a.devices * a.rows * a.width
    if "powers" in forms and (count & (count - 1) or (count.bit_length() - 1) % 2):
        sys.exit(f"error: the form powers needs devices x rows x width a power of 4, not {count}")
    print(
        f"{a.devices} devices x {a.rows} rows, width {a.width}, time limit {a.time_limit:g} s "
        f"(load {os.getloadavg()[0]:.1f})\n"
    )
    print("| form | verdict | shape reduction | tv s | process s | peak MB |")
    print("|---|---|---|---|---|---|")
    for form in forms:
        t0 = time.perf_counter()
        args = [form, "--devices", str(a.devices), "--rows", str(a.rows)]
        args += ["--width", str(a.width), "--time-limit", str(a.time_limit)]
        child = run_worker(__file__, args, timeout=a.time_limit * 4 + 120)
        wall = time.perf_counter() - t0
        r = child.result
        if r is None:
            print(
                f"| {form} | {child.killed or 'failed: ' + child.tail()} | | | {wall:.1f} | "
                f"{child.peak_mb:,.0f} |"
            )
            continue
        verdict = r["verdict"] + (f" ({r['reason']})" if r["verdict"] == "unknown" else "")
        print(
            f"| {form} | {verdict} | {r['shape']} | {r['seconds']:.1f} | {wall:.1f} | "
            f"{child.peak_mb:,.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
