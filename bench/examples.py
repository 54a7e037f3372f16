"""The JAX examples (examples/jax/): seconds to verify each training step beside the seconds
JAX takes to lower and compile the same step.

    python bench/examples.py [--timeout SECONDS] [--memory GB] [--only NAME,...]

Each row runs in a fresh subprocess (limited to `--memory` GB of address space and
`--timeout` wall-clock seconds): `verify_example()` (lowering, the proof, the report), then
`jax.jit(step).lower(*args).compile()` for the implementation step on the same devices.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "jax"

# row name -> (module, verify_example keyword arguments)
ROWS = {
    "llama_dp": ("llama_dp", {}),
    "llama_fsdp": ("llama_fsdp", {}),
    "llama_tp_sp": ("llama_tp_sp", {}),
    "llama_adamw_fsdp_tp": ("llama_adamw_fsdp_tp", {}),
    "llama_adamw_fsdp_tp (attention TP)": ("llama_adamw_fsdp_tp", {"attention_tp": True}),
    "llama_moe_ep": ("llama_moe_ep", {}),
    "llama_tokens": ("llama_tokens", {}),
    "llama_tokens --dp": ("llama_tokens", {"dp": True}),
    "llama_pipeline": ("llama_pipeline", {}),
    "llama_pipeline_jit": ("llama_pipeline_jit", {}),
    "llama_scan (1 layer)": ("llama_scan", {"layers": 1}),
}


def step_and_args(module: str, kwargs: dict):
    """The implementation step as a jax.jit (with its shardings) and its example arguments."""
    import importlib

    import jax

    ex = importlib.import_module(module)
    llama = importlib.import_module("llama")
    if module == "llama_adamw_fsdp_tp":
        from tv_ir.frontends.jax.mesh import named, resolve_mesh

        mesh = resolve_mesh(ex.MESH)
        ins, outs = ex.shardings(kwargs.get("attention_tp", False))
        step = jax.jit(
            ex.train_step, in_shardings=named(ins, mesh), out_shardings=named(outs, mesh)
        )
        return step, ex.example_args()
    if module == "llama_pipeline_jit":
        from tv_ir.frontends.jax.mesh import named, resolve_mesh

        mesh = resolve_mesh(ex.MESH)
        ins, outs = ex.shardings()
        step = jax.jit(
            ex.pipeline_step(), in_shardings=named(ins, mesh), out_shardings=named(outs, mesh)
        )
        return step, ex.example_args()
    if module == "llama_scan":
        cfg = ex.config(kwargs["layers"])
        step = ex.step_fn(ex.scan_loss, cfg)
        return jax.jit(step), (llama.param_shapes(cfg), llama.batch_shapes(cfg))
    builders = {
        "llama_dp": lambda: (ex.dp_step(), (llama.param_shapes(), llama.batch_shapes())),
        "llama_fsdp": lambda: (ex.fsdp_step(), (llama.param_shapes(), llama.batch_shapes())),
        "llama_tp_sp": lambda: (ex.tp_sp_step(), (llama.param_shapes(), llama.batch_shapes())),
        "llama_moe_ep": lambda: (ex.ep_step(), (ex.param_shapes(), ex.batch_shapes())),
        "llama_tokens": lambda: (
            ex.dp_remat_step() if kwargs.get("dp") else ex.remat_step(),
            (ex.param_shapes(), ex.batch_shapes()),
        ),
        "llama_pipeline": lambda: (ex.pipeline_step(), ex.example_args()),
    }
    step, args = builders[module]()
    return jax.jit(step), args


def worker(name: str) -> None:
    """Child process: verify one example, then compile its step; print one JSON line."""
    sys.path.insert(0, str(EXAMPLES))
    import importlib

    import jax
    from tv_ir.frontends.jax import verify  # noqa: F401  (asks XLA for 8 CPU devices)
    from tv_ir.frontends.jax.mesh import resolve_mesh

    module, kwargs = ROWS[name]
    ex = importlib.import_module(module)
    out: dict = {}
    t0 = time.perf_counter()
    try:
        report = ex.verify_example(**kwargs)
        out.update(verdict=report.verdict, stages=report.stats.stages)
        if report.reason:
            out["reason"] = report.reason
    except MemoryError:
        out.update(verdict="out of memory", stages=None)
    except Exception as e:  # an interpreter error wrapping a MemoryError, say
        kind = "out of memory" if "MemoryError" in str(e) else f"error: {type(e).__name__}"
        out.update(verdict=kind, stages=None)
    out["verify_s"] = time.perf_counter() - t0
    step, args = step_and_args(module, kwargs)
    t0 = time.perf_counter()
    mesh = getattr(ex, "MESH", None)  # sharding constraints inside the step name its axes
    with jax.set_mesh(resolve_mesh(mesh)) if mesh else contextlib.nullcontext():
        step.lower(*args).compile()
    out["compile_s"] = time.perf_counter() - t0
    print(json.dumps(out), flush=True)


def run_row(name: str, timeout: float, memory_gb: float) -> dict:
    limit = int(memory_gb * 2**30)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    try:
        p = subprocess.run(
            [sys.executable, __file__, "--worker", name],
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=cap,
        )
    except subprocess.TimeoutExpired:
        return {"verdict": f"timeout ({timeout:.0f} s)"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {"verdict": f"crashed: {tail[:60]}"}
    return json.loads(lines[-1])


def fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=300.0, help="wall-clock seconds per row")
    ap.add_argument("--memory", type=float, default=6.0, help="address-space GB per row")
    ap.add_argument("--only", default="", help="comma-separated row names")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker)
        return
    names = [n for n in ROWS if not a.only or n in a.only.split(",")]
    print("| example | verdict | stages | verify s | jax lower+compile s |")
    print("|---|---|---|---|---|")
    for name in names:
        r = run_row(name, a.timeout, a.memory)
        print(
            f"| `{name}` | {r['verdict']} | {fmt(r.get('stages'), 'd')} | "
            f"{fmt(r.get('verify_s'))} | {fmt(r.get('compile_s'), '.2f')} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
