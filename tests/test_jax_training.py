"""Training-step features through the JAX front end: jax.checkpoint (remat), dropout with
its random bits as an input, integer tokens through an embedding gather, lax.scan loops."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tv_ir.frontends.jax import assert_equivalent, verify

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "jax"))

import llama  # noqa: E402

F32 = jnp.float32
X = jax.ShapeDtypeStruct((4, 8), F32)


def remat_loss(params, batch):
    x = batch["x"]
    for i in range(llama.CFG.layers):
        x = jax.checkpoint(llama.block)(x, llama.layer(params, i))
    logp = jax.nn.log_softmax(llama.rms_norm(x, params["final_norm"]) @ params["head"], axis=-1)
    return -jnp.mean(jnp.sum(batch["targets"] * logp, axis=-1))


def remat_step(params, batch):
    loss, grads = jax.value_and_grad(remat_loss)(params, batch)
    return llama.sgd(params, grads), loss


def test_checkpointed_blocks_proved():
    report = assert_equivalent(
        remat_step, llama.param_shapes(), llama.batch_shapes(), spec=llama.train_step
    )
    assert report.stats.stages > 50


def dropout_from_bits(bits, x):
    """What jax.random.bernoulli(key, 0.75) does with the key's bits: keep if below."""
    return jnp.where(bits < np.uint32(0.75 * 2**32), x / 0.75, 0.0)


def test_dropout_with_bits_input_proved():
    def inverted(bits, x):  # the same dropout, written as a multiply by the kept mask
        return x * (bits < np.uint32(0.75 * 2**32)).astype(F32) / 0.75

    bits = jax.ShapeDtypeStruct((4, 8), jnp.uint32)
    assert_equivalent(inverted, bits, X, spec=dropout_from_bits)


def test_dropout_with_key_input_is_unknown():
    """A key input goes through threefry (xor, shifts): bitwise ops on input-dependent
    integers have no meaning in tv's terms, so the verdict is unknown, never a pass."""

    def dropout(key, x):
        return jnp.where(jax.random.bernoulli(key, 0.75, x.shape), x / 0.75, 0.0)

    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    report = verify(dropout, key, X, spec=dropout)
    assert report.verdict == "unknown"
    assert "bitwise" in report.reason


def test_embedding_gather_differs_from_one_hot_on_negative_tokens():
    """`embed[tokens]` wraps negative tokens (NumPy indexing) where one_hot gives zeros:
    tv finds such a token, an integer counterexample."""
    embed = jax.ShapeDtypeStruct((8, 8), F32)
    tokens = jax.ShapeDtypeStruct((4, 4), jnp.int32)
    report = verify(lambda e, t: e[t], embed, tokens, spec=lambda e, t: jax.nn.one_hot(t, 8) @ e)
    assert report.verdict == "not_equivalent"
    token = report.counterexample.inputs["t"][report.counterexample.index[:2]]
    assert not 0 <= token < 8


def mlp_layer(h, p):
    return h + llama.swiglu(h, p)


MLP_KEYS = ("w_gate", "w_up", "w_down")


def mlp_params(layers: int) -> dict:
    shapes = llama.param_shapes(llama.Config(layers=layers))["layers"]
    return {k: shapes[k] for k in MLP_KEYS}


def scanned(params, x):
    return jax.lax.scan(lambda h, p: (mlp_layer(h, p), None), x, params)[0]


def unrolled(params, x):
    for i in range(params["w_gate"].shape[0]):
        x = mlp_layer(x, {k: params[k][i] for k in MLP_KEYS})
    return x


X3 = jax.ShapeDtypeStruct((4, 4, 8), F32)


def test_scan_of_one_layer_proved():
    assert_equivalent(scanned, mlp_params(1), X3, spec=unrolled)


def test_scan_bug_refuted_inside_the_scan():
    def wrong(params, x):  # the layer's residual is missing
        return jax.lax.scan(lambda h, p: (llama.swiglu(h, p), None), x, params)[0]  # BUG

    report = verify(wrong, mlp_params(2), X3, spec=unrolled)
    assert report.verdict == "not_equivalent"
    # the loop is unrolled: the refutation names an op of the second layer (the first that
    # reads the un-residualled activation), and the scanned body's line among the sites its
    # inputs come from
    line = next(
        i for i, ln in enumerate(Path(__file__).read_text().splitlines(), 1) if "# BUG" in ln
    )
    sites = [report.location.impl, *report.location.related]
    assert (__file__, line) in [(s.file, s.line) for s in sites], str(report)


# scanned layers are unrolled before proving: every layer's values are cut-points
def test_scan_of_two_layers_proved():
    assert_equivalent(scanned, mlp_params(2), X3, spec=unrolled)
