"""Pipeline parallel (GPipe) training step: the decoder's layers are split over a "stage"
axis of 2 devices (one layer each), the batch into 2 micro-batches that flow through the
stages with `jax.lax.ppermute`; the last stage computes the loss. `jax.value_and_grad` of
the schedule runs the backward pipeline (the transpose of a ppermute sends cotangents back
one stage). Each stage updates its own layer; the replicated final norm and head get their
gradient from the last stage (psum over "stage").

    python examples/jax/llama_pipeline.py         # proved (~3 s)
    python examples/jax/llama_pipeline.py --bug   # refuted at the line marked BUG (~16 s)

In a pipeline, device s at tick t holds layer s's activation of micro-batch t - s: a
different spec value per device (and idle stages compute unused values on zeros). tv cuts
each device at the spec value its value equals, and leaves the idle stages' values alone.
"""

from __future__ import annotations

import functools
import sys

import common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import llama  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from tv_ir.frontends.jax import Report, verify  # first: asks XLA for 8 CPU devices

STAGES = 2
MICRO = 2  # micro-batches
CFG = llama.Config(layers=STAGES)  # one layer per stage


def train_step(params, batch):
    """The specification: one SGD step of the STAGES-layer decoder on one device."""
    loss, grads = jax.value_and_grad(functools.partial(llama.loss_fn, cfg=CFG))(params, batch)
    return llama.sgd(params, grads), loss


def param_specs():
    """Layer weights split over "stage" along their stacked layer axis; the rest replicated."""
    layers = {k: P("stage") for k in llama.param_shapes(CFG)["layers"]}
    return {"layers": layers, "final_norm": P(), "head": P()}


def micro_batches(a):
    return a.reshape(MICRO, a.shape[0] // MICRO, *a.shape[1:])


def head_loss(params, x, targets):
    """This micro-batch's share of the mean cross-entropy over the whole batch."""
    logits = llama.rms_norm(x, params["final_norm"]) @ params["head"]
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.sum(targets * logp, axis=-1)) / MICRO


def pipeline_loss(params, batch, bug: bool = False):
    """GPipe forward: at tick t stage s works on micro-batch t - s; stage 0 reads the
    micro-batches, every other stage what its predecessor sent at the previous tick."""
    stage = jax.lax.axis_index("stage")
    p = llama.layer(params, 0)  # this stage's layer
    xs, ts = micro_batches(batch["x"]), micro_batches(batch["targets"])
    state = jnp.zeros_like(xs[0])
    loss = 0.0
    forward = [(s, s + 1) for s in range(STAGES - 1)]
    backward = [(s + 1, s) for s in range(STAGES - 1)]
    for t in range(MICRO + STAGES - 1):
        inp = jnp.where(stage == 0, xs[min(t, MICRO - 1)], state)
        out = llama.block(inp, p, CFG)
        m = t - (STAGES - 1)  # the micro-batch the last stage finishes at this tick
        if 0 <= m < MICRO:
            loss = loss + jnp.where(stage == STAGES - 1, head_loss(params, out, ts[m]), 0.0)
        if bug:
            state = jax.lax.ppermute(out, "stage", backward)  # BUG: sends to the previous stage
        else:
            state = jax.lax.ppermute(out, "stage", forward)
    return loss


def pipeline_step(bug: bool = False):
    """llama's train step for CFG as a shard_map over a ("stage",) mesh."""
    specs = param_specs()

    def body(params, batch):
        loss, grads = jax.value_and_grad(pipeline_loss)(params, batch, bug)
        # replicated weights: only the last stage's copy saw the loss
        grads = jax.tree_util.tree_map(
            lambda g, s: jax.lax.psum(g, "stage") if s == P() else g, grads, specs
        )
        return llama.sgd(params, grads), jax.lax.psum(loss, "stage")

    return jax.shard_map(
        body,
        mesh=common.mesh((STAGES,), ("stage",)),
        in_specs=(specs, P()),
        out_specs=(specs, P()),
        check_vma=False,
    )


def example_args():
    return llama.param_shapes(CFG), llama.batch_shapes(CFG)


def verify_example(bug: bool = False, **options) -> Report:
    return verify(pipeline_step(bug), *example_args(), spec=train_step, **options)


if __name__ == "__main__":
    sys.exit(common.run(__doc__, verify_example))
