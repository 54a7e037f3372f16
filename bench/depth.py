"""How verification cost grows with depth: a transformer block stacked 1, 2, 4, 8 deep.

    python bench/depth.py [--depths 1,2,4] [--quick] [--timeout SECONDS]

For each depth, forward and gradient programs: the spec stack against its fused-QKV rewrite
(equivalent). Each verification runs in a fresh subprocess; its peak memory is that child's
`ru_maxrss` from `os.wait4` (so it includes the interpreter, numpy, z3 and jaxlib's MLIR
bindings: the baseline of an import-only child is printed above the table). Beside it, the
time XLA (CPU) takes to compile the same two modules (`jax.jit(f).lower(...).compile()`).
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

IMPL = "fused_qkv"


def worker(spec: str, impl: str) -> None:
    """Child process: verify and print one JSON line."""
    import tv_ir

    if spec == "-":  # baseline: imports and parsing only
        tv_ir.load(Path(impl))
        print(json.dumps({}))
        return
    t0 = time.perf_counter()
    report = tv_ir.check(Path(spec), Path(impl))
    seconds = time.perf_counter() - t0
    stats = report.stats
    print(json.dumps({"verdict": report.verdict, "stages": stats.stages, "seconds": seconds}))


def run_child(args: list[str], timeout: float) -> tuple[dict, float, int]:
    """Run this script as a worker; return (its JSON, peak RSS in MB, exit status)."""
    child = run_worker(__file__, args, timeout)
    result = child.result
    if result is None:
        result = {"verdict": "timeout" if child.killed else "error", "error": child.tail()}
    return result, child.peak_mb, child.returncode


def count_ops(module) -> int:
    """Ops in every function of the module, nested regions included."""

    def block(b) -> int:
        return sum(1 + sum(block(r.block) for r in op.regions) for op in b.ops)

    return sum(block(f.body) for f in module.functions.values())


def xla_compile_seconds(depth: int, grad: bool, variant: str) -> float:
    import jax
    import jax.numpy as jnp

    from tests.programs import transformer as T

    specs = [jax.ShapeDtypeStruct(s, jnp.float32) for s in T.arg_shapes(depth)]
    lowered = jax.jit(T.stacked(depth, grad, variant)).lower(*specs)
    t0 = time.perf_counter()
    lowered.compile()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", default="1,2,4,8", help="comma-separated depths (default 1,2,4,8)")
    ap.add_argument("--quick", action="store_true", help="depths 1,2 only")
    ap.add_argument(
        "--timeout", type=float, default=600.0, help="wall-clock seconds per verifying child"
    )
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(*a.worker)
        return

    import tv_ir
    from tests.programs import transformer as T

    depths = [1, 2] if a.quick else [int(d) for d in a.depths.split(",")]
    with tempfile.TemporaryDirectory(prefix="tv-bench-") as tmp:
        tmp = Path(tmp)
        header = (
            f"{'depth':>5} {'prog':>4} {'ops':>11} {'verdict':>14} {'stages':>6} "
            f"{'verify s':>9} {'peak MB':>8} {'xla s':>7}"
        )
        rows = []
        base = None
        for depth in depths:
            for grad in (False, True):
                prog = "grad" if grad else "fwd"
                spec_path = tmp / f"spec_{depth}_{prog}.mlir"
                impl_path = tmp / f"{IMPL}_{depth}_{prog}.mlir"
                spec_path.write_text(T.lower("spec", grad, depth))
                impl_path.write_text(T.lower(IMPL, grad, depth))
                if base is None:
                    base = run_child(["-", str(spec_path)], a.timeout)[1]
                    print(f"baseline peak memory of an import-and-parse child: {base:.0f} MB")
                    print(header, flush=True)
                ops = f"{count_ops(tv_ir.load(spec_path))}/{count_ops(tv_ir.load(impl_path))}"
                res, peak, _ = run_child([str(spec_path), str(impl_path)], a.timeout)
                xla = xla_compile_seconds(depth, grad, "spec") + xla_compile_seconds(
                    depth, grad, IMPL
                )
                secs = f"{res['seconds']:.2f}" if "seconds" in res else "-"
                row = (
                    f"{depth:>5} {prog:>4} {ops:>11} {res['verdict']:>14} "
                    f"{res.get('stages', '-'):>6} {secs:>9} {peak:>8.0f} {xla:>7.2f}"
                )
                rows.append(row)
                print(row, flush=True)
                if "error" in res:
                    print(f"      {res['error']}", flush=True)
    print("\nops: spec/impl op counts; xla s: XLA CPU compile time of spec + impl;")
    print("peak MB: ru_maxrss (os.wait4) of the fresh verifying subprocess.")


if __name__ == "__main__":
    main()
