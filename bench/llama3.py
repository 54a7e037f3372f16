"""A Llama 3 training step, single-device and DP x PP x TP, with sizes as parameters.

The decoder of TrainVerify's benchmark (shared/reference/paper.md, sections 8.2-8.3): RMSNorm,
multi-head attention with rotary position embeddings (RoPE) and a causal mask, a SwiGLU
feed-forward network, an output head, cross-entropy against one-hot targets, SGD. It is the
decoder of examples/jax/llama.py written for any sizes: the RoPE tables and the causal mask
are made once per step and shared by every layer (as a Llama implementation precomputes
`freqs_cis` once), not once per call.

- `train_step(cfg)`: the specification, one SGD step on the whole batch on one device.
- `parallel_step(cfg, bug, style)`: the same step as one `jax.shard_map` over a
  ("data", "stage", "model") mesh: Megatron tensor parallelism over "model" (attention heads
  and FFN units column-split, output projections row-split, psum of the partial outputs),
  a GPipe pipeline over "stage" (the layers split evenly, `cfg.micro` micro-batches passed on
  with `ppermute`, backward through its transpose), data parallelism over "data" (the batch
  split, the gradients of weights replicated over "data" / "stage" psum'd). Each device
  computes its *share* of the global loss (its micro-batch's mean / (micro * dp)). `style`
  (STYLES) is how the TP gradients are kept right: Megatron's f/g operators (default), JAX's
  check_vma, or per-TP-rank loss shares.
- `BUGS`: planted bugs, each refuted by a correct verifier.

Arguments are `jax.ShapeDtypeStruct`s (`param_shapes`, `batch_shapes`): nothing is
materialised, at any size.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

F32 = jnp.float32
MASKED = -jnp.inf  # score of a masked (future) position
AXES = ("data", "stage", "model")

# planted bugs (parallel_step(cfg, bug=...)); each must be refuted
BUGS = {
    "psum": "each stage's last layer (every layer with stack='scan'): its FFN output not "
    "psum'd over 'model'",
    "micro": "the loss share is not divided by the number of micro-batches",
    "one_layer": "one layer (global layer `bug_layer`, the last one if fewer) adds its update "
    "to the residual twice (with stack='scan' the scanned layer carries its index)",
    "one_device": "one device (the last of the first half of 'data', the last stage and the "
    "last of 'model': device 4,095 of 512 x 2 x 8) steps its copy of the final norm twice",
}


@dataclass(frozen=True)
class Config:
    batch: int = 32  # global batch
    seq: int = 128
    hidden: int = 128
    heads: int = 32
    ffn: int = 0  # SwiGLU hidden units; 0: 4 * hidden
    layers: int = 2
    vocab: int = 51200  # TrainVerify's Llama 3 plans
    dp: int = 2
    pp: int = 2
    tp: int = 2
    micro: int = 2  # micro-batches per data-parallel shard
    lr: float = 0.1  # not 1/8: a constant equal to a dimension's size keeps that dimension
    eps: float = 1e-5
    rope_theta: float = 500000.0  # Llama 3
    # how the layers are written (STACKS): a Python for over `w[i]`, or `jax.lax.scan` over
    # the stacked weights (spec and implementation alike)
    stack: str = "for"
    bug_layer: int = 17  # the global layer the "one_layer" bug is planted in

    @property
    def planted_layer(self) -> int:
        """The global layer the "one_layer" bug is in: `bug_layer`, or the last layer."""
        return min(self.bug_layer, self.layers - 1)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def ffn_units(self) -> int:
        return self.ffn or 4 * self.hidden

    def check(self) -> Config:
        assert self.hidden % self.heads == 0 and self.head_dim % 2 == 0, "RoPE: even head_dim"
        assert self.heads % self.tp == 0 and self.ffn_units % self.tp == 0, "TP split"
        assert self.layers % self.pp == 0, "layers split evenly over the stages"
        assert self.batch % (self.dp * self.micro) == 0, "micro-batches of the DP shards"
        assert self.stack in STACKS, f"stack: one of {sorted(STACKS)}"
        return self

    def label(self) -> str:
        return (
            f"L{self.layers} h{self.hidden} s{self.seq} H{self.heads} b{self.batch} "
            f"dp{self.dp}pp{self.pp}tp{self.tp}m{self.micro}"
            + ("" if self.stack == "for" else f" {self.stack}")
        )


# How the layers are written (`Config.stack`):
STACKS = {
    # TrainVerify's form: a Python for, layer i reading `w[i]` of each stacked weight; the
    # program arrives unrolled, one copy of the layer per layer
    "for": "Python for over w[i]",
    # the idiomatic JAX / MaxText form: `jax.lax.scan` over the stacked weights (in the
    # pipeline, each stage scans its own layers at every tick); one loop per scan
    "scan": "jax.lax.scan over the stacked weights",
}


# TrainVerify's benchmark configuration (paper section 8.2-8.3): hidden 128, seq 128, 32 heads,
# global batch 32, DP2 x PP2 x TP2, 2 micro-batches; at 2 and 32 layers
TRAINVERIFY = Config()
TOY = Config(batch=8, seq=8, hidden=16, heads=2, ffn=32, layers=2, vocab=16)


def with_(cfg: Config, **kw) -> Config:
    return replace(cfg, **kw).check()


# ---------------------------------------------------------------------------- shapes


def param_shapes(cfg: Config) -> dict:
    """The parameters as ShapeDtypeStructs; layer weights stacked on a leading layer axis."""
    L, d, f = cfg.layers, cfg.hidden, cfg.ffn_units

    def sds(*shape):
        return jax.ShapeDtypeStruct(shape, F32)

    return {
        "layers": {
            "attn_norm": sds(L, d),
            "wq": sds(L, d, d),
            "wk": sds(L, d, d),
            "wv": sds(L, d, d),
            "wo": sds(L, d, d),
            "mlp_norm": sds(L, d),
            "w_gate": sds(L, d, f),
            "w_up": sds(L, d, f),
            "w_down": sds(L, f, d),
        },
        "final_norm": sds(d),
        "head": sds(d, cfg.vocab),
    }


def batch_shapes(cfg: Config) -> dict:
    """Embedded tokens and one-hot next-token targets."""
    return {
        "x": jax.ShapeDtypeStruct((cfg.batch, cfg.seq, cfg.hidden), F32),
        "targets": jax.ShapeDtypeStruct((cfg.batch, cfg.seq, cfg.vocab), F32),
    }


def example_args(cfg: Config) -> tuple[dict, dict]:
    return param_shapes(cfg), batch_shapes(cfg)


# ---------------------------------------------------------------------------- the model


def rope_tables(cfg: Config):
    """cos and sin of the rotation angles, (seq, head_dim / 2), made once per step: positions
    from `jnp.arange` (an iota, so the sequence shrinks with shape reduction), frequencies a
    numpy constant (the head dimension keeps its size)."""
    half = cfg.head_dim // 2
    freqs = 1.0 / (cfg.rope_theta ** (np.arange(half, dtype=np.float64) / half))
    angles = jnp.arange(cfg.seq, dtype=F32)[:, None] * freqs.astype(np.float32)
    return jnp.cos(angles), jnp.sin(angles)


def causal_mask(cfg: Config):
    return jnp.tril(jnp.ones((cfg.seq, cfg.seq), dtype=bool))


def rms_norm(x, w, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, cos, sin):
    """Rotate the pairs (first half, second half) of each head of x (batch, seq, heads, hd)."""
    half = x.shape[-1] // 2
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def attention(x, p, tables, cfg: Config):
    """Causal multi-head attention; the heads are those of the weights (all of them, or this
    device's share under tensor parallelism). Returns the output projection (a partial sum
    over heads when the heads are split)."""
    cos, sin, causal = tables
    b, s, _ = x.shape
    hd = cfg.head_dim
    q = rope((x @ p["wq"]).reshape(b, s, -1, hd), cos, sin)
    k = rope((x @ p["wk"]).reshape(b, s, -1, hd), cos, sin)
    v = (x @ p["wv"]).reshape(b, s, -1, hd)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.float32(np.sqrt(hd))
    scores = jnp.where(causal, scores, MASKED)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, -1)
    return out @ p["wo"]


def ffn(x, p):
    """SwiGLU; a partial sum over the FFN units when they are split."""
    return (jax.nn.silu(x @ p["w_gate"]) * (x @ p["w_up"])) @ p["w_down"]


def _same(y):
    return y


def block(x, p, tables, cfg: Config, enter=_same, reduce=_same):
    """One decoder layer. Under tensor parallelism `enter` marks where the replicated
    activation enters a TP region and `reduce` sums the region's partial output."""
    x = x + reduce(attention(enter(rms_norm(x, p["attn_norm"], cfg.eps)), p, tables, cfg))
    return x + reduce(ffn(enter(rms_norm(x, p["mlp_norm"], cfg.eps)), p))


