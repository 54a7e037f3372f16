"""Fully sharded data parallel (FSDP / ZeRO-3) training step: every parameter is split over
4 devices along its last axis and gathered before use; each device computes its batch
shard's share of the loss; gradients are summed and scattered back (psum_scatter) so each
device updates only its own parameter shard.

    python examples/jax/llama_fsdp.py         # proved
    python examples/jax/llama_fsdp.py --bug   # refuted at the line marked BUG
"""

from __future__ import annotations

import sys

import common  # noqa: E402
import jax  # noqa: E402
import llama  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from tv_ir.frontends.jax import Report, verify  # first: asks XLA for 8 CPU devices

DEVICES = 4


def last_axis(shapes):
    """PartitionSpecs splitting each parameter's last axis over "data"."""
    return jax.tree_util.tree_map(lambda a: P(*([None] * (len(a.shape) - 1)), "data"), shapes)


def gather(shards):
    return jax.tree_util.tree_map(
        lambda a: jax.lax.all_gather(a, "data", axis=a.ndim - 1, tiled=True), shards
    )


def gather_interleaved(shards):
    """Stacks the shards on a new last axis and flattens: columns come out interleaved."""

    def one(a):
        stacked = jax.lax.all_gather(a, "data", axis=a.ndim)  # BUG: shards on a new last axis
        return stacked.reshape(*a.shape[:-1], -1)

    return jax.tree_util.tree_map(one, shards)


def scatter_sum(g):
    return jax.lax.psum_scatter(g, "data", scatter_dimension=g.ndim - 1, tiled=True)


def fsdp_step(bug: bool = False):
    def local_loss(params, batch):
        return llama.loss_fn(params, batch) / DEVICES  # this shard's share of the mean

    def body(shards, batch):
        params = gather_interleaved(shards) if bug else gather(shards)
        loss, grads = jax.value_and_grad(local_loss)(params, batch)
        grads = jax.tree_util.tree_map(scatter_sum, grads)
        return llama.sgd(shards, grads), jax.lax.psum(loss, "data")

    specs = last_axis(llama.param_shapes())
    return jax.shard_map(
        body,
        mesh=common.mesh((DEVICES,), ("data",)),
        in_specs=(specs, P("data")),
        out_specs=(specs, P()),
        check_vma=False,
    )


def verify_example(bug: bool = False, **options) -> Report:
    return verify(
        fsdp_step(bug), llama.param_shapes(), llama.batch_shapes(), spec=llama.train_step, **options
    )


if __name__ == "__main__":
    sys.exit(common.run(__doc__, verify_example))
