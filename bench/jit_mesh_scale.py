"""Verification cost against the device count for a `jax.jit` step with shardings (issue #12).

    python bench/jit_mesh_scale.py                          # the Llama step on 8, 32, 64, 512
    python bench/jit_mesh_scale.py --step mlp --meshes 2x4,8x8,32x16,64x32
    python bench/jit_mesh_scale.py --meshes 2x4,8x4 --no-xla
    python bench/jit_mesh_scale.py --step llama-fsdp        # data x fsdp x model: 8 ... 8,192
    python bench/jit_mesh_scale.py --step llama-pipeline    # data x fsdp x stage x model
    python bench/jit_mesh_scale.py --step cumsum            # one "data" axis: 8, 64, 512

Steps (`--step`):
- `llama`: the AdamW FSDP x TP step of examples/jax/llama_adamw_fsdp_tp.py (optax AdamW;
  parameters and moments FSDP over "data", Megatron over "model"; the batch over "data")
  at a config whose widths every mesh divides (dim, FFN and vocabulary 64, 4 heads);
- `llama-fsdp`: the same AdamW step on a data x fsdp x model mesh (`--meshes DxFxM`): the
  batch over ("data", "fsdp"), parameters and moments FSDP over "fsdp" and Megatron over
  "model", the attention heads included (8 heads of 8), replicated over "data";
- `llama-pipeline`: the same AdamW step pipelined under jit (`--meshes DxFxSxM`), as
  examples/jax/llama_pipeline_jit.py writes it: one layer per "stage" device (the layers
  stacked over "stage", `jax.vmap` over the stages, `jnp.roll` between them), 2
  micro-batches whose rows split over ("data", "fsdp"), the matrices as in `llama-fsdp`;
  its spec is the AdamW step without the pipeline;
- `llama-megatron`: the same AdamW step with data parallelism and Megatron tensor
  parallelism (parameters and moments replicated over "data"; attention heads, MLP and
  output head over "model"; 8 heads of 8);
- `cumsum`: `jnp.cumsum` over columns split over "data" (`--meshes DATA`, 512 columns
  per device);
- `mlp`: one SGD step of a two-layer MLP, its weights FSDP over "data" and Megatron over
  "model", the batch over "data" (widths 128 and 256, 8 rows per "data" device).

XLA's SPMD partitioner makes the per-device program for the real mesh (on as many host CPU
devices, so each row runs in a fresh child with its device count), and tv proves it against
the single-device step, on a smaller mesh where XLA's program is a template of its mesh
(docs/equivalence.md, "Mesh reduction": XLA's programs); "reduced" is the mesh the proof
ran on, and the line under a row says what kept an axis. "tv s" is the wall time of `verify`
(JAX's tracing and lowering and XLA's partitioning included); "cpu s" is the CPU time of
that process's threads over the same span (not its children's), steadier than wall time on a
shared machine. "partition s" is XLA's partitioning inside `verify` (its compile of the
annotated step, part of "tv s"). "own s" is tv's own part of "tv s": less JAX's tracing and
lowering (the report's `jax lowering` seconds) and XLA's partitioning, the two that are the
frameworks' (both grow with the device count). "devices s" is JAX making the row's host CPU
devices, before `verify` (it grows as the square of their count: 0.2 s for 2,048, 2 s for
8,192; a TPU user's devices exist already). "xla s" is XLA's compile of the same jit step
for that mesh. Past 2,048 devices XLA's CPU client compiles only with CPU collectives, which
importing `tv_ir.frontends.jax` sets up (docs/jax.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
for p in (ROOT, BENCH, ROOT / "examples" / "jax"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

MESHES = ["2x4", "8x4", "16x4", "64x8"]
WIDTH = 64  # dim, FFN, vocabulary and the 4 heads x head_dim: every mesh axis divides it
# tokens per sequence: the loss averages 6 x DATA tokens, equal to no width of the step (at 2
# tokens the count 4 x 16 at DATA 16 equals the width 64, and shape reduction keeps a count's
# class at its real size)
SEQ = 3


def _adamw_step(loss):
    """One optax AdamW step (examples/jax/llama_adamw_fsdp_tp.py's) of `loss(params, batch)`."""
    import jax
    import llama_adamw_fsdp_tp as ex

    def train_step(params, opt_state, batch):
        value, grads = jax.value_and_grad(loss)(params, batch)
        updates, opt_state = ex.TX.update(grads, opt_state, params)
        return ex.optax.apply_updates(params, updates), opt_state, value

    return train_step


def _step(mesh: dict[str, int]):
    """(train_step, example args, in/out shardings) at the bench's config."""
    data = mesh["data"]
    import jax
    import llama
    import llama_adamw_fsdp_tp as ex
    from jax.sharding import PartitionSpec as P

    cfg = llama.Config(
        dim=WIDTH, ffn=WIDTH, vocab=WIDTH, head_dim=WIDTH // 4, batch=2 * data, seq=SEQ
    )
    train_step = _adamw_step(functools.partial(llama.loss_fn, cfg=cfg))

    params = llama.param_shapes(cfg)
    opt_state = jax.eval_shape(ex.TX.init, params)
    args = (params, opt_state, llama.batch_shapes(cfg))
    p, o = ex.param_specs(), ex.opt_state_specs(opt_state)
    batch = {"x": P("data"), "targets": P("data")}
    return train_step, args, (p, o, batch), (p, o, P())


def _megatron_step(mesh: dict[str, int]):
    """(train_step, example args, in/out shardings) of the same AdamW Llama step with data
    parallelism and Megatron tensor parallelism: parameters and moments replicated over
    "data" (no FSDP), attention heads, the SwiGLU MLP and the output head split over
    "model" (8 heads of 8, so up to 8 "model" devices divide them)."""
    return _tensor_parallel_step(2 * mesh["data"], None, "data")


def _fsdp_step(mesh: dict[str, int]):
    """(train_step, example args, in/out shardings) of the AdamW Llama step on a data x fsdp
    x model mesh: the batch over ("data", "fsdp"); parameters and moments FSDP over "fsdp"
    and Megatron over "model" (attention heads, SwiGLU MLP, output head; 8 heads of 8),
    replicated over "data"."""
    return _tensor_parallel_step(2 * mesh["data"] * mesh["fsdp"], "fsdp", ("data", "fsdp"))


def _tensor_parallel_step(batch: int, fsdp: str | None, batch_axes):
    """The AdamW Llama step with Megatron over "model", attention included (8 heads of 8),
    at `batch` sequences split over `batch_axes`: the example's FSDP axis ("data") becomes
    `fsdp` (None: parameters and moments replicated there)."""
    import jax
    import llama
    import llama_adamw_fsdp_tp as ex
    from jax.sharding import PartitionSpec as P

    cfg = llama.Config(
        dim=WIDTH, ffn=WIDTH, vocab=WIDTH, heads=8, kv_heads=8, head_dim=WIDTH // 8,
        batch=batch, seq=SEQ,
    )  # fmt: skip
    train_step = _adamw_step(functools.partial(llama.loss_fn, cfg=cfg))

    def moved(tree):
        return jax.tree_util.tree_map(
            lambda s: P(*(fsdp if a == "data" else a for a in s)),
            tree,
            is_leaf=lambda s: isinstance(s, P),
        )

    params = llama.param_shapes(cfg)
    opt_state = jax.eval_shape(ex.TX.init, params)
    args = (params, opt_state, llama.batch_shapes(cfg))
    p = moved(ex.param_specs(attention_tp=True))
    o = moved(ex.opt_state_specs(opt_state, attention_tp=True))
    batch = {"x": P(batch_axes), "targets": P(batch_axes)}
    return train_step, args, (p, o, batch), (p, o, P())


def _pipeline_step(mesh: dict[str, int]):
    """(train_step, example args, in/out shardings, spec) of the AdamW Llama step pipelined
    under jit as examples/jax/llama_pipeline_jit.py writes it: the layers stacked over
    "stage" (one per device), 2 micro-batches whose rows split over ("data", "fsdp"),
    `jax.vmap` over the stages and `jnp.roll` between them; the matrices FSDP over "fsdp"
    and Megatron over "model" (8 heads of 8) as in `llama-fsdp`. The spec is the same AdamW
    step without the pipeline."""
    import jax
    import llama
    import llama_adamw_fsdp_tp as ex
    import llama_pipeline_jit as pipe
    from jax.sharding import PartitionSpec as P

    micro, rows = 2, ("data", "fsdp")
    cfg = llama.Config(
        dim=WIDTH, ffn=WIDTH, vocab=WIDTH, heads=8, kv_heads=8, head_dim=WIDTH // 8,
        batch=2 * micro * mesh["data"] * mesh["fsdp"], seq=SEQ, layers=mesh["stage"],
    )  # fmt: skip

    def staged(tree):  # "data" of the example's FSDP is "fsdp"; stacked layers over "stage"
        def one(s):
            axes = ["fsdp" if a == "data" else a for a in s]
            return P("stage", *axes[1:]) if len(axes) == 3 else P(*axes)

        return jax.tree_util.tree_map(one, tree, is_leaf=lambda s: isinstance(s, P))

    params = llama.param_shapes(cfg)
    opt_state = jax.eval_shape(ex.TX.init, params)
    p = staged(ex.param_specs(attention_tp=True))
    p["layers"].update(attn_norm=P("stage"), mlp_norm=P("stage"))
    o = ex.opt_state_specs(opt_state, params=p)
    batch = {"x": P(rows), "targets": P(rows)}
    impl = _adamw_step(functools.partial(pipe.pipeline_loss, cfg=cfg, micro=micro, batch_axes=rows))
    spec = _adamw_step(functools.partial(llama.loss_fn, cfg=cfg))
    args = (params, opt_state, llama.batch_shapes(cfg))
    return impl, args, (p, o, batch), (p, o, P()), spec


def _mlp_step(mesh: dict[str, int]):
    """(train_step, example args, in/out shardings) of the MLP step."""
    data = mesh["data"]
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def loss(w1, w2, x):
        return jnp.mean((jax.nn.relu(x @ w1) @ w2) ** 2)

    def train_step(w1, w2, x):
        value, (g1, g2) = jax.value_and_grad(loss, argnums=(0, 1))(w1, w2, x)
        return w1 - 0.1 * g1, w2 - 0.1 * g2, value

    f32 = jnp.float32
    args = tuple(jax.ShapeDtypeStruct(s, f32) for s in [(128, 256), (256, 128), (8 * data, 128)])
    ins = (P("data", "model"), P("model", "data"), P("data", None))
    return train_step, args, ins, (ins[0], ins[1], P())


def _cumsum_step(mesh: dict[str, int]):
    """(step, example args, in/out shardings) of a running sum over columns split over
    "data" (512 per device): XLA gathers each row, pads it and slides a window of the row's
    length over each device's stretch (docs/equivalence.md, "Kept classes")."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def running_sum(x):
        return jnp.cumsum(x, axis=1)

    args = (jax.ShapeDtypeStruct((4, 512 * mesh["data"]), jnp.float32),)
    return running_sum, args, (P(None, "data"),), P(None, "data")


STEPS = {
    "llama": _step,
    "cumsum": _cumsum_step,
    "llama-fsdp": _fsdp_step,
    "llama-megatron": _megatron_step,
    "llama-pipeline": _pipeline_step,
    "mlp": _mlp_step,
}
AXES = {  # the others: ("data", "model")
    "cumsum": ("data",),
    "llama-fsdp": ("data", "fsdp", "model"),
    "llama-pipeline": ("data", "fsdp", "stage", "model"),
}
DEFAULT_MESHES = {
    "cumsum": ["8", "64", "512"],
    "llama-fsdp": ["2x2x2", "4x4x4", "8x8x8", "16x16x8", "64x16x8"],
    "llama-pipeline": ["2x1x2x2", "2x2x2x2", "2x4x2x4", "8x4x2x8", "128x4x2x8"],
}


def mesh_of(step_name: str, mesh: str) -> dict[str, int]:
    """{axis: size} of a `--meshes` entry (DATAxMODEL; DATAxFSDPxMODEL for llama-fsdp,
    DATAxFSDPxSTAGExMODEL for llama-pipeline)."""
    names = AXES.get(step_name, ("data", "model"))
    sizes = [int(k) for k in mesh.split("x")]
    if len(sizes) != len(names):
        raise SystemExit(f"--step {step_name} takes meshes {'x'.join(n.upper() for n in names)}")
    return dict(zip(names, sizes, strict=True))


def worker_verify(
    step_name: str, mesh: str, time_limit: float, memory: float, whole: bool = False
) -> dict:
    import jax
    from tv_ir.frontends.jax import verify

    axes = mesh_of(step_name, mesh)
    step, args, ins, outs, *spec = STEPS[step_name](axes)
    t0 = time.perf_counter()
    jax.devices()  # JAX makes its host devices: not verification (see the docstring)
    devices_s = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    report = verify(
        step,
        *args,
        spec=spec[0] if spec else step,
        mesh=axes,
        in_shardings=ins,
        out_shardings=outs,
        time_limit=time_limit,
        memory_limit=memory,
        reduce_mesh=not whole,
    )
    reduction = report.mesh_reduction or {}
    kept = [a for a in reduction.get("axes", []) if a.get("kept") and a["real"] > 2]
    note = next((n for n in report.notes if "every device simulated" in n), "")
    return {
        "verdict": report.verdict,
        "reduced": (reduction.get("devices") or [None, None])[1]
        if reduction.get("reduced")
        else math.prod(axes.values()),
        "kept": "; ".join(f"{a['name']}: {a['kept']}" for a in kept) or note,
        "seconds": time.perf_counter() - t0,
        "cpu": time.process_time() - c0,
        "devices_s": devices_s,
        "stages": report.stats.stages,
        "reason": report.reason,
        "phases": {k: round(v, 2) for k, v in report.stats.seconds.items()},
        # tv's own part: verify's wall time less JAX's lowering and XLA's partitioning
        "own": time.perf_counter()
        - t0
        - report.stats.seconds.get("jax lowering", 0.0)
        - report.stats.seconds.get("xla partition", 0.0),
    }


def worker_xla(step_name: str, mesh: str) -> dict:
    from tv_ir.xla.partitioner import ensure_host_devices

    ensure_host_devices()  # past 2,048 devices XLA compiles only with CPU collectives
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding

    axes = mesh_of(step_name, mesh)
    step, args, ins, outs, *_ = STEPS[step_name](axes)
    n = math.prod(axes.values())
    m = Mesh(np.array(jax.devices()[:n]).reshape(tuple(axes.values())), tuple(axes))

    def shard(tree):
        return jax.tree_util.tree_map(
            lambda s: NamedSharding(m, s),
            tree,
            is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec),
        )

    t0 = time.perf_counter()
    with jax.set_mesh(m):  # the step's sharding constraints name the mesh's axes
        jitted = jax.jit(step, in_shardings=shard(ins), out_shardings=shard(outs))
        jitted.lower(*args).compile()
    return {"xla_s": time.perf_counter() - t0}


def main() -> None:
    from child_process import run_worker

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step", choices=sorted(STEPS), default="llama")
    ap.add_argument(
        "--meshes",
        help="DATAxMODEL (llama-fsdp: DATAxFSDPxMODEL, llama-pipeline: DATAxFSDPxSTAGExMODEL), "
        "comma-separated",
    )
    ap.add_argument("--no-xla", action="store_true", help="skip XLA's compile times")
    ap.add_argument(
        "--whole-mesh", action="store_true", help="simulate every device (no mesh reduction)"
    )
    ap.add_argument("--time-limit", type=float, default=600.0)
    ap.add_argument("--memory", type=float, default=3500.0, help="tv's memory_limit (MB)")
    ap.add_argument(
        "--repeat", type=int, default=1, help="passes over the meshes; rows give medians"
    )
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        if a.worker[0] == "xla":
            res = worker_xla(a.worker[1], a.worker[2])
        else:
            res = worker_verify(
                a.worker[1], a.worker[2], float(a.worker[3]), float(a.worker[4]),
                a.worker[5] == "whole",
            )  # fmt: skip
        print(json.dumps(res), flush=True)
        return

    header = (
        f"{'mesh':>8} {'devices':>7} {'reduced':>7} {'verdict':>11} {'tv s':>7} {'cpu s':>6} "
        f"{'prove s':>7} {'partition s':>11} {'own s':>5} {'devices s':>9} "
        f"{'stages':>6} {'peak MB':>7} {'xla s':>6}"
    )
    whole_note = "; every device simulated" if a.whole_mesh else ""
    print(
        f"step {a.step}{whole_note}; tv time limit {a.time_limit:.0f} s, "
        f"memory limit {a.memory:.0f} MB"
    )
    print(header)
    print("-" * len(header), flush=True)
    script = str(Path(__file__).resolve())
    meshes = a.meshes.split(",") if a.meshes else DEFAULT_MESHES.get(a.step, MESHES)
    runs: dict[str, list[dict]] = {mesh: [] for mesh in meshes}
    for _ in range(a.repeat):  # passes over all meshes, so that a slow minute hits each
        for mesh in meshes:
            devices = math.prod(mesh_of(a.step, mesh).values())
            env = dict(os.environ)
            env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
            whole = "whole" if a.whole_mesh else "reduce"
            args = ["verify", a.step, mesh, str(a.time_limit), str(a.memory), whole]
            child = run_worker(script, args, a.time_limit + 120, env)
            res = child.result or {"verdict": "killed", "reason": child.killed or child.tail()}
            res["peak_mb"] = child.peak_mb
            if not a.no_xla:
                xla = run_worker(script, ["xla", a.step, mesh], 1800, env).result or {}
                res["xla_s"] = xla.get("xla_s")
            runs[mesh].append(res)
            if a.repeat == 1:
                _row(a.step, mesh, [res])
    if a.repeat > 1:
        print(f"medians of {a.repeat} passes ('tv s' also its range)")
        for mesh in meshes:
            _row(a.step, mesh, runs[mesh])
        first = meshes[0]
        for key, what in (("seconds", "tv s"), ("own", "own s")):
            base = statistics.median(r.get(key, math.nan) for r in runs[first])
            for mesh in meshes[1:]:
                ratios = [
                    r.get(key, math.nan) / f.get(key, math.nan)
                    for r, f in zip(runs[mesh], runs[first], strict=True)
                ]
                tv = statistics.median(r.get(key, math.nan) for r in runs[mesh])
                print(
                    f"  {what}, {mesh} / {first}: {tv / base:.2f}x of the medians; per pass "
                    + " / ".join(f"{x:.2f}" for x in ratios)
                )


def _row(step: str, mesh: str, runs: list[dict]) -> None:
    """One table row: the run's figures, or the medians of several runs of the mesh."""

    def mid(key, phase: bool = False) -> float:
        got = [(r.get("phases", {}) if phase else r).get(key) for r in runs]
        got = [x for x in got if x is not None]
        return statistics.median(got) if got else math.nan

    res = runs[-1]
    devices = math.prod(mesh_of(step, mesh).values())
    tv = mid("seconds")
    spread = ""
    if len(runs) > 1:
        times = [r.get("seconds", math.nan) for r in runs]
        spread = f"  (tv s {min(times):.1f}-{max(times):.1f})"
    print(
        f"{mesh:>8} {devices:>7} {res.get('reduced') or '?':>7} {res['verdict']:>11} "
        f"{tv:>7.1f} {mid('cpu'):>6.1f} {mid('prove', True):>7.1f} "
        f"{mid('xla partition', True):>11.1f} {mid('own'):>5.1f} {mid('devices_s'):>9.1f} "
        f"{res.get('stages', 0):>6} {mid('peak_mb'):>7.0f} {mid('xla_s'):>6.1f}{spread}",
        flush=True,
    )
    for what in ("reason", "kept"):
        if res.get(what):
            print(f"  {what}: {res[what][:400]}", flush=True)


if __name__ == "__main__":
    main()