def layer(params, i):
    return jax.tree_util.tree_map(lambda a: a[i], params["layers"])


def cross_entropy(params, x, targets, cfg: Config):
    """Mean cross-entropy of the next-token distribution over the tokens of x."""
    logits = rms_norm(x, params["final_norm"], cfg.eps) @ params["head"]
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.sum(targets * logp, axis=-1))


def scanned(x, stacked, one_layer):
    """`one_layer(x, p)` over the layers of `stacked` (a pytree of stacked weights)."""
    x, _ = jax.lax.scan(lambda h, p: (one_layer(h, p), None), x, stacked)
    return x


def loss_fn(params, batch, cfg: Config):
    tables = (*rope_tables(cfg), causal_mask(cfg))
    x = batch["x"]
    if cfg.stack == "scan":
        x = scanned(x, params["layers"], lambda h, p: block(h, p, tables, cfg))
    else:
        for i in range(cfg.layers):
            x = block(x, layer(params, i), tables, cfg)
    return cross_entropy(params, x, batch["targets"], cfg)


def sgd(params, grads, lr):
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)


def train_step(cfg: Config):
    """The specification: one SGD step on the whole batch, on one device."""

    def step(params, batch):
        loss, grads = jax.value_and_grad(functools.partial(loss_fn, cfg=cfg))(params, batch)
        return sgd(params, grads, cfg.lr), loss

    step.__name__ = step.__qualname__ = "train_step"
    return step


