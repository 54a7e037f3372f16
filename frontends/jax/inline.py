"""Inline the private-function calls inside shard_map bodies.

tv's `inline-calls` pass inlines the calls at the top level of @main; the calls JAX emits
inside an `sdy.manual_computation` body (`jax.nn.silu`, `log_softmax`, `jnp.where` are
jitted functions) stay calls, and the prover then expands each one whole, with no
cut-points inside (a training step's log_softmax backward does not finish). Until the core
pass recurses into manual regions, the front end inlines them with the same helper.
"""

from __future__ import annotations

from tv_ir.ir import Module

MANUAL = "sdy.manual_computation"


def inline_manual_bodies(module: Module) -> Module:
    """Inline calls inside the top-level shard_map regions of @main (in place)."""
    from tv_ir.passes.inline_calls import _inline_block

    for op in module.main.body.ops:
        if op.name == MANUAL:
            for region in op.regions:
                region.block = _inline_block(module, region.block, depth=1)
    return module
