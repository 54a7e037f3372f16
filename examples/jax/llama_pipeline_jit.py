"""Pipeline parallel training step under `jax.jit` with shardings (GSPMD pipelining, as
MaxText and Praxis write it): no shard_map. The decoder's layers stay stacked on a leading
axis sharded over "stage" (one layer per device); a state buffer holds one micro-batch per
stage, also sharded over "stage". At each tick every stage applies its layer to its slot
(`jax.vmap` over the stacked layers), stage 0's slot takes the next micro-batch, and the
buffer shifts one stage on (`jnp.roll`: XLA makes it a `collective_permute`). The last
stage's slot feeds the loss. XLA partitions the step; tv proves its per-device program
equal to the single-device SGD step.

    python examples/jax/llama_pipeline_jit.py         # proved (~4 s)
    python examples/jax/llama_pipeline_jit.py --bug   # refuted at the line marked BUG

Each device's values are the vmapped layer's on a [1, ...] slice of the stacked buffer:
the spec's values have no stage dimension, so tv matches them up to unit dimensions.
"""

from __future__ import annotations

import sys

import common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import llama  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from llama_pipeline import CFG, MICRO, example_args, param_specs, train_step  # noqa: E402
from tv_ir.frontends.jax import Report, verify  # first: asks XLA for 8 CPU devices

MESH = {"stage": CFG.layers}


def pipeline_loss(params, batch, bug: bool = False, cfg=CFG, micro=MICRO, batch_axes=None):
    """At tick t stage s holds micro-batch t - s: every stage runs its layer on its slot
    at once, then the slots move one stage on. The stages are the stacked layers
    (`cfg.layers`); `batch_axes`: mesh axes splitting each micro-batch's rows."""
    stages = cfg.layers
    xs = batch["x"].reshape(micro, -1, *batch["x"].shape[1:])
    ts = batch["targets"].reshape(micro, -1, *batch["targets"].shape[1:])
    slots = P("stage", batch_axes)
    state = jax.lax.with_sharding_constraint(jnp.zeros((stages, *xs.shape[1:]), xs.dtype), slots)
    first = (jnp.arange(stages) == 0)[:, None, None, None]
    loss = 0.0
    for t in range(micro + stages - 1):
        inp = jnp.where(first, xs[min(t, micro - 1)][None], state)  # stage 0: the next one
        out = jax.vmap(lambda x, p: llama.block(x, p, cfg))(inp, params["layers"])
        out = jax.lax.with_sharding_constraint(out, slots)
        m = t - (stages - 1)  # the micro-batch the last stage finishes at this tick
        if 0 <= m < micro:
            y = llama.rms_norm(out[stages - 1], params["final_norm"]) @ params["head"]
            logp = jax.nn.log_softmax(y, axis=-1)
            loss = loss - jnp.mean(jnp.sum(ts[m] * logp, axis=-1)) / micro
        if bug:
            state = jnp.roll(out, 1, axis=1)  # BUG: shifts the batch rows, not the stages
        else:
            state = jnp.roll(out, 1, axis=0)
    return loss


def pipeline_step(bug: bool = False):
    """The SGD step of the pipelined loss (the parameters' shardings as given)."""

    def step(params, batch):
        loss, grads = jax.value_and_grad(pipeline_loss)(params, batch, bug)
        return llama.sgd(params, grads), loss

    return step


def shardings():
    """(in, out) PartitionSpecs of the step on MESH: the parameters as `param_specs` (the
    same as the shard_map pipeline's), the batch and the loss replicated."""
    return (param_specs(), {"x": P(), "targets": P()}), (param_specs(), P())


def verify_example(bug: bool = False, **options) -> Report:
    ins, outs = shardings()
    return verify(
        pipeline_step(bug),
        *example_args(),
        spec=train_step,
        mesh=MESH,
        in_shardings=ins,
        out_shardings=outs,
        **options,
    )


if __name__ == "__main__":
    sys.exit(common.run(__doc__, verify_example))