# ---------------------------------------------------------------------------- DP x PP x TP

COLUMNS = ("wq", "wk", "wv", "w_gate", "w_up")  # output units (heads, FFN units) over "model"
ROWS = ("wo", "w_down")  # input units over "model"


def param_specs(cfg: Config) -> dict:
    """Layers over "stage" along the layer axis, Megatron splits over "model"; the final norm
    and the head replicated."""
    layers = {k: P("stage") for k in param_shapes(cfg)["layers"]}
    layers.update({k: P("stage", None, "model") for k in COLUMNS})
    layers.update({k: P("stage", "model", None) for k in ROWS})
    return {"layers": layers, "final_norm": P(), "head": P()}


def replicated_axes(spec: P, axes: tuple[str, ...] = AXES) -> tuple[str, ...]:
    """The mesh axes (of `axes`) a weight with this PartitionSpec is replicated over."""
    used = {
        a
        for part in spec
        if part is not None
        for a in (part if isinstance(part, tuple) else (part,))
    }
    return tuple(a for a in axes if a not in used)


def mesh(cfg: Config) -> Mesh:
    n = cfg.dp * cfg.pp * cfg.tp
    return Mesh(np.array(jax.devices()[:n]).reshape(cfg.dp, cfg.pp, cfg.tp), AXES)


