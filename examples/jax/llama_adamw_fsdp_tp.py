"""A training step with optax AdamW under FSDP + tensor parallelism on a (2, 4) mesh of 8
devices, written the `jax.jit`-with-shardings way: parameters and AdamW moments are split
over "data" (FSDP) and "model" (Megatron columns / rows), the batch over "data". XLA's SPMD
partitioner inserts the collectives; tv proves its per-device program equal to the
single-device step.

    python examples/jax/llama_adamw_fsdp_tp.py
"""

from __future__ import annotations

import sys

import common  # noqa: E402
import jax  # noqa: E402
import llama  # noqa: E402
import optax  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from tv_ir.frontends.jax import Report, verify  # first: asks XLA for 8 CPU devices

MESH = {"data": 2, "model": 4}
TX = optax.adamw(learning_rate=1e-2, weight_decay=1e-2)


def train_step(params, opt_state, batch):
    """The specification: one AdamW step on one device."""
    loss, grads = jax.value_and_grad(llama.loss_fn)(params, batch)
    updates, opt_state = TX.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def param_specs(attention_tp: bool = False):
    """FSDP over "data" for every matrix; Megatron over "model" for the SwiGLU MLP and the
    output head, and (attention_tp) for the attention heads."""
    columns, rows = ["w_gate", "w_up"], ["w_down"]
    fsdp_only = ["wq", "wk", "wv", "wo"]
    if attention_tp:
        columns, rows, fsdp_only = columns + ["wq", "wk", "wv"], rows + ["wo"], []
    layers = {k: P() for k in llama.param_shapes()["layers"]}
    layers.update({k: P(None, "data", None) for k in fsdp_only})
    layers.update({k: P(None, "data", "model") for k in columns})
    layers.update({k: P(None, "model", "data") for k in rows})
    return {"layers": layers, "final_norm": P(), "head": P("data", "model")}


def opt_state_specs(opt_state_shapes, attention_tp: bool = False, params=None):
    """AdamW's moments (mu, nu) are sharded like the parameters (`params`, by default
    `param_specs(attention_tp)`); the step count replicated."""
    by_path = {
        jax.tree_util.keystr(path): spec
        for path, spec in jax.tree_util.tree_flatten_with_path(
            params if params is not None else param_specs(attention_tp),
            is_leaf=lambda s: isinstance(s, P),
        )[0]
    }

    def one(path, leaf):
        key = jax.tree_util.keystr(path)
        for moment in (".mu", ".nu"):
            if moment in key:
                return by_path[key.split(moment, 1)[1]]
        return P()

    return jax.tree_util.tree_map_with_path(one, opt_state_shapes)


def example_args():
    params = llama.param_shapes()
    return params, jax.eval_shape(TX.init, params), llama.batch_shapes()


def shardings(attention_tp: bool = False):
    params, opt_state, _ = example_args()
    p, o = param_specs(attention_tp), opt_state_specs(opt_state, attention_tp)
    batch = {"x": P("data"), "targets": P("data")}
    return (p, o, batch), (p, o, P())


def verify_example(bug: bool = False, attention_tp: bool = False, **options) -> Report:
    if bug:
        raise SystemExit("this example has no planted bug (XLA inserts the collectives)")
    ins, outs = shardings(attention_tp)
    return verify(
        train_step,
        *example_args(),
        spec=train_step,
        mesh=MESH,
        in_shardings=ins,
        out_shardings=outs,
        **options,
    )


if __name__ == "__main__":
    sys.exit(common.run(__doc__, verify_example))
