"""Verification cost against tensor sizes (issue #10): a sharded MLP and TrainVerify's Llama 3
configuration (DP x PP x TP), beside XLA's compile time of the same programs.

    python bench/scale.py                  # MLP sizes, Llama 3 toy / 2 layers / 32 layers, bugs
                                           #   (layers as a scan, then as a Python for)
    python bench/scale.py --quick          # toy sizes only
    python bench/scale.py --sweep          # Llama 3 (32 layers, scanned) at hidden 1024..16384,
                                           #   seq 128..8192, heads 8..128, batch 8..1024
    python bench/scale.py --only llama --time-limit 300 --memory 6000
    python bench/scale.py --numerics       # the toy Llama steps run on random inputs (no tv)

Every row is verified in a fresh child process: `tv_ir.frontends.jax.verify(fn, *args,
spec=spec, time_limit=..., memory_limit=...)` on `jax.ShapeDtypeStruct` arguments (nothing is
materialised), its wall time (lowering included, and the lowering alone), its peak memory
(`ru_maxrss` from `os.wait4`). The child is killed after `--timeout` seconds or when its
resident memory passes `--memory` MB (polled by this process: tv's own `memory_limit` is
polled between steps, and some steps run long). Another child lowers and compiles the same
two programs with XLA (`jax.jit(f).lower(*args).compile()`, spec + implementation).
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
for p in (ROOT, BENCH):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from child_process import run_worker  # noqa: E402

TRAINVERIFY_32_LAYERS_S = 61.5  # issue #10: TrainVerify, 32-layer configuration, this machine kind

# the MLP of issue #10: batch / d / ffn
MLP_SMALL = [(8, 16, 32), (32, 64, 128), (64, 128, 256)]
MLP_LARGE = [(8, 1024, 2048), (128, 4096, 8192), (1024, 16384, 32768)]
MLP_MESH = (2, 4)  # ("data", "model")


# ---------------------------------------------------------------------------- rows


def llama_row(cfg, bug=None, style="megatron", note="") -> dict:
    from dataclasses import asdict

    return {"kind": "llama", "cfg": asdict(cfg), "bug": bug, "style": style, "note": note}


def mlp_row(batch: int, d: int, ffn: int) -> dict:
    return {"kind": "mlp", "cfg": {"batch": batch, "d": d, "ffn": ffn}, "bug": None, "note": ""}


def rows_for(a) -> list[dict]:
    import llama3 as M

    rows: list[dict] = []
    if a.sweep:
        base = M.with_(M.TRAINVERIFY, layers=a.layers, stack=a.stacks[0])
        groups = [
            ("hidden", [1024, 4096, 16384], {}),
            ("seq", [128, 512, 2048, 8192], {}),
            ("heads", [8, 16, 32, 64, 128], {"hidden": 4096}),  # head_dim >= 2 for RoPE
            ("batch", [8, 32, 128, 1024], {}),
        ]
        for field, values, fixed in groups:
            for v in values:
                cfg = M.with_(base, **fixed, **{field: v})
                rows.append(llama_row(cfg, style=a.style, note=f"{field} sweep"))
        return rows
    if a.only in ("", "mlp"):
        for size in MLP_SMALL[:1] if a.quick else MLP_SMALL + MLP_LARGE:
            rows.append(mlp_row(*size))
    if a.only in ("", "llama"):
        toy = M.TOY
        # the target configuration at toy sizes, then its sub-meshes (which today's tv proves)
        rows += [
            llama_row(toy, style=a.style),
            llama_row(toy, "psum", a.style),
            llama_row(toy, "micro", a.style),
            llama_row(M.with_(toy, pp=1), style=a.style),
            llama_row(M.with_(toy, pp=1), "psum", a.style),
            llama_row(M.with_(toy, tp=1), style=a.style),
            llama_row(M.with_(toy, tp=1), "micro", a.style),
        ]
        if not a.quick:
            for stack in a.stacks:
                for layers in (2, 32):
                    cfg = M.with_(M.TRAINVERIFY, layers=layers, stack=stack)
                    rows.append(llama_row(cfg, style=a.style, note="TrainVerify"))
                    rows.append(llama_row(cfg, "psum", a.style, note="TrainVerify"))
    return rows


def build(row: dict):
    """(fn, spec, args) for a row; fn and spec are plain functions (verify jits them)."""
    import jax
    import jax.numpy as jnp

    if row["kind"] == "mlp":
        import numpy as np
        from jax.sharding import Mesh
        from jax.sharding import PartitionSpec as P

        c = row["cfg"]

        def mlp(x, w1, w2):
            return jnp.tanh(x @ w1) @ w2

        n = MLP_MESH[0] * MLP_MESH[1]
        mesh = Mesh(np.array(jax.devices()[:n]).reshape(MLP_MESH), ("data", "model"))

        def body(x, w1, w2):
            return jax.lax.psum(jnp.tanh(x @ w1) @ w2, "model")

        fn = jax.shard_map(
            body,
            mesh=mesh,
            in_specs=(P("data", None), P(None, "model"), P("model", None)),
            out_specs=P("data", None),
        )
        sds = jax.ShapeDtypeStruct
        f32 = jnp.float32
        args = (sds((c["batch"], c["d"]), f32), sds((c["d"], c["ffn"]), f32))
        args += (sds((c["ffn"], c["d"]), f32),)
        return fn, mlp, args
    import llama3 as M

    cfg = M.Config(**row["cfg"]).check()
    return M.parallel_step(cfg, row["bug"], row["style"]), M.train_step(cfg), M.example_args(cfg)


def label(row: dict) -> str:
    c = row["cfg"]
    if row["kind"] == "mlp":
        return f"mlp b{c['batch']} d{c['d']} ffn{c['ffn']} (2x4)"
    import llama3 as M

    return "llama " + M.Config(**c).label()


# ---------------------------------------------------------------------------- children


def worker_verify(row: dict, time_limit: float, memory: float) -> dict:
    """Child: verify one row; the lowering (spec and implementation) timed apart."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # where it was, when killed
    verify_mod = importlib.import_module("tv_ir.frontends.jax.verify")  # 8 CPU devices

    lowering = [0.0]
    real_lower = verify_mod.lower

    def timed_lower(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real_lower(*args, **kwargs)
        finally:
            lowering[0] += time.perf_counter() - t0

    verify_mod.lower = timed_lower
    fn, spec, args = build(row)
    t0 = time.perf_counter()
    out: dict = {}
    try:
        report = verify_mod.verify(fn, *args, spec=spec, time_limit=time_limit, memory_limit=memory)
        out.update(verdict=report.verdict, stages=report.stats.stages)
        out.update(cache_hits=report.stats.cache_hits, phases=dict(report.stats.seconds))
        out["repeated"] = report.stats.repeated_stages
        out["reduced"] = (report.reduction or {}).get("reduced_elements")
        if report.reason:
            out["reason"] = report.reason
        loops = (report.reduction or {}).get("layer_loops") or []
        shrunk = sorted({(d["real"], d["reduced"]) for d in loops if d["reduced"] < d["real"]})
        if shrunk:  # layer loops proved at fewer layers (docs/equivalence.md, "Layer stacks")
            out["layers"] = ", ".join(f"{n}->{k}" for n, k in shrunk)
        if report.location is not None and report.location.impl is not None:
            out["where"] = str(report.location.impl)
    except Exception as e:  # bad input (a tensor past 2^31 elements), internal errors
        out.update(verdict="error", reason=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
    out["seconds"] = time.perf_counter() - t0
    out["lower_s"] = lowering[0]
    return out


def worker_xla(row: dict) -> dict:
    """Child: XLA's lowering and compile time of the same spec and implementation."""
    importlib.import_module("tv_ir.frontends.jax")  # 8 CPU devices, as for verify
    import jax

    fn, spec, args = build(row)
    out = {"xla_lower_s": 0.0, "xla_s": 0.0}
    for f in (spec, fn):
        t0 = time.perf_counter()
        lowered = jax.jit(f).lower(*args)
        t1 = time.perf_counter()
        lowered.compile()
        out["xla_lower_s"] += t1 - t0
        out["xla_s"] += time.perf_counter() - t1
    return out


def numerics() -> int:
    """Run the toy Llama spec and every style / bug of the parallel step on random inputs;
    print the largest difference (a correct step: float32 noise; a bug: visibly off)."""
    importlib.import_module("tv_ir.frontends.jax")  # 8 CPU devices
    import jax
    import jax.numpy as jnp
    import llama3 as M
    import numpy as np

    cfg = M.TOY
    rng = np.random.default_rng(0)

    def rand(s):
        return jnp.asarray(rng.normal(size=s.shape).astype(np.float32) * 0.5)

    params, batch = jax.tree_util.tree_map(rand, M.example_args(cfg))
    ref = jax.tree_util.tree_leaves(jax.jit(M.train_step(cfg))(params, batch))
    bad = 0
    for style in M.STYLES:
        for bug in (None, *M.BUGS):
            try:
                out = jax.tree_util.tree_leaves(
                    jax.jit(M.parallel_step(cfg, bug, style))(params, batch)
                )
            except Exception as e:  # check_vma rejects a missing psum at trace time
                print(f"{style:>8} {bug or '-':>5}  rejected by JAX: {str(e).splitlines()[0][:80]}")
                continue
            diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(ref, out, strict=True))
            ok = diff < 1e-5 if bug is None else diff > 1e-3
            bad += not ok
            mark = "" if ok else "  WRONG"
            print(f"{style:>8} {bug or '-':>5}  max |spec - impl| = {diff:.2e}{mark}")
    return bad


def killed_in(stderr: str) -> str:
    """The innermost tv frame of the stacks a killed child dumped (faulthandler)."""
    for m in re.finditer(r'File "([^"]+)", line (\d+) in (\S+)', stderr):
        path, line, fn = m.groups()
        rel = os.path.relpath(path, ROOT)
        if rel.split(os.sep)[0] in ("tv_ir", "passes", "frontends") and fn != "run_deep":
            return f"{rel}:{line} {fn}"
    return ""


def run_child(args: list[str], timeout: float, memory: float | None) -> tuple[dict, float]:
    """Run this script as a worker; (its JSON or why it has none, peak RSS in MB)."""
    child = run_worker(__file__, args, timeout, rss_limit_mb=memory, dump_stacks=True)
    if child.result is not None and not child.killed:
        return child.result, child.peak_mb
    if child.killed:
        res = {"verdict": child.killed}
        where = killed_in(child.stderr)
        if where:
            res["reason"] = f"killed in {where}"
        return res, child.peak_mb
    reason = child.tail()[:300] or "?"
    return {"verdict": f"crashed ({child.returncode})", "reason": reason}, child.peak_mb


# ---------------------------------------------------------------------------- table


def fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def expected(row: dict) -> str:
    return "not_equivalent" if row["bug"] else "equivalent"


def spread(results: list[dict], sweep: bool) -> None:
    """For the sweep: how far the slowest proved row is from the fastest (issue #10: within
    20%), beside the same for XLA's compile."""
    ok = [r for r in results if r["verdict"] == expected(r["row"]) and r.get("seconds")]
    if not sweep or len(ok) < 2:
        return
    tv = [r["seconds"] for r in ok]
    line = f"\nsweep: tv {min(tv):.1f}-{max(tv):.1f} s (slowest {max(tv) / min(tv) - 1:+.0%})"
    xla = [r["xla_s"] for r in ok if r.get("xla_s")]
    if xla:
        line += f"; XLA compile {min(xla):.2f}-{max(xla):.2f} s ({max(xla) / min(xla) - 1:+.0%})"
    print(line + f"; {len(ok)} of {len(results)} rows proved")


def show(row: dict, res: dict, xlas: list[dict]) -> dict:
    """Print one row of the table (the fastest of its runs, XLA's fastest compile beside it)."""
    if xlas:
        xla = min(xlas, key=lambda x: x.get("xla_s", 1e9))
        res.update({k: v for k, v in xla.items() if k.startswith("xla")})
    tvs = ""
    if row["note"] == "TrainVerify" and row["cfg"]["layers"] == 32 and not row["bug"]:
        tvs = f"{TRAINVERIFY_32_LAYERS_S:.1f}"
    mark = "" if res["verdict"] == expected(row) else " *"
    print(
        f"{label(row):<46} {row['bug'] or '-':>5} {res['verdict'] + mark:>18} "
        f"{fmt(res.get('stages'), 'd'):>6} {fmt(res.get('reduced'), ',d'):>9} "
        f"{fmt(res.get('seconds')):>7} {fmt(res.get('lower_s'), '.2f'):>7} "
        f"{res['peak_mb']:>7.0f} {fmt(res.get('xla_s'), '.2f'):>6} {tvs:>13}",
        flush=True,
    )
    for key in ("reason", "where"):
        if res.get(key):
            print(f"    {key}: {res[key][:400]}", flush=True)
    return {"row": row, "label": label(row), **res}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="toy sizes only")
    ap.add_argument("--sweep", action="store_true", help="Llama 3 size sweep (issue #10)")
    ap.add_argument("--only", choices=("", "mlp", "llama"), default="", help="one program")
    ap.add_argument("--layers", type=int, default=32, help="layers of the --sweep rows")
    ap.add_argument(
        "--style",
        default="megatron",
        help="how the Llama step keeps TP gradients right "
        "(bench/llama3.py STYLES: megatron, vma, shares)",
    )
    ap.add_argument(
        "--stack",
        default="scan,for",
        help="how the TrainVerify rows write their layers (bench/llama3.py STACKS), comma "
        "separated: scan (jax.lax.scan over the stacked weights, as MaxText does) and for "
        "(a Python for over w[i], as TrainVerify does); the sweep uses the first",
    )
    ap.add_argument(
        "--time-limit", type=float, default=120.0, help="tv's time_limit per row (seconds)"
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=0.0,
        help="kill a child after this many seconds (default: time limit + 120)",
    )
    ap.add_argument(
        "--memory",
        type=float,
        default=4000.0,
        help="tv's memory_limit, and the resident MB past which a child is killed",
    )
    ap.add_argument("--no-xla", action="store_true", help="skip XLA's compile times")
    ap.add_argument(
        "--numerics", action="store_true", help="only run the toy Llama steps on random inputs"
    )
    ap.add_argument("--json", help="also write the rows and results to this file")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each row this many times (fresh children) and show the fastest of each: "
        "this machine's speed drifts 20-30%% between minutes",
    )
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        kind, row = a.worker[0], json.loads(a.worker[1])
        if kind == "verify":
            res = worker_verify(row, float(a.worker[2]), float(a.worker[3]))
        else:
            res = worker_xla(row)
        print(json.dumps(res), flush=True)
        return
    if a.numerics:
        sys.exit(numerics())

    a.stacks = [x for x in a.stack.split(",") if x]
    timeout = a.timeout or a.time_limit + 120
    rows = rows_for(a)
    header = (
        f"{'program':<46} {'bug':>5} {'verdict':>18} {'stages':>6} {'reduced':>9} {'tv s':>7} "
        f"{'lower s':>7} "
        f"{'peak MB':>7} {'xla s':>6} {'TrainVerify s':>13}"
    )
    print(
        f"tv time limit {a.time_limit:.0f} s, child killed at {timeout:.0f} s or "
        f"{a.memory:.0f} MB; Llama style: {a.style}"
    )
    print(header)
    print("-" * len(header), flush=True)
    results: list[dict] = []
    passes = max(1, a.repeat)
    runs: list[list[dict]] = [[] for _ in rows]
    xlas: list[list[dict]] = [[] for _ in rows]
    for n in range(passes):  # passes over all rows: the machine's drift falls on every row alike
        for i, row in enumerate(rows):
            if runs[i] and runs[i][-1]["verdict"] != expected(row):
                continue  # a wrong or missing verdict is shown as it is
            res, peak = run_child(
                ["verify", json.dumps(row), str(a.time_limit), str(a.memory)],
                timeout,
                a.memory + 200,
            )
            res["peak_mb"] = peak
            runs[i].append(res)
            if not a.no_xla:
                xlas[i].append(run_child(["xla", json.dumps(row)], max(timeout, 600), None)[0])
            if passes > 1:
                print(
                    f"  pass {n + 1}/{passes} {label(row):<46} {res['verdict']:>18} "
                    f"{fmt(res.get('seconds'))} s",
                    file=sys.stderr,
                    flush=True,
                )
            else:
                results.append(show(row, res, xlas[i]))
    if passes > 1:
        for i, row in enumerate(rows):
            res = min(runs[i], key=lambda r: (r["verdict"] != expected(row), r.get("seconds", 1e9)))
            res["runs_s"] = [r.get("seconds") for r in runs[i]]
            results.append(show(row, res, xlas[i]))
    spread(results, a.sweep)
    print(
        "\ntv s: verify() in a fresh child, JAX lowering of spec and implementation included"
        "\n(lower s: that lowering alone); peak MB: the child's ru_maxrss; xla s: XLA's"
        "\ncompile time of the same spec + implementation (jax.jit(f).lower(*args).compile(),"
        "\nlowering excluded); TrainVerify s: its published time for the 32-layer configuration"
        "\n(issue #10). * : not the expected verdict (equivalent, or not_equivalent for a bug)."
        "\nreduced: elements over all values of the pair tv proved (after shape reduction)."
        + (
            f"\nEach row run {a.repeat} times, in {a.repeat} passes over all rows (the machine's"
            "\ndrift falls on every row alike): the fastest shown."
            if a.repeat > 1
            else ""
        )
    )
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
