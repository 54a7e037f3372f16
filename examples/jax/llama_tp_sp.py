"""Megatron tensor parallel + sequence parallel training step on 2 devices ("model").

Attention heads (query and key/value heads together) and the SwiGLU hidden units are split
over "model"; between the blocks activations are split along the sequence. Each block
all-gathers the normed sequence, computes its heads / hidden units, and reduce-scatters
the partial output back to sequence shards (psum_scatter). Gradients of the replicated
norm and head weights are partial over the sequence and are summed.

    python examples/jax/llama_tp_sp.py         # proved
    python examples/jax/llama_tp_sp.py --bug   # refuted at the line marked BUG
"""

from __future__ import annotations

import sys

import common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import llama  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from tv_ir.frontends.jax import Report, verify  # first: asks XLA for 8 CPU devices

DEVICES = 2
COLUMNS = ("wq", "wk", "wv", "w_gate", "w_up")  # output units split over "model"
ROWS = ("wo", "w_down")  # input units split over "model"


def param_specs():
    layers = {k: P() for k in llama.param_shapes()["layers"]}
    layers.update({k: P(None, None, "model") for k in COLUMNS})
    layers.update({k: P(None, "model", None) for k in ROWS})
    return {"layers": layers, "final_norm": P(), "head": P()}


def gather_seq(h):
    return jax.lax.all_gather(h, "model", axis=1, tiled=True)


def scatter_seq(partial):
    return jax.lax.psum_scatter(partial, "model", scatter_dimension=1, tiled=True)


def tp_block(x, p):
    """x: this device's sequence shard; p: this device's heads and hidden units."""
    x = x + scatter_seq(llama.attention(gather_seq(llama.rms_norm(x, p["attn_norm"])), p))
    mlp = llama.swiglu(gather_seq(llama.rms_norm(x, p["mlp_norm"])), p)
    return x + scatter_seq(mlp)


def local_loss(params, batch):
    x = batch["x"]
    for i in range(llama.CFG.layers):
        x = tp_block(x, llama.layer(params, i))
    logits = llama.rms_norm(x, params["final_norm"]) @ params["head"]
    logp = jax.nn.log_softmax(logits, axis=-1)
    # the mean over this device's tokens, as a share of the mean over all tokens
    return -jnp.mean(jnp.sum(batch["targets"] * logp, axis=-1)) / DEVICES


def tp_sp_step(bug: bool = False):
    specs = param_specs()

    def body(params, batch):
        loss, grads = jax.value_and_grad(local_loss)(params, batch)
        if bug:
            grads = jax.lax.psum(grads, "model")  # BUG: also sums the split weights' gradients
        else:  # replicated weights saw only this device's tokens: sum their gradients
            grads = jax.tree_util.tree_map(
                lambda g, s: jax.lax.psum(g, "model") if s == P() else g, grads, specs
            )
        return llama.sgd(params, grads), jax.lax.psum(loss, "model")

    seq = P(None, "model")
    return jax.shard_map(
        body,
        mesh=common.mesh((DEVICES,), ("model",)),
        in_specs=(specs, {"x": seq, "targets": seq}),
        out_specs=(specs, P()),
        check_vma=False,
    )


def verify_example(bug: bool = False, **options) -> Report:
    return verify(
        tp_sp_step(bug),
        llama.param_shapes(),
        llama.batch_shapes(),
        spec=llama.train_step,
        **options,
    )


if __name__ == "__main__":
    sys.exit(common.run(__doc__, verify_example))
