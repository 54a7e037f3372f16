"""Depth through a scan (issue #12): layers stacked with `jax.lax.scan`, 2 / 32 / 126 deep.

    python bench/scan_depth.py                     # every program at 2, 32, 126 layers
    python bench/scan_depth.py --depths 2,32 --programs mlp-shard-map
    python bench/scan_depth.py --no-bugs --time-limit 300
    python bench/scan_depth.py --unrolled --no-bugs    # every loop unrolled, for comparison
    python bench/scan_depth.py --programs mlp-for-grad,transformer-for-grad --bugs mlp-for-layer17

Programs (each a spec, a single-device `lax.scan` over stacked per-layer weights, against an
implementation of the same scan):

- `mlp-shard-map`: residual MLP layers (x 8x16, hidden 32), forward; the impl is a
  `jax.shard_map` on a 2x2 ("data", "model") mesh, Megatron-style with a psum per layer.
- `mlp-jit-grad`: the same stack, gradient of sum(y^2) with respect to the stacked weights
  (a forward scan and a reversed backward scan); the impl is `jax.jit` with NamedShardings
  (batch over "data", hidden over "model"), partitioned by XLA.
- `transformer-grad`: tests/programs/transformer.py's pre-norm block (attention + gelu MLP,
  LayerNorms) scanned, gradient with respect to the input and every stacked parameter; the
  impl is the fused-QKV rewrite of the block, with NamedShardings (MLP hidden over "model").

Python-for rows (the same stacks written as a Python `for` over per-layer weights, so they
arrive unrolled; passes/reroll.py rolls them back into loops):

- `mlp-for-grad`: `mlp-jit-grad` with one `(w1, w2)` argument pair per layer;
- `transformer-for-grad`: tests/programs/transformer.py's `stacked(depth, grad=True)` (12
  arguments per layer), the impl the same block with NamedShardings (MLP hidden over
  "model"; the fused-QKV rewrite is not paired by loop induction in the gradient: it saves
  the fused projection where the spec saves three).

Bug rows (`--no-bugs` skips them), at the largest depth:

- `mlp-jit-layer17`: the jit forward with `jnp.where(i == 17, 2 * y, y)` in the scanned layer
  (only layer 17 is wrong);
- `transformer-residual`: the transformer gradient with the attention residual subtracted
  (every layer wrong);
- `mlp-for-layer17`: the Python-for forward with `if i == 17: y = 2 * y` (only layer 17 is
  wrong: it is not rerolled, so the runs before and after it are two loops).

Each row runs in a fresh child (time and memory limits given to tv, the child killed past
them); columns: verdict, loops proved by induction (`stats.loops_by_induction`), stages,
seconds of `tv_ir.check` (lowering excluded), the child's peak RSS (`ru_maxrss`), the line the
refutation names, and XLA's CPU compile time of the same spec + implementation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from child_process import run_worker  # noqa: E402

PROGRAMS = ["mlp-shard-map", "mlp-jit-grad", "transformer-grad"]
FOR_PROGRAMS = ["mlp-for-grad", "transformer-for-grad"]
BUGS = ["mlp-jit-layer17", "transformer-residual", "mlp-for-layer17"]


def _mesh():
    import jax
    import numpy as np
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"))


def _mlp_args(depth: int):
    import jax
    import jax.numpy as jnp

    return [
        jax.ShapeDtypeStruct(s, jnp.float32) for s in [(8, 16), (depth, 16, 32), (depth, 32, 16)]
    ]


def _mlp(bug_layer: int | None = None):
    import jax
    import jax.numpy as jnp

    def f(x, w1, w2):
        def layer(carry, w):
            h, i = carry
            y = jax.nn.relu(h @ w[0]) @ w[1] + h
            if bug_layer is not None:
                y = jnp.where(i == bug_layer, 2 * y, y)  # BUG: mlp-jit-layer17
            return (y, i + 1), None

        (h, _), _ = jax.lax.scan(layer, (x, 0), (w1, w2))
        return h

    return f


def _mlp_shardings(mesh):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    specs = (P("data", None), P(None, None, "model"), P(None, "model", None))
    return tuple(NamedSharding(mesh, s) for s in specs)


def _grad(f, argnums):
    import jax
    import jax.numpy as jnp

    return jax.grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=argnums)


def _transformer(variant: str):
    import jax

    from tests.programs import transformer as T

    def f(x, *stacked):
        def layer(h, p):
            return T._layer(h, p, variant), None

        h, _ = jax.lax.scan(layer, x, stacked)
        return h

    return f


def _transformer_args(depth: int):
    import jax
    import jax.numpy as jnp

    from tests.programs import transformer as T

    shapes = [T.X_SHAPE] + [(depth, *s) for _, s in T.PARAM_SHAPES]
    return [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]


def _transformer_shardings(mesh):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from tests.programs import transformer as T

    out = [NamedSharding(mesh, P())]
    for name, shape in T.PARAM_SHAPES:
        spec = [None] * (len(shape) + 1)
        if name in ("w1", "b1"):
            spec[-1] = "model"
        elif name == "w2":
            spec[1] = "model"
        out.append(NamedSharding(mesh, P(*spec)))
    return tuple(out)


def _mlp_for(depth: int, bug_layer: int | None = None):
    import jax

    def f(x, *ws):
        for i in range(depth):
            y = jax.nn.relu(x @ ws[2 * i]) @ ws[2 * i + 1] + x
            if i == bug_layer:
                y = 2 * y  # BUG: mlp-for-layer17
            x = y
        return x

    return f


def _mlp_for_args(depth: int):
    import jax
    import jax.numpy as jnp

    shapes = [(8, 16)] + [s for _ in range(depth) for s in ((16, 32), (32, 16))]
    return [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]


def _mlp_for_shardings(mesh, depth: int):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    per_layer = [P(None, "model"), P("model", None)] * depth
    return tuple(NamedSharding(mesh, s) for s in [P("data", None), *per_layer])


def _transformer_for_shardings(mesh, depth: int):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from tests.programs import transformer as T

    out = [NamedSharding(mesh, P())]
    for _ in range(depth):
        for name, shape in T.PARAM_SHAPES:
            spec = [None] * len(shape)
            if name in ("w1", "b1"):
                spec[-1] = "model"
            elif name == "w2":
                spec[0] = "model"
            out.append(NamedSharding(mesh, P(*spec)))
    return tuple(out)


def _python_for(name: str, depth: int, mesh):
    import jax
    import jax.numpy as jnp

    if name in ("mlp-for-grad", "mlp-for-layer17"):
        args, sh = _mlp_for_args(depth), _mlp_for_shardings(mesh, depth)
        if name == "mlp-for-grad":
            argnums = tuple(range(1, len(args)))
            spec, impl = _grad(_mlp_for(depth), argnums), _grad(_mlp_for(depth), argnums)
            out = sh[1:]
        else:
            spec, impl, out = _mlp_for(depth), _mlp_for(depth, bug_layer=17), sh[0]
        return jax.jit(spec), jax.jit(impl, in_shardings=sh, out_shardings=out), args
    from tests.programs import transformer as T

    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in T.arg_shapes(depth)]
    sh = _transformer_for_shardings(mesh, depth)
    f = T.stacked(depth, grad=True)
    return jax.jit(f), jax.jit(f, in_shardings=sh, out_shardings=sh), args


def programs(name: str, depth: int):
    """(spec jitted, impl jitted, arg specs) for one row."""
    import jax
    from jax.sharding import PartitionSpec as P

    mesh = _mesh()
    if name in FOR_PROGRAMS or name == "mlp-for-layer17":
        return _python_for(name, depth, mesh)
    if name == "mlp-shard-map":
        spec = _mlp()
        impl = jax.shard_map(
            _mlp_psum(),
            mesh=mesh,
            in_specs=(P("data", None), P(None, None, "model"), P(None, "model", None)),
            out_specs=P("data", None),
            check_vma=False,
        )
        return jax.jit(spec), jax.jit(impl), _mlp_args(depth)
    if name in ("mlp-jit-grad", "mlp-jit-layer17"):
        sh = _mlp_shardings(mesh)
        if name == "mlp-jit-grad":
            spec, impl, out = _grad(_mlp(), (1, 2)), _grad(_mlp(), (1, 2)), sh[1:]
        else:
            spec, impl, out = _mlp(), _mlp(bug_layer=17), sh[0]
        return jax.jit(spec), jax.jit(impl, in_shardings=sh, out_shardings=out), _mlp_args(depth)
    variant = "residual_sign" if name == "transformer-residual" else "spec"
    args = _transformer_args(depth)
    argnums = tuple(range(len(args)))
    sh = _transformer_shardings(mesh)
    spec = _grad(_transformer("spec"), argnums)
    impl = _grad(_transformer(variant), argnums)
    return jax.jit(spec), jax.jit(impl, in_shardings=sh, out_shardings=sh), args


def _mlp_psum():
    import jax

    def body(x, w1, w2):
        def layer(h, w):
            return jax.lax.psum(jax.nn.relu(h @ w[0]) @ w[1], "model") + h, None

        h, _ = jax.lax.scan(layer, x, (w1, w2))
        return h

    return body


def worker(name: str, depth: int, time_limit: float, memory: float, unrolled: bool) -> None:
    """Child: lower, verify, time XLA's compile; print one JSON line."""
    import tv_ir

    if unrolled:  # the path before loop induction: every loop unrolled
        import tv_ir.pipeline

        tv_ir.pipeline._by_induction = lambda *a, **k: None

    spec, impl, args = programs(name, depth)
    spec_l, impl_l = spec.lower(*args), impl.lower(*args)
    texts = [x.as_text(debug_info=True) for x in (spec_l, impl_l)]
    t0 = time.perf_counter()
    report = tv_ir.check(*texts, time_limit=time_limit, memory_limit=memory)
    seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    spec_l.compile()
    impl_l.compile()
    xla = time.perf_counter() - t1
    loc = report.location.impl if report.location else None
    print(
        json.dumps(
            {
                "verdict": report.verdict,
                "loops": report.stats.loops_by_induction,
                "stages": report.stats.stages,
                "seconds": seconds,
                "xla": xla,
                "line": f"{Path(loc.file).name}:{loc.line}" if loc and loc.file else "-",
                "reason": report.reason,
            }
        )
    )


