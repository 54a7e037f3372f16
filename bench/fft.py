"""How verifying a sharded FFT grows with its length: `fft` is the DFT sum (n^2 products per
transformed dimension), so its terms grow with n.

    python bench/fft.py [--lengths 4,8,16,32] [--timeout SECONDS]

For each length n: the power spectrum |rfft(x)|^2 of x: f32[4, n] (spec) against the same
computed per device by a `jax.shard_map` over 2 devices (rows sharded). Each verification
runs in a fresh subprocess (peak memory: that child's `ru_maxrss`, interpreter, jaxlib and
z3 included). Beside it, the time XLA (CPU) takes to compile the sharded program
(`jax.jit(f).lower(...).compile()`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from child_process import run_worker

ROOT = Path(__file__).resolve().parents[1]
ROWS = 4


def programs(n: int):
    """(spec, impl) jitted functions and an example input for length n."""
    from functools import partial

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:2]), ("b",))

    def spec(x):
        return jnp.abs(jnp.fft.rfft(x)) ** 2

    impl = partial(jax.shard_map, mesh=mesh, in_specs=P("b"), out_specs=P("b"))(spec)
    return jax.jit(spec), jax.jit(impl), np.zeros((ROWS, n), np.float32)


def worker(n: int, timeout: float) -> None:
    """Child process: verify one length, print one JSON line."""
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import tv_ir

    spec, impl, x = programs(n)
    t0 = time.perf_counter()
    compiled = impl.lower(x)
    compiled.compile()
    xla = time.perf_counter() - t0
    s, i = spec.lower(x).as_text(), compiled.as_text()
    t0 = time.perf_counter()
    report = tv_ir.check(s, i, time_limit=timeout, memory_limit=3500)
    seconds = time.perf_counter() - t0
    print(json.dumps({"verdict": report.verdict, "seconds": seconds, "xla": xla}))


def run_child(n: int, timeout: float) -> tuple[dict, float]:
    child = run_worker(__file__, [str(n), "--timeout", str(timeout)], timeout + 120)
    result = child.result if child.returncode == 0 and child.result else None
    return result or {"verdict": child.killed or f"exit {child.returncode}"}, child.peak_mb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="4,8,16,32")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker is not None:
        sys.path.insert(0, str(ROOT))
        worker(a.worker, a.timeout)
        return
    print(f"| n | verdict | tv s | peak MB | XLA compile s |  (x: f32[{ROWS}, n], 2 devices)")
    print("|---|---|---|---|---|")
    for n in (int(v) for v in a.lengths.split(",")):
        r, mb = run_child(n, a.timeout)
        tv = f"{r['seconds']:.2f}" if "seconds" in r else "-"
        xla = f"{r['xla']:.2f}" if "xla" in r else "-"
        print(f"| {n} | {r['verdict']} | {tv} | {mb:.0f} | {xla} |", flush=True)


if __name__ == "__main__":
    main()
