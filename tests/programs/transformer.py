"""A tiny pre-norm transformer block in JAX: a spec, equivalent rewrites, and seeded bugs.

block(x) = x1 + MLP(LN2(x1)),  x1 = x + Attn(LN1(x))   (causal, 2 heads, gelu(tanh) MLP)

Every variant has the same signature: `(x, *params)` with the 12 per-layer parameters of
`PARAM_SHAPES` (repeated `depth` times for a stack), all float32.

Each seeded bug sits on one source line ending in a `# BUG: <variant>` marker, so the line
of the first diverging op can be checked against `bug_line(variant)`. The lines that differ
between variants are kept self-contained (all ops that change are created on that line), since
JAX records the innermost user frame of each op.

Masking uses `jnp.where(mask, scores, -inf)` (the usual JAX idiom): every row of a causal mask
keeps its diagonal, so no softmax row is all -inf and nothing is NaN. See `MASK_VALUE`.
"""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

BATCH, SEQ, D_MODEL, HEADS, D_MLP = 1, 4, 8, 2, 16
D_HEAD = D_MODEL // HEADS
EPS = 1e-5
MASK_VALUE = -jnp.inf  # a finite -1e9 works too; -inf is what jax.nn.dot_product_attention uses

PARAM_SHAPES = (
    ("ln1_g", (D_MODEL,)),
    ("ln1_b", (D_MODEL,)),
    ("wq", (D_MODEL, D_MODEL)),
    ("wk", (D_MODEL, D_MODEL)),
    ("wv", (D_MODEL, D_MODEL)),
    ("wo", (D_MODEL, D_MODEL)),
    ("ln2_g", (D_MODEL,)),
    ("ln2_b", (D_MODEL,)),
    ("w1", (D_MODEL, D_MLP)),
    ("b1", (D_MLP,)),
    ("w2", (D_MLP, D_MODEL)),
    ("b2", (D_MODEL,)),
)
X_SHAPE = (BATCH, SEQ, D_MODEL)

EQUIVALENT = ["fused_qkv", "split_mlp", "var_moments", "scale_q"]
BUGS = ["softmax_axis", "mask_off_by_one", "residual_sign", "transposed_wo", "ln_eps"]
VARIANTS = ["spec", *EQUIVALENT, *BUGS]
DESCRIPTIONS = {
    "spec": "reference pre-norm block",
    "fused_qkv": "concat(Wq, Wk, Wv), one matmul, then slice q/k/v",
    "split_mlp": "MLP W1 as two column blocks (concat), W2 as a sum of two row blocks",
    "var_moments": "LayerNorm variance as E[x^2] - m^2",
    "scale_q": "1/sqrt(d_head) applied to q instead of to the scores",
    "softmax_axis": "BUG: softmax over the query axis instead of the key axis",
    "mask_off_by_one": "BUG: causal mask lets each position see one future token",
    "residual_sign": "BUG: attention residual subtracted instead of added",
    "transposed_wo": "BUG: output projection uses Wo^T",
    "ln_eps": "BUG: LayerNorm epsilon 1e-6 instead of 1e-5",
}


def _layer_norm(x, g, b, v):
    m = jnp.mean(x, axis=-1, keepdims=True)
    if v == "var_moments":
        var = jnp.mean(x * x, axis=-1, keepdims=True) - m * m
    else:
        var = jnp.mean((x - m) * (x - m), axis=-1, keepdims=True)
    if v == "ln_eps":
        inv = jax.lax.rsqrt(var + 1e-6)  # BUG: ln_eps
    else:
        inv = jax.lax.rsqrt(var + EPS)
    return (x - m) * inv * g + b