# How the step keeps the gradients right under tensor parallelism (`parallel_step(style=)`):
STYLES = {
    # Megatron-LM's conjugate operators written with jax.custom_vjp, check_vma=False: "f"
    # (identity forward, psum backward) where the replicated activation enters a layer's TP
    # region, "g" (psum forward, identity backward) where its partial output leaves it. Every
    # TP rank holds the whole loss and whole gradients of the replicated weights.
    "megatron": "custom_vjp f/g operators, check_vma=False",
    # JAX's default check_vma=True: plain psum; JAX knows which values vary over which axes,
    # transposes psum to pvary, and sums the gradient of every weight replicated over an
    # axis (the transpose of its implicit pvary is a psum): no gradient sync in the step.
    "vma": "plain psum, check_vma=True (JAX's default)",
    # check_vma=False with plain psum (whose transpose is a psum): every device, each TP rank
    # included, computes a share of the loss (mean / (micro * dp * tp)), and the step psums
    # each gradient over the axes its weight is replicated over (docs/jax.md's advice).
    "shares": "plain psum, check_vma=False, loss shares over dp * tp",
}


@jax.custom_vjp
def copy_to_tp(x):
    """Megatron's f: the identity; the backward sums the TP ranks' partial cotangents."""
    return x


copy_to_tp.defvjp(lambda x: (x, None), lambda _, g: (jax.lax.psum(g, "model"),))


@jax.custom_vjp
def reduce_from_tp(x):
    """Megatron's g: the sum of the TP ranks' partial outputs; the backward is the identity."""
    return jax.lax.psum(x, "model")


reduce_from_tp.defvjp(lambda x: (jax.lax.psum(x, "model"), None), lambda _, g: (g,))


def pipeline_loss(params, batch, cfg: Config, bug: str | None, style: str):
    """This device's share of the global loss: a GPipe forward over "stage" (at tick t stage s
    runs its layers on micro-batch t - s; stage 0 reads the micro-batches, every other stage
    what its predecessor sent at the previous tick), the last stage adding each finished
    micro-batch's mean cross-entropy / (micro * dp) (/ tp as well in the "shares" style)."""
    stage = jax.lax.axis_index("stage")
    tables = (*rope_tables(cfg), causal_mask(cfg))
    per_stage = cfg.layers // cfg.pp
    mb = batch["x"].shape[0] // cfg.micro
    xs = batch["x"].reshape(cfg.micro, mb, *batch["x"].shape[1:])
    ts = batch["targets"].reshape(cfg.micro, mb, *batch["targets"].shape[1:])
    shares = cfg.micro * cfg.dp * (cfg.tp if style == "shares" else 1)
    if bug == "micro":
        shares //= cfg.micro  # BUG: micro: the micro-batch means are not scaled by 1/micro

    if style == "megatron":
        enter, reduce = copy_to_tp, reduce_from_tp
    else:
        enter, reduce = (lambda y: y), (lambda y: jax.lax.psum(y, "model"))

    def buggy_block(x, p):  # BUG: psum: the FFN's partial output not summed over "model"
        x = x + reduce(attention(enter(rms_norm(x, p["attn_norm"], cfg.eps)), p, tables, cfg))
        return x + ffn(enter(rms_norm(x, p["mlp_norm"], cfg.eps)), p)

    bug_stage, bug_local = divmod(cfg.planted_layer, per_stage)

    def counted_block(carry, p):  # the scanned layer with its index i in this stage
        x, i = carry
        y = block(x, p, tables, cfg, enter, reduce)
        hit = (stage == bug_stage) & (i == bug_local)
        y = jnp.where(hit, y + (y - x), y)  # BUG: one_layer: layer K's update added twice
        return (y, i + 1), None

    def stage_layers(x):
        if cfg.stack == "scan":  # this stage's layers (the local slice of the stack)
            if bug == "psum":  # every layer of the stage: a scan has one body
                return scanned(x, params["layers"], buggy_block)
            if bug == "one_layer":
                (x, _), _ = jax.lax.scan(counted_block, (x, 0), params["layers"])
                return x
            return scanned(
                x, params["layers"], lambda h, p: block(h, p, tables, cfg, enter, reduce)
            )
        for i in range(per_stage):
            p = layer(params, i)
            if bug == "one_layer" and i == bug_local:
                y = block(x, p, tables, cfg, enter, reduce)
                x = jnp.where(stage == bug_stage, y + (y - x), y)  # BUG: one_layer
            elif bug == "psum" and i == per_stage - 1:
                x = x + reduce(
                    attention(enter(rms_norm(x, p["attn_norm"], cfg.eps)), p, tables, cfg)
                )
                x = x + ffn(enter(rms_norm(x, p["mlp_norm"], cfg.eps)), p)  # BUG: psum: not summed
            else:
                x = block(x, p, tables, cfg, enter, reduce)
        return x

    state = jnp.zeros_like(xs[0])
    loss = 0.0
    forward = [(s, s + 1) for s in range(cfg.pp - 1)]
    for t in range(cfg.micro + cfg.pp - 1):
        inp = jnp.where(stage == 0, xs[min(t, cfg.micro - 1)], state)
        out = stage_layers(inp)
        m = t - (cfg.pp - 1)  # the micro-batch the last stage finishes at this tick
        if 0 <= m < cfg.micro:
            share = cross_entropy(params, out, ts[m], cfg) / shares
            loss = loss + jnp.where(stage == cfg.pp - 1, share, 0.0)
        if t < cfg.micro + cfg.pp - 2:
            state = jax.lax.ppermute(out, "stage", forward)
    return loss


