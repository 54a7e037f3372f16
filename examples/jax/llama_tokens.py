"""Token inputs, dropout and rematerialisation: the decoder reads integer tokens through an
embedding lookup (`params["embed"][tokens]`, a gather with input-dependent indices; its
gradient a scatter-add), applies dropout to the embeddings, and is trained with every
block under `jax.checkpoint`. Proved against the step without remat (~2 s).

`--dp`: the same step data parallel on 4 devices (shard_map, gradients psum'd), proved
(~2 s). The embedding gradient is a psum of per-device scatter-adds against one
scatter-add over the whole batch: a scatter-add with input indices is a sum of one
`index == v ? update : 0` term per update, so the psum of the pieces and the whole have
equal normal forms (before, nested selects went to Z3, which timed out: unknown after 73 s).

Dropout's random bits are an input (`batch["bits"]`, uint32, as `jax.random.bits` would
give them): the step keeps an element when its bits fall below KEEP * 2**32, which is what
`jax.random.bernoulli` does. Passing a key instead makes the verdict unknown: the
threefry hash is xor / shifts on input-dependent integers, and tv's terms have no bits.

    python examples/jax/llama_tokens.py         # proved
    python examples/jax/llama_tokens.py --bug   # refuted at the line marked BUG
    python examples/jax/llama_tokens.py --dp    # proved (data parallel)
"""

from __future__ import annotations

import sys

import common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import llama  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from tv_ir.frontends.jax import Report, verify  # first: asks XLA for 8 CPU devices

DEVICES = 4
CFG = llama.CFG
KEEP = 0.875  # dropout keeps this fraction
THRESHOLD = np.uint32(KEEP * 2**32)


def param_shapes() -> dict:
    embed = jax.ShapeDtypeStruct((CFG.vocab, CFG.dim), llama.F32)
    return llama.param_shapes(CFG) | {"embed": embed}


def batch_shapes() -> dict:
    b, s = CFG.batch, CFG.seq
    return {
        "tokens": jax.ShapeDtypeStruct((b, s), jnp.int32),
        "bits": jax.ShapeDtypeStruct((b, s, CFG.dim), jnp.uint32),
        "targets": llama.batch_shapes(CFG)["targets"],
    }


def dropout(x, bits, bug: bool = False):
    keep = bits < THRESHOLD
    if bug:
        return jnp.where(keep, x * KEEP, 0.0)  # BUG: scales kept values down, not up
    return jnp.where(keep, x / KEEP, 0.0)


def loss_fn(params, batch, remat: bool = False, bug: bool = False):
    """Mean cross-entropy of the decoder on embedded, dropped-out tokens."""
    x = dropout(params["embed"][batch["tokens"]], batch["bits"], bug)
    block = jax.checkpoint(llama.block) if remat else llama.block
    for i in range(CFG.layers):
        x = block(x, llama.layer(params, i))
    logp = jax.nn.log_softmax(llama.rms_norm(x, params["final_norm"]) @ params["head"], axis=-1)
    return -jnp.mean(jnp.sum(batch["targets"] * logp, axis=-1))


def train_step(params, batch):
    """The specification: one SGD step on one device, no remat."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return llama.sgd(params, grads), loss


def remat_step(bug: bool = False):
    """One device, each block rematerialised in the backward pass."""

    def step(params, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, True, bug)
        return llama.sgd(params, grads), loss

    return step


def dp_remat_step(bug: bool = False):
    """Data parallel over 4 devices, each block rematerialised in the backward pass."""

    def local_loss(params, batch):
        return loss_fn(params, batch, remat=True, bug=bug) / DEVICES  # this shard's share

    def body(params, batch):
        loss, grads = jax.value_and_grad(local_loss)(params, batch)
        grads = jax.lax.psum(grads, "data")
        return llama.sgd(params, grads), jax.lax.psum(loss, "data")

    return jax.shard_map(
        body,
        mesh=common.mesh((DEVICES,), ("data",)),
        in_specs=(P(), P("data")),
        out_specs=(P(), P()),
        check_vma=False,
    )


def verify_example(bug: bool = False, dp: bool = False, **options) -> Report:
    step = dp_remat_step(bug) if dp else remat_step(bug)
    return verify(step, param_shapes(), batch_shapes(), spec=train_step, **options)


if __name__ == "__main__":
    dp = "--dp" in sys.argv
    if dp:
        sys.argv.remove("--dp")
    sys.exit(common.run(__doc__, lambda bug: verify_example(bug=bug, dp=dp)))
