"""Optimizer steps after FSDP gradients, written as users write them: weights all-gathered
over an "fsdp" axis, gradients reduce-scattered back (shard_map with `psum_scatter`, or
`jax.jit` with NamedShardings, where XLA's partitioner chooses the collectives), then
global-norm clipping (optax's `clip_by_global_norm` pattern) and the update.

What stood in the way (docs/benchmarks.md, "A Llama-3-405B-shaped step"):
- the per-device gradient is a tile of the spec's gradient only after the spec transposes
  it back (`jax.grad` of `x @ w` computes `dh^T x`, then transposes): no cut value held that
  tile and the gradient stayed uncut (here 12x the time; in larger steps the optimizer's
  outputs reached the final check expanded);
- XLA folds a mean's cotangent over a (batch, features) tile to one constant 1/(batch *
  features), which shape reduction read as an ordinary constant while the spec's count
  shrank: the reduced pair differed where the real one does not (now a normaliser).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from tv_ir.frontends.jax import verify

from tv_ir.report.result import EQUIVALENT, NOT_EQUIVALENT

FSDP = 4
MAX_NORM = 1.0
LR = 1e-2


def loss_fn(params, x, y):
    h = jnp.tanh(x @ params["w1"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


def spec_step(params, opt_state, x, y):
    """One clipped SGD step on one device."""
    tx = optax.chain(optax.clip_by_global_norm(MAX_NORM), optax.sgd(LR))
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def fsdp_step(global_norm: bool = True):
    """The step with weights and gradients sharded over "fsdp" (shard_map); `global_norm`
    False plants a bug: each device clips by the norm of its own shards."""
    mesh = Mesh(np.array(jax.devices()[:FSDP]), ("fsdp",))

    def local(params, opt_state, x, y):
        full = jax.tree.map(lambda w: jax.lax.all_gather(w, "fsdp", tiled=True), params)
        loss, grads = jax.value_and_grad(loss_fn)(full, x, y)
        grads = jax.tree.map(lambda g: jax.lax.psum_scatter(g, "fsdp", tiled=True) / FSDP, grads)
        # clip_by_global_norm over the whole gradient: each device squares its shards
        squares = sum(jnp.sum(g * g) for g in jax.tree.leaves(grads))
        norm = jnp.sqrt(jax.lax.psum(squares, "fsdp") if global_norm else squares)
        grads = jax.tree.map(lambda g: jnp.where(norm < MAX_NORM, g, g / norm * MAX_NORM), grads)
        updates = jax.tree.map(lambda g: -LR * g, grads)
        return optax.apply_updates(params, updates), opt_state, jax.lax.pmean(loss, "fsdp")

    weights = {"w1": P("fsdp"), "w2": P("fsdp")}
    specs = (weights, P(), P("fsdp"), P("fsdp"))
    return jax.jit(
        jax.shard_map(
            local, mesh=mesh, in_specs=specs, out_specs=(weights, P(), P()), check_vma=False
        )
    )


def example_args():
    params = {
        "w1": jax.ShapeDtypeStruct((8, 16), jnp.float32),
        "w2": jax.ShapeDtypeStruct((16, 4), jnp.float32),
    }
    tx = optax.chain(optax.clip_by_global_norm(MAX_NORM), optax.sgd(LR))
    return (
        params,
        jax.eval_shape(tx.init, params),
        jax.ShapeDtypeStruct((8, 8), jnp.float32),
        jax.ShapeDtypeStruct((8, 4), jnp.float32),
    )


def test_clipped_step_after_reduce_scattered_gradients_is_proved():
    report = verify(fsdp_step(), *example_args(), spec=spec_step, time_limit=300)
    assert report.verdict == EQUIVALENT, str(report)
    # each device's gradient shard (w1's and w2's, after `/ FSDP`) is a stage of its own, cut
    # at the spec's gradient, which `jax.grad` computes transposed and transposes back: no
    # cut value held that tile before (25 stages, 12x the time), and in larger steps the
    # uncut gradient reached AdamW's outputs expanded (docs/benchmarks.md)
    assert report.stats.stages >= 27, str(report)


def test_norm_of_local_shards_only_is_refuted():
    report = verify(fsdp_step(global_norm=False), *example_args(), spec=spec_step, time_limit=120)
    assert report.verdict == NOT_EQUIVALENT, str(report)
    assert report.counterexample is not None


def test_jit_fsdp_step_is_proved_at_reduced_shapes():
    """`jax.jit` with NamedShardings: XLA folds the mean's cotangent 1/(8 * 4) into one
    constant. Before, the reduced pair was refuted (the spec's count shrank, the folded
    constant did not) and the pair was checked again at its real sizes."""
    mesh = {"fsdp": FSDP}
    weights = {"w1": P("fsdp", None), "w2": P("fsdp", None)}
    args = example_args()
    opt = jax.tree.map(lambda _: P(), args[1])
    ins = (weights, opt, P("fsdp"), P("fsdp"))
    report = verify(
        spec_step,
        *args,
        spec=spec_step,
        mesh=mesh,
        in_shardings=ins,
        out_shardings=(weights, opt, P()),
        time_limit=120,
    )
    assert report.verdict == EQUIVALENT, str(report)
    assert report.reduction is not None and report.reduction["reduced"], str(report)
    assert not any("did not carry over" in note for note in report.notes), report.notes


# -- AdamW without clipping: the bias corrections are cut-points -------------------------
B1, B2, ADAM_EPS, WEIGHT_DECAY = 0.9, 0.95, 1e-8, 0.1


def adamw(params, grads, state, second_moment_base=B2):
    """AdamW written out (as bench/llama405b.py and optax do): bias corrections at step
    count + 1, an int32 input, so both are zero at count -1."""
    t = (state["count"] + 1).astype(jnp.float32)
    c1, c2 = 1 - B1**t, 1 - second_moment_base**t
    m = jax.tree.map(lambda g, m: B1 * m + (1 - B1) * g, grads, state["m"])
    v = jax.tree.map(lambda g, v: B2 * v + (1 - B2) * g * g, grads, state["v"])

    def update(p, m_, v_):
        return p - LR * ((m_ / c1) / (jnp.sqrt(v_ / c2) + ADAM_EPS) + WEIGHT_DECAY * p)

    return jax.tree.map(update, params, m, v), {"m": m, "v": v, "count": state["count"] + 1}


def adamw_spec_step(params, state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    params, state = adamw(params, grads, state)
    return params, state, loss


def adamw_fsdp_step(second_moment_base=B2):
    """`second_moment_base` B1 plants a bug: beta1 in the second bias correction."""
    mesh = Mesh(np.array(jax.devices()[:FSDP]), ("fsdp",))

    def local(params, state, x, y):
        full = jax.tree.map(lambda w: jax.lax.all_gather(w, "fsdp", tiled=True), params)
        loss, grads = jax.value_and_grad(loss_fn)(full, x, y)
        grads = jax.tree.map(lambda g: jax.lax.psum_scatter(g, "fsdp", tiled=True) / FSDP, grads)
        params, state = adamw(params, grads, state, second_moment_base)
        return params, state, jax.lax.pmean(loss, "fsdp")

    weights = {"w1": P("fsdp"), "w2": P("fsdp")}
    state = {"m": weights, "v": weights, "count": P()}
    specs = (weights, state, P("fsdp"), P("fsdp"))
    return jax.jit(
        jax.shard_map(
            local, mesh=mesh, in_specs=specs, out_specs=(weights, state, P()), check_vma=False
        )
    )


def adamw_args():
    params = {
        "w1": jax.ShapeDtypeStruct((8, 16), jnp.float32),
        "w2": jax.ShapeDtypeStruct((16, 4), jnp.float32),
    }
    state = {"m": params, "v": params, "count": jax.ShapeDtypeStruct((), jnp.int32)}
    return (
        params,
        state,
        jax.ShapeDtypeStruct((8, 8), jnp.float32),
        jax.ShapeDtypeStruct((8, 4), jnp.float32),
    )


def test_adamw_step_after_reduce_scattered_gradients_is_proved():
    """Each device's update `m_hat / (sqrt(v_hat) + eps)` is a stage over the cut-points of
    `1 - b1**t` and `1 - b2**t`. Where the second is zero, each program's
    `1 / (sqrt(v_hat) + eps)` is its own opaque value; the first is zero there too, so the
    update is non-finite in both, but only while the two cut symbols keep their definitions'
    condition `t == 0`. Before, as two unrelated symbols, every such stage failed (the solver
    timed out) and the step was unknown at 200 s."""
    report = verify(adamw_fsdp_step(), *adamw_args(), spec=adamw_spec_step, time_limit=120)
    assert report.verdict == EQUIVALENT, str(report)


def test_adamw_step_with_beta1_in_the_second_correction_is_refuted():
    report = verify(
        adamw_fsdp_step(second_moment_base=B1), *adamw_args(), spec=adamw_spec_step, time_limit=120
    )
    assert report.verdict == NOT_EQUIVALENT, str(report)
    assert report.counterexample is not None
