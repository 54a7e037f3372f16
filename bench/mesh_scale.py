"""Verification cost against the device count (issue #12): the Llama 3 step on 8 to 8,192.

    python bench/mesh_scale.py                         # meshes of 8, 64, 512, 8192
    python bench/mesh_scale.py --meshes 2x2x2,8x2x4 --no-before --no-xla
    python bench/mesh_scale.py --no-before --repeat 3     # each row the fastest of 3 passes
    python bench/mesh_scale.py --step fsdp --no-before    # data x fsdp x stage x model

bench/llama3.py's `parallel_step` (one `jax.shard_map` over ("data", "stage", "model"):
Megatron TP, a GPipe pipeline with `ppermute`, data parallelism; forward + backward + SGD)
against its single-device `train_step`, on meshes DP x PP x TP. The model is TrainVerify's
configuration (hidden 128, seq 128, 32 heads, vocab 51200, 2 layers, 2 micro-batches of 8
sequences per data-parallel shard: the global batch grows with DP). Programs are lowered
from `jax.ShapeDtypeStruct`s on a `jax.sharding.AbstractMesh` (no devices: jaxlib 0.10.2
makes 8,192 host CPU devices, in 33 s and 1 GB, but its CPU backend compiles for at most
2,048: "Multiprocess computations aren't implemented on the CPU backend" from 4,096 on);
JAX writes `mhlo.num_partitions = 1` for an abstract
mesh, and tv reads the shard_map's mesh as the program's devices.

`--step fsdp`: bench/llama405b.py's step instead (one `jax.shard_map` over ("data", "fsdp",
"stage", "model"): weights stored split along their input dimension over "fsdp" and
all-gathered in the body, Megatron TP with sequence parallelism, the GPipe pipeline,
grouped-query attention, AdamW) at `FSDP_MODEL`'s sizes, on meshes DPxFSDPxPPxTP
(`FSDP_MESHES`: 16 to 8,192 devices).

Each row runs `tv_ir.check` in a fresh child (bench/child_process.py), with mesh reduction
("tv s") and without it ("before": every device simulated, `reduce_mesh=False`), both with
shape reduction; killed past `--time-limit` + 60 s. "xla s": XLA's compile time of the same
shard_map step for the real mesh (`jax.jit(step).lower(...).compile()` on that many host CPU
devices; up to 512).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
for p in (BENCH.parent, BENCH):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

MESHES = ["2x2x2", "8x2x4", "32x2x8", "512x2x8"]
FSDP_MESHES = ["2x2x2x2", "2x4x2x4", "8x4x2x8", "128x4x2x8"]
# hidden 128 in 32 heads of 4 sharing 16 K/V heads, FFN 192, sequence 16, one layer per stage
# (no size equal to a loss share 1 / (micro x dp x fsdp x tp) of these meshes):
# each "model" rank of 8 holds 2 K/V heads, so its heads can halve with "fsdp"
FSDP_MODEL = dict(seq=24, hidden=128, heads=32, kv_heads=16, ffn=192, vocab=32, micro=2)
XLA_MAX_DEVICES = 512


def config(mesh: str, step: str = "llama3"):
    """The step's module (bench/llama3.py or bench/llama405b.py) and its config on `mesh`."""
    sizes = [int(k) for k in mesh.split("x")]
    if step == "fsdp":
        import llama405b as M

        dp, fsdp, pp, tp = sizes
        cfg = M.Config(**FSDP_MODEL, layers=pp, dp=dp, fsdp=fsdp, pp=pp, tp=tp)
        return M, M.with_(cfg, batch=dp * fsdp * cfg.micro)
    import llama3 as M

    dp, pp, tp = sizes
    return M, M.with_(M.TRAINVERIFY, dp=dp, pp=pp, tp=tp, batch=16 * dp, layers=pp)


def lowered(mesh: str, bug: str | None, step: str = "llama3"):
    """(spec text, impl text, lowering seconds) on an abstract mesh."""
    import jax
    from jax.sharding import AbstractMesh

    M, cfg = config(mesh, step)
    sizes = tuple(int(k) for k in mesh.split("x"))
    M.mesh = lambda c: AbstractMesh(sizes, M.AXES)
    args = M.example_args(cfg)
    t0 = time.perf_counter()
    spec = jax.jit(M.train_step(cfg)).lower(*args).as_text(debug_info=True)
    impl = jax.jit(M.parallel_step(cfg, bug=bug)).lower(*args).as_text(debug_info=True)
    return spec, impl, time.perf_counter() - t0


def worker_verify(
    mesh: str, reduce_mesh: bool, time_limit: float, memory: float, bug, step: str
) -> dict:
    from tv_ir.pipeline import check

    spec, impl, lower_s = lowered(mesh, bug, step)
    t0 = time.perf_counter()
    report = check(spec, impl, time_limit=time_limit, memory_limit=memory, reduce_mesh=reduce_mesh)
    out = {
        "verdict": report.verdict,
        "seconds": time.perf_counter() - t0,
        "lower_s": lower_s,
        "stages": report.stats.stages,
        "reason": report.reason,
        "phases": {k: round(v, 2) for k, v in report.stats.seconds.items()},
        "notes": report.notes,
        "elements": (report.reduction or {}).get("summary", "").splitlines()[:1],
    }
    if report.mesh_reduction:
        out["devices"] = report.mesh_reduction["devices"]
        out["axes"] = report.mesh_reduction["axes"]
    ce = report.counterexample
    if ce is not None:
        out["device"] = [ce.device, ce.mesh_coords]
    site = report.location.impl if report.location is not None else None
    if site is not None and site.file:
        out["at"] = f"{Path(site.file).name}:{site.line} ({site.op})"
    return out