def _attention(h, wq, wk, wv, wo, v):
    b, s, d = h.shape
    if v == "fused_qkv":
        qkv = h @ jnp.concatenate([wq, wk, wv], axis=1)
        q, k, val = qkv[..., :d], qkv[..., d : 2 * d], qkv[..., 2 * d :]
    else:
        q, k, val = h @ wq, h @ wk, h @ wv
    q = q.reshape(b, s, HEADS, D_HEAD)
    k = k.reshape(b, s, HEADS, D_HEAD)
    val = val.reshape(b, s, HEADS, D_HEAD)
    scale = 1.0 / math.sqrt(D_HEAD)
    if v == "scale_q":
        scores = jnp.einsum("bqhd,bkhd->bhqk", q * scale, k)
    else:
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * scale
    row = jax.lax.broadcasted_iota(jnp.int32, (s, s), 0)  # traced, so the mask ops carry
    col = jax.lax.broadcasted_iota(jnp.int32, (s, s), 1)  # this file's line numbers
    if v == "mask_off_by_one":
        scores = jnp.where(col <= row + 1, scores, MASK_VALUE)  # BUG: mask_off_by_one
    else:
        scores = jnp.where(col <= row, scores, MASK_VALUE)
    if v == "softmax_axis":
        p = jax.nn.softmax(scores, axis=-2)  # BUG: softmax_axis
    else:
        p = jax.nn.softmax(scores, axis=-1)
    o = jnp.einsum("bhqk,bkhd->bqhd", p, val).reshape(b, s, d)
    if v == "transposed_wo":
        return o @ wo.T  # BUG: transposed_wo
    return o @ wo


def _mlp(h, w1, b1, w2, b2, v):
    if v == "split_mlp":
        n = w1.shape[1] // 2
        u = jnp.concatenate([h @ w1[:, :n] + b1[:n], h @ w1[:, n:] + b1[n:]], axis=-1)
        a = jax.nn.gelu(u, approximate=True)
        return a[..., :n] @ w2[:n] + a[..., n:] @ w2[n:] + b2
    a = jax.nn.gelu(h @ w1 + b1, approximate=True)
    return a @ w2 + b2


def _layer(x, p, v):
    ln1_g, ln1_b, wq, wk, wv, wo, ln2_g, ln2_b, w1, b1, w2, b2 = p
    a = _attention(_layer_norm(x, ln1_g, ln1_b, v), wq, wk, wv, wo, v)
    if v == "residual_sign":
        x = x - a  # BUG: residual_sign
    else:
        x = x + a
    return x + _mlp(_layer_norm(x, ln2_g, ln2_b, v), w1, b1, w2, b2, v)


def stacked(depth: int, grad: bool = False, variant: str = "spec"):
    """The block repeated `depth` times (distinct params per layer) as `f(x, *params)`.

    With `grad`, `f` returns the gradients of sum(block(x)^2) w.r.t. x and every param.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")
    n = len(PARAM_SHAPES)

    def block(x, *params):
        for i in range(depth):
            x = _layer(x, params[i * n : (i + 1) * n], variant)
        return x

    if not grad:
        return block

    def loss(x, *params):
        y = block(x, *params)
        return jnp.sum(y * y)

    g = jax.grad(loss, argnums=tuple(range(1 + n * depth)))

    def block_grad(x, *params):
        return g(x, *params)

    return block_grad


def arg_shapes(depth: int = 1) -> list[tuple[int, ...]]:
    """Shapes of `(x, *params)` for a stack of `depth` blocks."""
    return [X_SHAPE] + [s for _ in range(depth) for _, s in PARAM_SHAPES]


def example_args(depth: int = 1, seed: int = 0, dtype=np.float32) -> list[np.ndarray]:
    """Random inputs of plausible scale (LayerNorm gains near 1, weights ~ 1/sqrt(fan_in))."""
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal(X_SHAPE)]
    for _ in range(depth):
        for name, shape in PARAM_SHAPES:
            if name.endswith("_g"):
                a = 1.0 + 0.1 * rng.standard_normal(shape)
            elif len(shape) == 1:
                a = 0.1 * rng.standard_normal(shape)
            else:
                a = rng.standard_normal(shape) / math.sqrt(shape[0])
            args.append(a)
    return [np.asarray(a, dtype) for a in args]


def lower(variant: str = "spec", grad: bool = False, depth: int = 1) -> str:
    """StableHLO text (with debug info: source file:line locations) of a variant."""
    specs = [jax.ShapeDtypeStruct(s, jnp.float32) for s in arg_shapes(depth)]
    return jax.jit(stacked(depth, grad, variant)).lower(*specs).as_text(debug_info=True)


def bug_line(variant: str) -> int:
    """1-based line number of the `# BUG: <variant>` marker in this file."""
    marker = f"# BUG: {variant}"
    hits = [
        i
        for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
        if line.rstrip().endswith(marker)
    ]
    if len(hits) != 1:
        raise ValueError(f"expected one {marker!r} marker, found {len(hits)}")
    return hits[0]
