"""Data parallel training step: the batch is split over 4 devices, each computes the
gradient of its shard's loss, and the gradients and losses are averaged with pmean.

    python examples/jax/llama_dp.py         # proved
    python examples/jax/llama_dp.py --bug   # refuted at the line marked BUG
"""

from __future__ import annotations

import sys

import common  # noqa: E402
import jax  # noqa: E402
import llama  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from tv_ir.frontends.jax import Report, verify  # first: asks XLA for 8 CPU devices

DEVICES = 4


def dp_step(bug: bool = False):
    """llama.train_step as a shard_map over a ("data",) mesh."""

    def local_loss(params, batch):
        # this shard's share of the global mean: summing the shares gives the mean
        return llama.loss_fn(params, batch) / DEVICES

    def body(params, batch):
        loss, grads = jax.value_and_grad(local_loss)(params, batch)
        if bug:
            grads = jax.lax.pmean(grads, "data")  # BUG: averages the already-scaled shares
        else:
            grads = jax.lax.psum(grads, "data")
        loss = jax.lax.psum(loss, "data")
        return llama.sgd(params, grads), loss

    return jax.shard_map(
        body,
        mesh=common.mesh((DEVICES,), ("data",)),
        in_specs=(P(), P("data")),
        out_specs=(P(), P()),
        check_vma=False,  # explicit collectives: the gradient sync is ours to get right
    )


def verify_example(bug: bool = False, **options) -> Report:
    return verify(
        dp_step(bug), llama.param_shapes(), llama.batch_shapes(), spec=llama.train_step, **options
    )


if __name__ == "__main__":
    sys.exit(common.run(__doc__, verify_example))
