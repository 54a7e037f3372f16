"""The decoder's layers as a `jax.lax.scan` over the stacked layer parameters (a
`stablehlo.while` with a static trip count), proved against the unrolled single-device
training step.

tv unrolls the loop before proving (its trip count is fixed), so each layer's values are
cut-points: 2 layers are proved in about 2 s, 8 in about 7 s (docs/jax.md, "Loops").

    python examples/jax/llama_scan.py [--layers N]   # proved
    python examples/jax/llama_scan.py --bug          # refuted
"""

from __future__ import annotations

import functools
import sys

import common  # noqa: E402
import jax  # noqa: E402
import llama  # noqa: E402
from tv_ir.frontends.jax import Report, verify  # first: asks XLA for 8 CPU devices

LAYERS = 2


def config(layers: int = LAYERS) -> llama.Config:
    return llama.Config(layers=layers)


def scan_forward(params, x, cfg: llama.Config, bug: bool = False):
    """Logits, the layers applied by lax.scan over params["layers"]'s leading axis."""

    def step(h, p):
        if bug:
            return llama.block(h, p, cfg) - h, None  # BUG: drops the residual stream
        return llama.block(h, p, cfg), None

    x, _ = jax.lax.scan(step, x, params["layers"])
    return llama.rms_norm(x, params["final_norm"]) @ params["head"]


def scan_loss(params, batch, cfg: llama.Config, bug: bool = False):
    logp = jax.nn.log_softmax(scan_forward(params, batch["x"], cfg, bug), axis=-1)
    return -jax.numpy.mean(jax.numpy.sum(batch["targets"] * logp, axis=-1))


def step_fn(loss, cfg: llama.Config):
    """An SGD training step of `loss(params, batch, cfg)`."""

    def train_step(params, batch):
        value, grads = jax.value_and_grad(functools.partial(loss, cfg=cfg))(params, batch)
        return llama.sgd(params, grads), value

    return train_step


def verify_example(bug: bool = False, layers: int = LAYERS, **options) -> Report:
    cfg = config(layers)
    impl = step_fn(functools.partial(scan_loss, bug=bug), cfg)
    spec = step_fn(llama.loss_fn, cfg)
    return verify(impl, llama.param_shapes(cfg), llama.batch_shapes(cfg), spec=spec, **options)


if __name__ == "__main__":
    layers = LAYERS
    if "--layers" in sys.argv:
        i = sys.argv.index("--layers")
        layers = int(sys.argv[i + 1])
        del sys.argv[i : i + 2]
    sys.exit(common.run(__doc__, functools.partial(verify_example, layers=layers)))
