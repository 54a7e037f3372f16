"""Distributed programs: `jax.jit` with NamedShardings, partitioned by XLA and verified.

    python bench/spmd.py [--quick] [--timeout SECONDS]

A 2-layer MLP forward pass and SGD training steps (MSE loss, `jax.value_and_grad` with
respect to both weights, `w - lr * g`; batch 8, d 16, hidden 32), batch over "data" and the
hidden dimension over "model" (Megatron); the same step written with `jax.grad` and the loss
computed a second time; and that step with the weights over "data" (FSDP); on meshes of 2, 4
and 8 host CPU devices. Each
verification (`partition_and_check`: XLA's SPMD partitioner, then the proof) runs in a fresh
subprocess. Beside it, the time XLA (CPU) takes to compile the same annotated module
(`jax.jit(f, in_shardings=..., out_shardings=...).lower(...).compile()`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from child_process import run_worker  # noqa: E402

from bench.depth import count_ops  # noqa: E402

BATCH, D, HIDDEN = 8, 16, 32
LR = 0.1
MESHES = [(1, 2), (2, 2), (2, 4)]


def worker(path: str) -> None:
    """Child process: partition and prove one module, print one JSON line."""
    from tv_ir.xla.partitioner import ensure_host_devices

    ensure_host_devices()
    from tv_ir.pipeline import partition_and_check

    t0 = time.perf_counter()
    report = partition_and_check(Path(path))
    seconds = time.perf_counter() - t0
    out = {"verdict": report.verdict, "stages": report.stats.stages, "seconds": seconds}
    if report.reason:
        out["reason"] = report.reason
    print(json.dumps(out))


def programs():
    """(name, function, shardings(s) -> (in, out), argument shapes)."""
    import jax
    import jax.numpy as jnp

    def mlp(x, w1, w2):
        return jax.nn.relu(x @ w1) @ w2

    def mse(weights, x, y):
        return jnp.mean((mlp(x, *weights) - y) ** 2)

    def step(w1, w2, x, y):
        loss, (g1, g2) = jax.value_and_grad(mse)((w1, w2), x, y)
        return w1 - LR * g1, w2 - LR * g2, loss

    def grad_step(w1, w2, x, y):  # jax.grad, and the loss computed a second time
        g1, g2 = jax.grad(mse)((w1, w2), x, y)
        return w1 - LR * g1, w2 - LR * g2, mse((w1, w2), x, y)

    def fwd_shardings(s):
        return (s("data", None), s(None, "model"), s("model", None)), s("data", None)

    def step_shardings(s):
        w = (s(None, "model"), s("model", None))
        return (*w, s("data", None), s("data", None)), (*w, s())

    def fsdp_shardings(s):  # weights over "data" as well as the batch
        w = (s("data", None), s("data", None))
        return (*w, s("data", None), s("data", None)), (*w, s())

    shapes = [(D, HIDDEN), (HIDDEN, D), (BATCH, D), (BATCH, D)]

    return [
        ("mlp fwd", mlp, fwd_shardings, [(BATCH, D), (D, HIDDEN), (HIDDEN, D)]),
        ("train step", step, step_shardings, shapes),
        ("grad step", grad_step, step_shardings, shapes),
        ("fsdp step", grad_step, fsdp_shardings, shapes),
    ]


def run_child(path: Path, timeout: float) -> dict:
    child = run_worker(__file__, [str(path)], timeout)
    if child.killed:
        return {"verdict": "timeout"}
    return child.result or {"verdict": "error", "reason": child.tail()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="meshes of 2 and 4 devices only")
    ap.add_argument(
        "--timeout", type=float, default=600.0, help="wall-clock seconds per verifying child"
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker)
        return

    from tv_ir.xla.partitioner import ensure_host_devices

    ensure_host_devices()
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from tv_ir.pipeline import prepare
    from tv_ir.xla.partitioner import partition

    meshes = MESHES[:2] if a.quick else MESHES
    header = (
        f"{'program':>10} {'devices':>7} {'mesh':>6} {'ops':>5} {'verdict':>11} "
        f"{'stages':>6} {'verify s':>9} {'xla s':>6}"
    )
    print(header, flush=True)
    with tempfile.TemporaryDirectory(prefix="tv-bench-spmd-") as tmp:
        for name, f, shardings, shapes in programs():
            for shape in meshes:
                n = shape[0] * shape[1]
                mesh = Mesh(np.array(jax.devices()[:n]).reshape(shape), ("data", "model"))

                def s(*spec, mesh=mesh):
                    return NamedSharding(mesh, P(*spec))

                ins, outs = shardings(s)
                args = [np.ones(sh, np.float32) for sh in shapes]
                lowered = jax.jit(f, in_shardings=ins, out_shardings=outs).lower(*args)
                text = lowered.as_text(debug_info=True)
                path = Path(tmp) / f"{name.replace(' ', '_')}_{n}.mlir"
                path.write_text(text)
                ops = count_ops(prepare(partition(text).per_device_hlo, "per-device"))
                res = run_child(path, a.timeout)
                t0 = time.perf_counter()
                lowered.compile()
                xla = time.perf_counter() - t0
                secs = f"{res['seconds']:.2f}" if "seconds" in res else "-"
                mesh_s = f"{shape[0]}x{shape[1]}"
                print(
                    f"{name:>10} {n:>7} {mesh_s:>6} {ops:>5} {res['verdict']:>11} "
                    f"{res.get('stages', '-'):>6} {secs:>9} {xla:>6.2f}",
                    flush=True,
                )
                if res.get("reason"):
                    print(f"           {res['reason']}", flush=True)
    print("\nops: ops of the per-device program (after tv's normalisation);")
    print("verify s: partition_and_check in a fresh child (XLA partitioning + proof);")
    print("xla s: XLA CPU compile time of the same annotated module.")


if __name__ == "__main__":
    main()
