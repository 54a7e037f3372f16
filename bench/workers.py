"""`--workers`: one check with 1 worker, 2 workers and the automatic choice, on the JAX
examples (examples/jax/) and on the scanned programs of bench/scan_depth.py (whose loops are
proved by induction: the rest and each loop body are independent obligations).

    python bench/workers.py [--only NAME,...] [--bugs] [--runs N] [--time-limit S] [--memory MB]

`--bugs` adds refutations: planted bugs of three examples, and the scanned MLP at 126
layers with layer 17 wrong (its loop body refuted by induction, then the loops cut to 18
iterations and checked unrolled).

Each (row, workers) runs in a fresh child process; a row's time is tv's own
(`stats.seconds["total"]`: import, simulation, proof, confirmation; not lowering). The
attention-TP variant of `llama_adamw_fsdp_tp` is left out (unknown at any limit tried,
docs/benchmarks.md). "same
report" compares the reports' JSON with the timings taken out. The 1-minute load average
is read before each row: the machine's cores are shared, so a speed-up is only as good as
the cores that were free.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from child_process import run_worker  # noqa: E402

EXAMPLES = [
    "llama_dp",
    "llama_fsdp",
    "llama_tp_sp",
    "llama_adamw_fsdp_tp",
    "llama_moe_ep",
    "llama_tokens",
    "llama_tokens --dp",
    "llama_pipeline",
    "llama_scan (1 layer)",
]
SCANNED = ["mlp-shard-map", "mlp-jit-grad", "transformer-grad"]  # at 2 layers
# four outputs, each a solver query of a few seconds (relu(x) * f(x) against
# where(x > 0, x * f(x), 0) summed over 8 elements, f = tanh, exp, sin, cos; real sizes):
# final obligations that are all of the work
Z3_OUTPUTS = "z3-outputs"
# refutations (`--bugs`): an example's planted bug (`verify_example(bug=True)`), and the
# scanned MLP with layer 17 of 126 wrong (its body obligation refuted by induction)
BUGS = ["llama_dp --bug", "llama_tp_sp --bug", "llama_pipeline --bug", "mlp-jit-layer17"]
POOL_KEYS = ("final obligations in workers", "induction obligations in workers")
SETTINGS = {"1": 1, "2": 2, "auto": None}


def worker(name: str, setting: str, time_limit: float, memory: float) -> None:
    """Child: one check; print one JSON line."""
    workers = SETTINGS[setting]
    options = {"time_limit": time_limit, "memory_limit": memory, "workers": workers}
    t0 = time.perf_counter()
    if name == Z3_OUTPUTS:
        import tv_ir

        texts = _z3_outputs()
        t0 = time.perf_counter()
        report = tv_ir.check(*texts, reduce_shapes=False, **options)
    elif name in SCANNED or name == "mlp-jit-layer17":
        import scan_depth

        import tv_ir

        spec, impl, args = scan_depth.programs(name, 126 if name == "mlp-jit-layer17" else 2)
        texts = [f.lower(*args).as_text(debug_info=True) for f in (spec, impl)]
        t0 = time.perf_counter()
        report = tv_ir.check(*texts, **options)
    else:
        sys.path.insert(0, str(ROOT / "examples" / "jax"))
        import importlib

        from examples import ROWS  # bench/examples.py (bench/ is first on the path)

        bug = name.endswith(" --bug")
        module, kwargs = ROWS[name.removesuffix(" --bug")]
        kwargs = {**kwargs, "bug": True} if bug else kwargs
        report = importlib.import_module(module).verify_example(**kwargs, **options)
    wall = time.perf_counter() - t0
    d = json.loads(report.to_json())
    seconds = d["stats"].pop("seconds")
    print(
        json.dumps(
            {
                "verdict": report.verdict,
                "seconds": seconds.get("total", wall),
                "pool": sum(seconds.get(k, 0.0) for k in POOL_KEYS),
                "pooled": any(k in seconds for k in POOL_KEYS),
                "digest": hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest(),
                "reason": report.reason,
                "line": report.location.impl.line
                if report.location and report.location.impl
                else None,
            }
        )
    )


def _z3_outputs() -> list[str]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    fs = [jnp.tanh, jnp.exp, jnp.sin, jnp.cos]
    xs = [np.ones((8,), np.float32) for _ in fs]

    def spec(*xs):
        return tuple(jnp.sum(jnp.maximum(x, 0.0) * f(x)) for f, x in zip(fs, xs, strict=True))

    def impl(*xs):
        return tuple(jnp.sum(jnp.where(x > 0, x * f(x), 0.0)) for f, x in zip(fs, xs, strict=True))

    return [jax.jit(g).lower(*xs).as_text(debug_info=True) for g in (spec, impl)]


def run_row(name: str, setting: str, time_limit: float, memory: float) -> dict:
    env = dict(os.environ)
    env.pop("TV_WORKERS", None)
    flags = env.get("XLA_FLAGS", "")
    if (
        name in SCANNED + ["mlp-jit-layer17"]
        and "xla_force_host_platform_device_count" not in flags
    ):
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=4".strip()
    args = [name, setting, str(time_limit), str(memory)]
    child = run_worker(__file__, args, time_limit + 120, env)
    if child.result is None:
        return {"verdict": child.killed or f"error: {child.tail()[:60]}"}
    return {**child.result, "peak_mb": child.peak_mb}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated row names")
    ap.add_argument("--runs", type=int, default=1, help="runs per setting (the fastest is kept)")
    ap.add_argument("--time-limit", type=float, default=300.0)
    ap.add_argument("--memory", type=float, default=3500.0, help="tv's memory limit (MB)")
    ap.add_argument("--bugs", action="store_true", help="add the refutation rows")
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        name, setting, limit, memory = a.worker
        worker(name, setting, float(limit), float(memory))
        return
    rows = EXAMPLES + SCANNED + [Z3_OUTPUTS] + (BUGS if a.bugs else [])
    names = [n for n in rows if not a.only or n in a.only.split(",")]
    print(
        "| check | verdict | 1 worker s | 2 workers s | speed-up | pool s (2) | auto s | "
        "auto pooled | same report (1 / 2 / auto) | load (1 min) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        load = os.getloadavg()[0]
        got = {}
        for setting in SETTINGS:
            runs = [run_row(name, setting, a.time_limit, a.memory) for _ in range(a.runs)]
            timed = [r for r in runs if "seconds" in r]
            got[setting] = min(timed, key=lambda r: r["seconds"]) if timed else runs[0]
        one, two, auto = got["1"], got["2"], got["auto"]
        digests = {r.get("digest") for r in got.values()}
        same = "yes" if len(digests) == 1 and None not in digests else "NO"
        speed = one["seconds"] / two["seconds"] if "seconds" in one and "seconds" in two else None
        verdict = one["verdict"] + (f" at line {one['line']}" if one.get("line") else "")
        print(
            f"| `{name}` | {verdict} | {_f(one.get('seconds'))} | {_f(two.get('seconds'))} "
            f"| {_f(speed, '.2f')}x | {_f(two.get('pool'))} | {_f(auto.get('seconds'))} | "
            f"{'yes' if auto.get('pooled') else 'no'} | {same} | {load:.1f} |",
            flush=True,
        )


def _f(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


if __name__ == "__main__":
    main()