def stepped_twice_on_one_device(new: dict, grads: dict, cfg: Config) -> dict:
    """BUG one_device: the device at data = dp / 2 - 1, the last stage and the last TP rank
    (4,095 of 512 x 2 x 8) steps its copy of the final norm twice; every other device's
    copy is right."""
    here = jax.lax.axis_index("data") == cfg.dp // 2 - 1
    here = here & (jax.lax.axis_index("stage") == cfg.pp - 1)
    here = here & (jax.lax.axis_index("model") == cfg.tp - 1)
    stepped = new["final_norm"] - cfg.lr * grads["final_norm"]  # BUG: one_device
    return {**new, "final_norm": jnp.where(here, stepped, new["final_norm"])}


def parallel_step(cfg: Config, bug: str | None = None, style: str = "megatron"):
    """The train step as a shard_map over the ("data", "stage", "model") mesh (see STYLES)."""
    assert style in STYLES and (bug is None or bug in BUGS)
    specs = param_specs(cfg)

    def body(params, batch):
        new, loss, grads = synced_step(params, batch)
        if bug == "one_device":
            new = stepped_twice_on_one_device(new, grads, cfg)
        return new, loss

    def synced_step(params, batch):
        """(this device's updated parameters, the total loss, the synced gradients)."""
        loss, grads = jax.value_and_grad(pipeline_loss)(params, batch, cfg, bug, style)
        if style == "vma":  # JAX summed the gradients of replicated weights
            return sgd(params, grads, cfg.lr), jax.lax.psum(loss, ("data", "stage")), grads
        # a weight replicated over an axis got a share of its gradient on every device there
        # (over "model" too with loss shares; Megatron's f already summed those)
        skip = () if style == "shares" else ("model",)

        def sync(g, spec):
            return jax.lax.psum(g, tuple(a for a in replicated_axes(spec) if a not in skip))

        grads = jax.tree_util.tree_map(sync, grads, specs)
        total = jax.lax.psum(loss, tuple(a for a in AXES if a not in skip))
        return sgd(params, grads, cfg.lr), total, grads

    data = P("data")
    step = jax.shard_map(
        body,
        mesh=mesh(cfg),
        in_specs=(specs, {"x": data, "targets": data}),
        out_specs=(specs, P()),
        check_vma=style == "vma",
    )
    step.__name__ = step.__qualname__ = "parallel_step"
    return step
