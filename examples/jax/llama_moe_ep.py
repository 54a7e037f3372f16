"""Expert parallel training step: a decoder layer whose MLP is a mixture of 4 SwiGLU
experts, the experts split over an "expert" axis of 4 devices, the batch too (one sequence
per device). Each device packs its tokens into per-expert capacity slots, `all_to_all`
dispatches every expert's slots to the device that holds it, the expert runs, and a second
`all_to_all` combines the results back to the tokens' device.

Routing: the dispatch is a one-hot (token, expert, slot) mask given with the batch (top-1
with a fixed capacity, decided by the data pipeline: tv's terms cannot branch on argmax of
input-dependent scores cheaply); the combine weights are the router's softmax probabilities,
so the router is trained.

    python examples/jax/llama_moe_ep.py         # proved
    python examples/jax/llama_moe_ep.py --bug   # refuted at the line marked BUG
"""

from __future__ import annotations

import sys

import common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import llama  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from tv_ir.frontends.jax import Report, verify  # first: asks XLA for 8 CPU devices

EXPERTS = 4  # one per device
CAPACITY = 2  # slots per (sequence, expert)
CFG = llama.CFG
COMBINE = "bsec,bse,becd->bsd"  # weighted sum of each token's slots
EXPERT_WEIGHTS = ("w_gate", "w_up", "w_down")


def param_shapes() -> dict:
    """llama's one-layer parameters with the MLP replaced by a router and stacked experts."""
    params = llama.param_shapes(CFG)
    layers = {k: v for k, v in params["layers"].items() if k not in EXPERT_WEIGHTS}
    d, f = CFG.dim, CFG.ffn
    params["layers"] = layers | {"router": jax.ShapeDtypeStruct((1, d, EXPERTS), llama.F32)}
    params["experts"] = {
        "w_gate": jax.ShapeDtypeStruct((EXPERTS, d, f), llama.F32),
        "w_up": jax.ShapeDtypeStruct((EXPERTS, d, f), llama.F32),
        "w_down": jax.ShapeDtypeStruct((EXPERTS, f, d), llama.F32),
    }
    return params


def batch_shapes() -> dict:
    b, s = CFG.batch, CFG.seq
    dispatch = jax.ShapeDtypeStruct((b, s, EXPERTS, CAPACITY), llama.F32)
    return llama.batch_shapes(CFG) | {"dispatch": dispatch}


def experts_swiglu(slots, experts):
    """Every expert on its own slots, batched over the expert axis: slots (b, E, C, d)."""
    gate = jnp.einsum("becd,edf->becf", slots, experts["w_gate"])
    up = jnp.einsum("becd,edf->becf", slots, experts["w_up"])
    return jnp.einsum("becf,efd->becd", jax.nn.silu(gate) * up, experts["w_down"])


def moe(x, router, experts, dispatch):
    """The single-device mixture: x (b, s, d), dispatch (b, s, E, C) one-hot slots."""
    probs = jax.nn.softmax(x @ router, axis=-1)  # (b, s, E)
    slots = jnp.einsum("bsec,bsd->becd", dispatch, x)
    return jnp.einsum(COMBINE, dispatch, probs, experts_swiglu(slots, experts))


def loss_fn(params, batch, mixture=moe):
    """llama's one-layer decoder with `mixture` as its MLP, mean cross-entropy."""
    p = llama.layer(params, 0)
    x = batch["x"]
    x = x + llama.attention(llama.rms_norm(x, p["attn_norm"]), p, CFG)
    h = llama.rms_norm(x, p["mlp_norm"])
    x = x + mixture(h, p["router"], params["experts"], batch["dispatch"])
    logits = llama.rms_norm(x, params["final_norm"]) @ params["head"]
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.sum(batch["targets"] * logp, axis=-1))


def train_step(params, batch):
    """The specification: one SGD step on one device."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return llama.sgd(params, grads), loss


def ep_moe(bug: bool):
    """The mixture inside shard_map: this device's sequence, its own expert."""

    def mixture(x, router, experts, dispatch):
        probs = jax.nn.softmax(x @ router, axis=-1)
        slots = jnp.einsum("bsec,bsd->becd", dispatch, x)  # (1, E, C, d): slots by expert
        mine = jax.lax.all_to_all(slots, "expert", 1, 0, tiled=True)  # (E, 1, C, d): my expert's
        out = experts_swiglu(mine, experts)
        if bug:  # this device's expert results taken as its own sequence's
            return jnp.einsum(COMBINE, dispatch, probs, out.reshape(slots.shape))  # BUG: no combine
        back = jax.lax.all_to_all(out, "expert", 0, 1, tiled=True)  # back to their sequence
        return jnp.einsum(COMBINE, dispatch, probs, back)

    return mixture


def param_specs() -> dict:
    specs = jax.tree_util.tree_map(lambda _: P(), param_shapes())
    specs["experts"] = {k: P("expert") for k in EXPERT_WEIGHTS}
    return specs


def ep_step(bug: bool = False):
    specs = param_specs()
    devices = EXPERTS

    def local_loss(params, batch):
        return loss_fn(params, batch, ep_moe(bug)) / devices  # this shard's share

    def body(params, batch):
        loss, grads = jax.value_and_grad(local_loss)(params, batch)
        # replicated weights saw only this device's tokens; each expert's gradient already
        # holds every device's tokens (the transpose of the dispatch all_to_all)
        grads = jax.tree_util.tree_map(
            lambda g, s: jax.lax.psum(g, "expert") if s == P() else g, grads, specs
        )
        return llama.sgd(params, grads), jax.lax.psum(loss, "expert")

    return jax.shard_map(
        body,
        mesh=common.mesh((devices,), ("expert",)),
        in_specs=(specs, P("expert")),
        out_specs=(specs, P()),
        check_vma=False,
    )


def verify_example(bug: bool = False, **options) -> Report:
    return verify(ep_step(bug), param_shapes(), batch_shapes(), spec=train_step, **options)


if __name__ == "__main__":
    sys.exit(common.run(__doc__, verify_example))