def worker_xla(mesh: str, step: str) -> dict:
    import jax

    M, cfg = config(mesh, step)
    args = M.example_args(cfg)
    t0 = time.perf_counter()
    jax.jit(M.parallel_step(cfg)).lower(*args).compile()
    return {"xla_s": time.perf_counter() - t0}


def main() -> None:
    from child_process import run_worker

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--step",
        choices=["llama3", "fsdp"],
        default="llama3",
        help="llama3: bench/llama3.py on DPxPPxTP; fsdp: bench/llama405b.py on DPxFSDPxPPxTP",
    )
    ap.add_argument("--meshes", help="comma-separated (default MESHES, or FSDP_MESHES)")
    ap.add_argument("--no-before", action="store_true", help="skip the rows without reduction")
    ap.add_argument(
        "--before-max", type=int, default=512, help="largest mesh checked without reduction"
    )
    ap.add_argument("--no-xla", action="store_true", help="skip XLA's compile times")
    ap.add_argument(
        "--bug", default=None, help="plant bench/llama3.py's bug (psum, micro, one_device)"
    )
    ap.add_argument("--time-limit", type=float, default=600.0)
    ap.add_argument("--memory", type=float, default=3500.0, help="tv's memory_limit (MB)")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="passes over all meshes (fresh children); each row shows its fastest run: this "
        "machine's speed drifts 20-30%% between minutes",
    )
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        kind, mesh, step = a.worker[0], a.worker[1], a.worker[-1]
        if kind == "xla":
            res = worker_xla(mesh, step)
        else:
            bug = None if a.worker[4] == "-" else a.worker[4]
            res = worker_verify(
                mesh, kind == "reduced", float(a.worker[2]), float(a.worker[3]), bug, step
            )
        print(json.dumps(res), flush=True)
        return

    header = (
        f"{'mesh':>9} {'devices':>7} {'reduced to':>10} {'verdict':>15} {'tv s':>7} "
        f"{'peak MB':>7} {'before s':>9} {'before':>15} {'lower s':>7} {'xla s':>7}"
    )
    print(f"tv time limit {a.time_limit:.0f} s, memory limit {a.memory:.0f} MB, bug {a.bug}")
    print(header)
    print("-" * len(header), flush=True)
    script = str(Path(__file__).resolve())
    bug = a.bug or "-"
    meshes = (a.meshes or ",".join(FSDP_MESHES if a.step == "fsdp" else MESHES)).split(",")
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    runs: dict[str, list] = {mesh: [] for mesh in meshes}
    for k in range(max(1, a.repeat) - 1):  # the earlier passes: the fastest run is shown
        for mesh in meshes:
            args = [mesh, str(a.time_limit), str(a.memory), bug, a.step]
            runs[mesh].append(run_worker(script, ["reduced", *args], a.time_limit + 60, env))
            print(f"  pass {k + 1}: {mesh} {_seconds(runs[mesh][-1]):.1f} s", file=sys.stderr)
    for mesh in meshes:
        n = 1
        for k in mesh.split("x"):
            n *= int(k)
        args = [mesh, str(a.time_limit), str(a.memory), bug, a.step]
        runs[mesh].append(run_worker(script, ["reduced", *args], a.time_limit + 60, env))
        child = min(runs[mesh], key=_seconds)
        red, peak, tail = child.result, child.peak_mb, child.killed or child.tail()
        before, before_s = {"verdict": "-"}, None
        if not a.no_before and n <= a.before_max:
            whole = run_worker(script, ["whole", *args], a.time_limit + 60, env)
            before = whole.result or {"verdict": f"killed {whole.killed or whole.tail()}"}
            before_s = before.get("seconds")
        xla = None
        if not a.no_xla and n <= XLA_MAX_DEVICES:
            xenv = dict(os.environ)
            xenv["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n}"
            xla = (run_worker(script, ["xla", mesh, a.step], 1800, xenv).result or {}).get("xla_s")
        red = red or {"verdict": f"killed {tail}"}
        devices = red.get("devices") or [n, n]
        row = (
            f"{mesh:>9} {n:>7} {devices[1]:>10} {red['verdict']:>15} "
            f"{red.get('seconds', float('nan')):>7.1f} {peak:>7.0f} "
            f"{before_s if before_s is not None else float('nan'):>9.1f} "
            f"{before['verdict']:>15} {red.get('lower_s', float('nan')):>7.2f} "
            f"{xla if xla is not None else float('nan'):>7.1f}"
        )
        print(row, flush=True)
        if len(runs[mesh]) > 1:
            red = {**red, "runs_s": [round(_seconds(c), 2) for c in runs[mesh]]}
        print("  " + json.dumps({"reduced": red, "before": before}), flush=True)


def _seconds(child) -> float:
    """A verifying child's tv seconds (infinite when it gave no verdict)."""
    res = child.result or {}
    ok = res.get("verdict") in ("equivalent", "not_equivalent")
    return res.get("seconds", float("inf")) if ok else float("inf")


if __name__ == "__main__":
    main()