def run_child(args: list[str], timeout: float) -> tuple[dict, float]:
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=4".strip()
    child = run_worker(__file__, args, timeout, env)
    if child.result is None:
        return {"verdict": child.killed or "error", "reason": child.tail()}, child.peak_mb
    return child.result, child.peak_mb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", default="2,32,126")
    ap.add_argument("--programs", default=",".join(PROGRAMS))
    ap.add_argument("--no-bugs", action="store_true")
    ap.add_argument("--bugs", default=",".join(BUGS), help="bug rows to run (at the largest depth)")
    ap.add_argument("--time-limit", type=float, default=600.0, help="tv's time_limit per row")
    ap.add_argument("--memory", type=float, default=3500.0, help="tv's memory_limit (MB)")
    ap.add_argument(
        "--unrolled", action="store_true", help="unroll every loop (no induction), for comparison"
    )
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        name, depth, limit, memory, unrolled = a.worker
        worker(name, int(depth), float(limit), float(memory), unrolled == "unrolled")
        return
    depths = [int(d) for d in a.depths.split(",")]
    rows = [(p, d) for p in a.programs.split(",") for d in depths]
    if not a.no_bugs:
        rows += [(b, max(depths)) for b in a.bugs.split(",") if b]
    header = (
        f"{'program':>20} {'layers':>6} {'verdict':>15} {'loops':>5} {'stages':>6} "
        f"{'tv s':>7} {'peak MB':>7} {'xla s':>6}  refuted at"
    )
    print(f"tv time limit {a.time_limit:.0f} s, memory limit {a.memory:.0f} MB", end="")
    print(", every loop unrolled (no induction)" if a.unrolled else "")
    print(header)
    print("-" * len(header), flush=True)
    for name, depth in rows:
        mode = "unrolled" if a.unrolled else "induction"
        args = [name, str(depth), str(a.time_limit), str(a.memory), mode]
        res, peak = run_child(args, a.time_limit + 300)
        secs = f"{res['seconds']:.1f}" if "seconds" in res else "-"
        xla = f"{res['xla']:.2f}" if "xla" in res else "-"
        print(
            f"{name:>20} {depth:>6} {res['verdict']:>15} {res.get('loops', '-'):>5} "
            f"{res.get('stages', '-'):>6} {secs:>7} {peak:>7.0f} {xla:>6}  {res.get('line', '')}",
            flush=True,
        )
        if res["verdict"] not in ("equivalent", "not_equivalent") and res.get("reason"):
            print(f"{'':>22}{res['reason'][:150]}", flush=True)


if __name__ == "__main__":
    main()
