"""A tiny Llama-style decoder and its training step: the single-device specification that
the parallel versions in this folder are verified against.

RMSNorm, rotary position embeddings (RoPE), grouped-query attention (GQA) with a causal
mask, a SwiGLU MLP, tied-free output head, cross-entropy against one-hot targets, SGD.
Dimensions are tiny on purpose: tv proves the computation for every input, so the proof
does not need realistic sizes (the structure is what matters).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

F32 = jnp.float32
MASKED = -jnp.inf  # score of a masked (future) position


@dataclass(frozen=True)
class Config:
    batch: int = 4
    seq: int = 4
    dim: int = 8
    heads: int = 4  # query heads
    kv_heads: int = 2  # grouped-query attention: each kv head serves heads // kv_heads
    head_dim: int = 2
    ffn: int = 8
    layers: int = 1
    vocab: int = 8
    lr: float = 0.1
    eps: float = 1e-5


CFG = Config()


def param_shapes(cfg: Config = CFG) -> dict:
    """The parameter pytree as ShapeDtypeStructs (layers stacked on a leading axis)."""
    L, d, hd = cfg.layers, cfg.dim, cfg.head_dim

    def sds(*shape):
        return jax.ShapeDtypeStruct(shape, F32)

    return {
        "layers": {
            "attn_norm": sds(L, d),
            "wq": sds(L, d, cfg.heads * hd),
            "wk": sds(L, d, cfg.kv_heads * hd),
            "wv": sds(L, d, cfg.kv_heads * hd),
            "wo": sds(L, cfg.heads * hd, d),
            "mlp_norm": sds(L, d),
            "w_gate": sds(L, d, cfg.ffn),
            "w_up": sds(L, d, cfg.ffn),
            "w_down": sds(L, cfg.ffn, d),
        },
        "final_norm": sds(d),
        "head": sds(d, cfg.vocab),
    }


def batch_shapes(cfg: Config = CFG) -> dict:
    """Inputs are embedded tokens (the embedding lookup is a gather: see llama_tokens.py)
    and one-hot next-token targets."""
    return {
        "x": jax.ShapeDtypeStruct((cfg.batch, cfg.seq, cfg.dim), F32),
        "targets": jax.ShapeDtypeStruct((cfg.batch, cfg.seq, cfg.vocab), F32),
    }


def rms_norm(x, w, eps=CFG.eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, offset=0):
    """Rotate pairs (first half, second half) of each head by position-dependent angles.
    `offset` is the position of x's first row (sequence parallel shards)."""
    seq, half = x.shape[1], x.shape[-1] // 2
    freqs = 1.0 / (10000.0 ** (np.arange(half, dtype=np.float32) / half))
    angles = (np.arange(seq, dtype=np.float32) + offset)[:, None] * freqs
    # precomputed tables (constants): XLA would fold jnp.cos of a constant in float32
    cos, sin = np.cos(angles)[None, :, None, :], np.sin(angles)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def attention(x, p, cfg: Config = CFG):
    """Causal grouped-query attention on x (batch, seq, dim); heads follow the weights."""
    b, s, _ = x.shape
    hd = cfg.head_dim
    q = (x @ p["wq"]).reshape(b, s, -1, hd)
    k = (x @ p["wk"]).reshape(b, s, -1, hd)
    v = (x @ p["wv"]).reshape(b, s, -1, hd)
    q, k = rope(q), rope(k)
    group = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd).astype(np.float32)
    causal = np.tril(np.ones((s, s), bool))
    scores = jnp.where(causal, scores, MASKED)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, -1)
    return out @ p["wo"]


def swiglu(x, p):
    return (jax.nn.silu(x @ p["w_gate"]) * (x @ p["w_up"])) @ p["w_down"]


def block(x, p, cfg: Config = CFG):
    x = x + attention(rms_norm(x, p["attn_norm"]), p, cfg)
    return x + swiglu(rms_norm(x, p["mlp_norm"]), p)


def layer(params, i):
    return jax.tree_util.tree_map(lambda a: a[i], params["layers"])


def forward(params, x, cfg: Config = CFG):
    """Logits (batch, seq, vocab); layers unrolled (see llama_scan.py for lax.scan)."""
    for i in range(cfg.layers):
        x = block(x, layer(params, i), cfg)
    return rms_norm(x, params["final_norm"]) @ params["head"]


def loss_fn(params, batch, cfg: Config = CFG):
    """Mean cross-entropy of the next-token distribution against one-hot targets."""
    logp = jax.nn.log_softmax(forward(params, batch["x"], cfg), axis=-1)
    return -jnp.mean(jnp.sum(batch["targets"] * logp, axis=-1))


def sgd(params, grads, lr=CFG.lr):
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)


def train_step(params, batch):
    """The specification: one SGD step on the whole batch, on one device."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return sgd(params, grads), loss
