"""A Llama-3-405B-shaped training step: grouped-query attention, AdamW, and DP x FSDP x PP x TP
with Megatron sequence parallelism, as one `jax.shard_map` (issue #10's last done-when row).

    python bench/llama405b.py [--layers 2] [--toy] [--optimizer sgd] [--batch B] [--bug NAME]
                              [--stack scan] [--bug-layer K] [--time-limit S]
                              [--memory-limit MB] [--witness-per-class] [--mesh D,F,P,T]

The model is bench/llama3.py's decoder (RMSNorm, RoPE, causal softmax attention, SwiGLU, a
cross-entropy head on one-hot targets) with Llama 3 405B's sizes: hidden 16384, 128 query
heads sharing 8 key/value heads (head_dim 128), FFN 53248, vocabulary 128256, sequence 8192,
126 layers. The optimiser is AdamW (moments m and v, bias correction at step `count`, decoupled
weight decay).

- `train_step(cfg)`: the specification, one AdamW step on the whole batch on one device.
- `parallel_step(cfg, bug)`: the same step on a ("data", "fsdp", "stage", "model") mesh:
  - data parallelism over "data" and "fsdp" (the batch split over both);
  - FSDP over "fsdp": every weight matrix stored split along its input dimension and
    all-gathered before use (the all-gather's transpose reduce-scatters its gradient); AdamW's
    moments live with the shard;
  - a GPipe pipeline over "stage" (bench/llama3.py's schedule, `cfg.micro` micro-batches);
  - Megatron tensor parallelism over "model" (heads and FFN units; K/V heads split too) with
    sequence parallelism: between the TP regions activations are split along the sequence
    over "model"; a region starts with an all-gather along the sequence and ends with a
    reduce-scatter (each other's transposes), so norms and residuals run on sequence shards.
  Every device computes the loss of its tokens / (number of token shards).
- `BUGS`: planted bugs, each refuted by a correct verifier.

Arguments are `jax.ShapeDtypeStruct`s: nothing is materialised, at any size.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from tv_ir.xla.partitioner import ensure_host_devices  # noqa: E402

ensure_host_devices(16)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import llama3 as base  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

F32 = jnp.float32
AXES = ("data", "fsdp", "stage", "model")
BUGS = {
    "kv_group": "grouped-query attention pairs query head h with K/V head h % kv_heads "
    "instead of h // group",
    "sp_gather": "attention's sequence all-gather over 'model' is skipped on the last layer "
    "of each stage: each rank attends within its own sequence shard",
    "adam_bias": "AdamW's second-moment bias correction uses beta1",
    "one_layer": "one layer (global layer `bug_layer`, 17 by default) adds its update to the "
    "residual twice (`--stack scan`: the scanned layer carries its index)",
}


@dataclass(frozen=True)
class Config:
    batch: int = 8  # global batch
    seq: int = 8192
    hidden: int = 16384
    heads: int = 128
    kv_heads: int = 8
    ffn: int = 53248
    layers: int = 126
    vocab: int = 128256
    dp: int = 2
    fsdp: int = 2
    pp: int = 2
    tp: int = 2
    micro: int = 2  # micro-batches per data shard
    lr: float = 3e-4
    b1: float = 0.9
    b2: float = 0.95
    adam_eps: float = 1e-8
    weight_decay: float = 0.1
    eps: float = 1e-5  # RMSNorm
    optimizer: str = "adamw"  # or "sgd" (no state used)
    rope_theta: float = 500000.0
    # how the layers are written (bench/llama3.py STACKS): a Python for over `w[i]`, or
    # `jax.lax.scan` over the stacked weights (spec and each pipeline stage alike)
    stack: str = "for"
    bug_layer: int = 17  # the global layer the "one_layer" bug is planted in (if it exists)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def ffn_units(self) -> int:
        return self.ffn

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    def check(self) -> Config:
        assert self.hidden % self.heads == 0 and self.head_dim % 2 == 0, "RoPE: even head_dim"
        assert self.heads % self.kv_heads == 0, "query heads share K/V heads evenly"
        assert self.kv_heads % self.tp == 0 and self.ffn % self.tp == 0, "TP split"
        assert self.seq % self.tp == 0, "sequence parallelism splits the sequence over TP"
        assert self.hidden % self.fsdp == 0 and self.ffn % self.fsdp == 0, "FSDP split"
        assert self.layers % self.pp == 0, "layers split evenly over the stages"
        assert self.batch % (self.dp * self.fsdp * self.micro) == 0, "micro-batches"
        assert self.stack in base.STACKS, f"stack: one of {sorted(base.STACKS)}"
        assert 0 <= self.bug_layer, "the one_layer bug's layer"
        return self

    @property
    def devices(self) -> int:
        return self.dp * self.fsdp * self.pp * self.tp

    def label(self) -> str:
        return (
            f"L{self.layers} h{self.hidden} H{self.heads}/{self.kv_heads} f{self.ffn} "
            f"v{self.vocab} s{self.seq} b{self.batch} "
            f"dp{self.dp}fsdp{self.fsdp}pp{self.pp}tp{self.tp}m{self.micro}"
            + ("" if self.stack == "for" else f" {self.stack}")
        )


LLAMA_405B = Config()
TOY = Config(batch=8, seq=8, hidden=32, heads=8, kv_heads=4, ffn=48, layers=2, vocab=24)


def with_(cfg: Config, **kw) -> Config:
    return replace(cfg, **kw).check()


# ---------------------------------------------------------------------------- shapes

COLUMNS = ("wq", "wk", "wv", "w_gate", "w_up")  # output units over "model"
ROWS = ("wo", "w_down")  # input units over "model"


def param_shapes(cfg: Config) -> dict:
    L, d, f, kv = cfg.layers, cfg.hidden, cfg.ffn, cfg.kv_heads * cfg.head_dim

    def sds(*shape):
        return jax.ShapeDtypeStruct(shape, F32)

    return {
        "layers": {
            "attn_norm": sds(L, d),
            "wq": sds(L, d, d),
            "wk": sds(L, d, kv),
            "wv": sds(L, d, kv),
            "wo": sds(L, d, d),
            "mlp_norm": sds(L, d),
            "w_gate": sds(L, d, f),
            "w_up": sds(L, d, f),
            "w_down": sds(L, f, d),
        },
        "final_norm": sds(d),
        "head": sds(d, cfg.vocab),
    }


def example_args(cfg: Config) -> tuple:
    """(params, AdamW state, batch) as ShapeDtypeStructs."""
    params = param_shapes(cfg)
    state = {
        "m": params,
        "v": params,
        "count": jax.ShapeDtypeStruct((), jnp.int32),
    }
    batch = {
        "x": jax.ShapeDtypeStruct((cfg.batch, cfg.seq, cfg.hidden), F32),
        "targets": jax.ShapeDtypeStruct((cfg.batch, cfg.seq, cfg.vocab), F32),
    }
    return params, state, batch


# ---------------------------------------------------------------------------- the model


def attention(x, p, tables, cfg: Config, bug: str | None = None):
    """Causal grouped-query attention over the heads of the weights (all, or this TP rank's:
    its query heads and the K/V heads they share)."""
    cos, sin, causal = tables
    b, s, _ = x.shape
    hd = cfg.head_dim
    q = base.rope((x @ p["wq"]).reshape(b, s, -1, hd), cos, sin)
    k = base.rope((x @ p["wk"]).reshape(b, s, -1, hd), cos, sin)
    v = (x @ p["wv"]).reshape(b, s, -1, hd)
    if bug == "kv_group":  # BUG: kv_group: query head h reads K/V head h % kv_heads
        k = jnp.tile(k, (1, 1, cfg.group, 1))
        v = jnp.tile(v, (1, 1, cfg.group, 1))
    else:  # query head h reads K/V head h // group
        k = jnp.repeat(k, cfg.group, axis=2)
        v = jnp.repeat(v, cfg.group, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.float32(np.sqrt(hd))
    scores = jnp.where(causal, scores, base.MASKED)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, -1)
    return out @ p["wo"]


def block(x, p, tables, cfg: Config, enter=base._same, leave=base._same, bug=None):
    x = x + leave(attention(enter(base.rms_norm(x, p["attn_norm"], cfg.eps)), p, tables, cfg, bug))
    return x + leave(base.ffn(enter(base.rms_norm(x, p["mlp_norm"], cfg.eps)), p))


def loss_fn(params, batch, cfg: Config, bug=None):
    tables = (*base.rope_tables(cfg), base.causal_mask(cfg))
    x = batch["x"]
    if cfg.stack == "scan":
        x = base.scanned(x, params["layers"], lambda h, p: block(h, p, tables, cfg, bug=bug))
    else:
        for i in range(cfg.layers):
            x = block(x, base.layer(params, i), tables, cfg, bug=bug)
    return base.cross_entropy(params, x, batch["targets"], cfg)


def adamw(params, grads, state, cfg: Config, bug=None):
    """One AdamW step (Loshchilov & Hutter): moments, bias correction at step count + 1,
    decoupled weight decay. Returns (params, state)."""
    t = (state["count"] + 1).astype(F32)
    c1 = 1 - cfg.b1**t
    c2 = 1 - (cfg.b1 if bug == "adam_bias" else cfg.b2) ** t  # BUG: adam_bias: beta1

    def moments(g, m, v):
        return cfg.b1 * m + (1 - cfg.b1) * g, cfg.b2 * v + (1 - cfg.b2) * g * g

    tree = jax.tree_util
    m, v = tree.tree_transpose(
        tree.tree_structure(params),
        tree.tree_structure((0, 0)),
        tree.tree_map(moments, grads, state["m"], state["v"]),
    )

    def update(p, m_, v_):
        return p - cfg.lr * ((m_ / c1) / (jnp.sqrt(v_ / c2) + cfg.adam_eps) + cfg.weight_decay * p)

    new = tree.tree_map(update, params, m, v)
    return new, {"m": m, "v": v, "count": state["count"] + 1}


def update(params, grads, state, cfg: Config, bug=None):
    """The optimiser step: AdamW, or plain SGD (`cfg.optimizer`; the state passes through)."""
    if cfg.optimizer == "sgd":
        return jax.tree_util.tree_map(lambda p, g: p - cfg.lr * g, params, grads), state
    return adamw(params, grads, state, cfg, bug)


def train_step(cfg: Config):
    """The specification: one AdamW step on the whole batch, on one device."""

    def step(params, state, batch):
        loss, grads = jax.value_and_grad(functools.partial(loss_fn, cfg=cfg))(params, batch)
        params, state = update(params, grads, state, cfg)
        return params, state, loss

    step.__name__ = step.__qualname__ = "train_step"
    return step


# ---------------------------------------------------------------------------- the mesh


def param_specs(cfg: Config) -> dict:
    """Layers over "stage"; weight matrices' input dimension over "fsdp" (FSDP); Megatron
    column/row splits over "model"; norms and the head replicated over "model"."""
    layers = {
        "attn_norm": P("stage"),
        "mlp_norm": P("stage"),
        **{k: P("stage", "fsdp", "model") for k in COLUMNS},
        **{k: P("stage", ("model", "fsdp"), None) for k in ROWS},
    }
    return {"layers": layers, "final_norm": P(), "head": P("fsdp", None)}


def mesh(cfg: Config):
    """The devices, or past the host's devices an `AbstractMesh` (JAX lowers a shard_map on
    it without devices; tv reads the program per device and reduces the mesh)."""
    if cfg.devices > len(jax.devices()):
        from jax.sharding import AbstractMesh

        return AbstractMesh((cfg.dp, cfg.fsdp, cfg.pp, cfg.tp), AXES)
    devs = np.array(jax.devices()[: cfg.devices]).reshape(cfg.dp, cfg.fsdp, cfg.pp, cfg.tp)
    return Mesh(devs, AXES)


def gather_fsdp(w, spec: P):
    """The whole weight (this TP rank's part) from the FSDP shards: an all-gather over "fsdp"
    along the dimension FSDP splits (its transpose reduce-scatters the gradient)."""
    for dim, part in enumerate(spec):
        parts = part if isinstance(part, tuple) else (part,)
        if "fsdp" in parts:
            return jax.lax.all_gather(w, "fsdp", axis=dim, tiled=True)
    return w


def sp_enter(x):
    """Into a TP region: the whole sequence from the "model" ranks' sequence shards."""
    return jax.lax.all_gather(x, "model", axis=1, tiled=True)


def sp_leave(x):
    """Out of a TP region: the sum of the ranks' partial outputs, split along the sequence."""
    return jax.lax.psum_scatter(x, "model", scatter_dimension=1, tiled=True)


def pipeline_loss(params, batch, cfg: Config, bug: str | None):
    """This device's share of the loss (bench/llama3.py's GPipe schedule): its tokens' mean
    cross-entropy / (micro * dp * fsdp * tp) for each micro-batch the last stage finishes."""
    stage = jax.lax.axis_index("stage")
    tables = (*base.rope_tables(cfg), base.causal_mask(cfg))
    per_stage = cfg.layers // cfg.pp
    mb = batch["x"].shape[0] // cfg.micro
    xs = batch["x"].reshape(cfg.micro, mb, *batch["x"].shape[1:])
    ts = batch["targets"].reshape(cfg.micro, mb, *batch["targets"].shape[1:])
    shares = cfg.micro * cfg.dp * cfg.fsdp * cfg.tp
    specs = param_specs(cfg)["layers"]
    layer_specs = {k: P(*s[1:]) for k, s in specs.items()}
    head = gather_fsdp(params["head"], param_specs(cfg)["head"])

    def scanned_layer(x, p):
        p = {k: gather_fsdp(w, layer_specs[k]) for k, w in p.items()}  # FSDP: per layer
        return block(x, p, tables, cfg, sp_enter, sp_leave, bug)

    bug_stage, bug_local = divmod(cfg.bug_layer, per_stage)

    def counted_layer(carry, p):  # the scanned layer with its index i in this stage
        x, i = carry
        y = scanned_layer(x, p)
        hit = (stage == bug_stage) & (i == bug_local)
        y = jnp.where(hit, y + (y - x), y)  # BUG: one_layer: layer K's update added twice
        return (y, i + 1), None

    def stage_layers(x):
        if cfg.stack == "scan":  # this stage's layers (the local slice of the stack)
            if bug == "one_layer":
                (x, _), _ = jax.lax.scan(counted_layer, (x, 0), params["layers"])
                return x
            return base.scanned(x, params["layers"], scanned_layer)
        assert bug != "one_layer", "one_layer: with --stack scan"
        for i in range(per_stage):
            p = base.layer(params, i)
            p = {k: gather_fsdp(w, layer_specs[k]) for k, w in p.items()}
            if bug == "sp_gather" and i == per_stage - 1:
                # BUG: sp_gather: attention within this rank's sequence shard (the tables cut
                # to its length), then summed over the heads' ranks
                local = tuple(
                    t[: x.shape[1], : x.shape[1]]
                    if t.ndim == 2 and t.shape[0] == t.shape[1]
                    else t[: x.shape[1]]
                    for t in tables
                )
                h = base.rms_norm(x, p["attn_norm"], cfg.eps)
                x = x + jax.lax.psum(attention(h, p, local, cfg), "model")
                x = x + sp_leave(base.ffn(sp_enter(base.rms_norm(x, p["mlp_norm"], cfg.eps)), p))
            else:
                x = block(x, p, tables, cfg, sp_enter, sp_leave, bug)
        return x

    # this device's sequence shard of each micro-batch
    tp_rank = jax.lax.axis_index("model")
    shard = cfg.seq // cfg.tp

    def seq_shard(a):
        return jax.lax.dynamic_slice_in_dim(a, tp_rank * shard, shard, axis=1)

    state = jnp.zeros_like(seq_shard(xs[0]))
    loss = 0.0
    forward = [(s, s + 1) for s in range(cfg.pp - 1)]
    final = {"final_norm": params["final_norm"], "head": head}
    for t in range(cfg.micro + cfg.pp - 1):
        inp = jnp.where(stage == 0, seq_shard(xs[min(t, cfg.micro - 1)]), state)
        out = stage_layers(inp)
        m = t - (cfg.pp - 1)
        if 0 <= m < cfg.micro:
            share = base.cross_entropy(final, out, seq_shard(ts[m]), cfg) / shares
            loss = loss + jnp.where(stage == cfg.pp - 1, share, 0.0)
        if t < cfg.micro + cfg.pp - 2:
            state = jax.lax.ppermute(out, "stage", forward)
    return loss


def parallel_step(cfg: Config, bug: str | None = None):
    """The train step as a shard_map over ("data", "fsdp", "stage", "model")."""
    assert bug is None or bug in BUGS
    specs = param_specs(cfg)

    def body(params, state, batch):
        loss, grads = jax.value_and_grad(pipeline_loss)(params, batch, cfg, bug)
        # a weight replicated over an axis got a share of its gradient on every device there
        grads = jax.tree_util.tree_map(
            lambda g, s: jax.lax.psum(g, base.replicated_axes(s, AXES)), grads, specs
        )
        params, state = update(params, grads, state, cfg, bug)
        return params, state, jax.lax.psum(loss, AXES)

    state_specs = {"m": specs, "v": specs, "count": P()}
    data = P(("data", "fsdp"))
    step = jax.shard_map(
        body,
        mesh=mesh(cfg),
        in_specs=(specs, state_specs, {"x": data, "targets": data}),
        out_specs=(specs, state_specs, P()),
        check_vma=False,
    )
    step.__name__ = step.__qualname__ = "parallel_step"
    return step


# ---------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--toy", action="store_true", help="toy sizes (runs at real size too)")
    ap.add_argument("--bug", choices=sorted(BUGS))
    ap.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    ap.add_argument("--batch", type=int, help="global batch (default 8)")
    ap.add_argument("--bug-layer", type=int, default=17, help="the one_layer bug's layer")
    ap.add_argument(
        "--stack", choices=sorted(base.STACKS), default="for", help="how the layers are written"
    )
    ap.add_argument("--time-limit", type=float, default=600)
    ap.add_argument("--memory-limit", type=float, default=6000)
    ap.add_argument("--no-reduce", action="store_true")
    ap.add_argument(
        "--mesh",
        help="DP,FSDP,PP,TP (default 2,2,2,2); e.g. 64,1,14,8: TrainVerify's 8,192-GPU plan "
        "(TP 8 x PP 16 x DP 64) with the stages 126 layers divide into",
    )
    ap.add_argument(
        "--witness-per-class",
        action="store_true",
        help="one shape witness per shrunk class (before: classes grown together)",
    )
    a = ap.parse_args()
    if a.witness_per_class:
        from tv_ir.passes import shape_reduction

        shape_reduction.WITNESS_GROUPS = False
    from tv_ir.frontends.jax import verify

    cfg = with_(TOY if a.toy else LLAMA_405B, layers=a.layers, optimizer=a.optimizer, stack=a.stack)
    cfg = with_(cfg, bug_layer=min(a.bug_layer, cfg.layers - 1))
    if a.mesh:
        dp, fsdp, pp, tp = (int(x) for x in a.mesh.split(","))
        # by default the smallest batch every data shard's micro-batches divide
        batch = a.batch or dp * fsdp * cfg.micro
        cfg = replace(cfg, dp=dp, fsdp=fsdp, pp=pp, tp=tp, batch=batch).check()
    if a.batch:
        cfg = with_(cfg, batch=a.batch)
    # a bug not planted at this config leaves the programs equal: say so rather than
    # report `equivalent` for a "bug"
    if a.bug == "sp_gather" and cfg.stack == "scan":
        ap.error("--bug sp_gather is planted in the Python-for stack only (--stack for)")
    if a.bug == "kv_group" and cfg.kv_heads // cfg.tp == 1:
        ap.error("--bug kv_group changes nothing when each TP rank holds one K/V head")
    t0 = time.perf_counter()
    report = verify(
        parallel_step(cfg, a.bug),
        *example_args(cfg),
        spec=train_step(cfg),
        time_limit=a.time_limit,
        memory_limit=a.memory_limit,
        reduce_shapes=not a.no_reduce,
    )
    seconds = time.perf_counter() - t0
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # the largest child's (the checks beside the proof; a fork shares the parent's pages
    # until written, so parent + child over-counts what the two held together)
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(report)
    phases = ", ".join(f"{k} {v:.1f}" for k, v in report.stats.seconds.items())
    print(
        f"\n{cfg.label()}: {report.verdict} in {seconds:.1f} s, peak {peak:.0f} MB, "
        f"largest child {child:.0f} MB ({phases})"
    )
    sys.exit(report.exit_code)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
