"""Cut matching that large constants cannot fool: attention masks logits with
`-0.7 * finfo(float32).max`; matching a device's tile to a spec tile at the scale of the
whole array let that one huge value make every head's tile "match", and the cut went to
the wrong head. Tiles are now compared element by element (`close_elementwise`)."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from tv_ir.frontends.jax import verify

from tv_ir.prover import engine
from tv_ir.prover.correspond import TileIndex
from tv_ir.prover.simulate import Trace
from tv_ir.semantics.closeness import close, close_elementwise

B, S, D, H, K = 2, 4, 8, 2, 4
MASK = -0.7 * float(np.finfo(np.float32).max)
F32 = jnp.float32
ARGS = (jax.ShapeDtypeStruct((B, S, D), F32),) + tuple(
    jax.ShapeDtypeStruct(s, F32) for s in [(D, H, K)] * 3 + [(H, K, D)]
)


def projections(x, wq, wk, wv):
    return tuple(jnp.einsum("bsd,dhk->bhsk", x, w) for w in (wq, wk, wv))


def attend(q, k, v):
    logits = jnp.einsum("bhqk,bhsk->bhqs", q, k) / np.float32(np.sqrt(K))
    logits = jnp.where(np.tril(np.ones((S, S), dtype=bool)), logits, MASK)
    return jnp.einsum("bhqs,bhsk->bhqk", jax.nn.softmax(logits, axis=-1), v)


def attention(x, wq, wk, wv, wo):
    return jnp.einsum("bhsk,hkd->bsd", attend(*projections(x, wq, wk, wv)), wo)


def heads_sharded(swap: bool):
    """Batch over "data", the two heads over "heads": 4 devices, one head each."""

    def body(x, wq, wk, wv, wo):
        q, k, v = projections(x, wq, wk, wv)
        if swap:
            k = jax.lax.ppermute(k, "heads", [(0, 1), (1, 0)])  # BUG: the other head's keys
        return jax.lax.psum(jnp.einsum("bhsk,hkd->bsd", attend(q, k, v), wo), "heads")

    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "heads"))
    w = P(None, "heads", None)
    return jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(P("data"), w, w, w, P("heads")),
        out_specs=P("data"),
        check_vma=False,
    )


def test_one_huge_element_does_not_make_arrays_close():
    a = np.array([MASK, 1.0, 2.0])
    b = np.array([MASK, -5.0, 7.0])
    assert close(a, b)  # at the whole array's scale: the outputs' comparison
    assert not close_elementwise(a, b)
    assert close_elementwise(a, a * (1 + 1e-12))
    assert close_elementwise(np.array([np.inf, 1.0]), np.array([np.nan, 1.0]))
    assert not close_elementwise(np.array([np.inf, 1.0]), np.array([1.0, 1.0]))


def test_each_head_tile_matches_its_own_head():
    rng = np.random.default_rng(0)
    spec = rng.standard_normal((H, S, S))
    spec[:, ~np.tril(np.ones((S, S), dtype=bool))] = MASK
    index = TileIndex([Trace(values={7: spec})], {7: spec.shape}, {7: 0})
    per_device = [[spec[h : h + 1]] for h in range(H)]
    (c,) = index.candidates(per_device)
    assert c.boxes == (((0, 1), (0, S), (0, S)), ((1, 2), (0, S), (0, S)))
    # a device holding head 1's logits under head 0's name matches nothing there
    assert index.candidates([[spec[1:2]], [spec[1:2]]]) == [
        type(c)(7, (((1, 2), (0, S), (0, S)),) * 2)
    ]


@pytest.fixture
def stage_outcomes(monkeypatch):
    seen: list[str] = []
    original = engine.StageProver._prove_pairs

    def record(self, pairs, levels, final):
        outcome = original(self, pairs, levels, final)
        if not final:
            seen.append(outcome.status)
        return outcome

    monkeypatch.setattr(engine.StageProver, "_prove_pairs", record)
    return seen


def test_heads_sharded_attention_proved_with_the_right_cuts(stage_outcomes):
    r = verify(heads_sharded(swap=False), *ARGS, spec=attention)
    assert r.verdict == "equivalent", r.reason
    # every candidate tried was the right head's tile (before: the masked logits minus the
    # row max matched head 0's tile on every device, and those attempts failed)
    assert stage_outcomes.count("unknown") == 0, stage_outcomes
    assert r.stats.stages >= 12


def test_head_swap_refuted():
    r = verify(heads_sharded(swap=True), *ARGS, spec=attention)
    assert r.verdict == "not_equivalent", r.reason
    lines = Path(__file__).read_text().splitlines()
    bug = next(i for i, ln in enumerate(lines, 1) if "# BUG: the other head's keys" in ln)
    sites = [r.location.impl, *r.location.related]
    assert any(s.file == __file__ and s.line == bug for s in sites), str(r)


def attention_inf_mask(x, wq, wk, wv, wo):
    """The masked logits are -inf (jnp.where(mask, logits, -jnp.inf), as many models write)."""
    q, k, v = projections(x, wq, wk, wv)
    logits = jnp.einsum("bhqk,bhsk->bhqs", q, k) / np.float32(np.sqrt(K))
    logits = jnp.where(np.tril(np.ones((S, S), dtype=bool)), logits, -jnp.inf)
    out = jnp.einsum("bhqs,bhsk->bhqk", jax.nn.softmax(logits, axis=-1), v)
    return jnp.einsum("bhsk,hkd->bsd", out, wo)


def grads(f):
    return jax.grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=(0, 1, 2, 3, 4))


def test_a_recomputed_inf_masked_softmax_is_cut_again(stage_outcomes):
    # jax.checkpoint recomputes the attention in the backward pass: the recomputed
    # `logits - max` is compared with a spec value already proved, whose masked elements
    # are `-inf - max`. As a residue, `-inf - s` is `-inf` whatever `s`, so that candidate
    # failed (the value stayed uncut); compared as a pair, both sides expand to -inf.
    r = verify(grads(jax.checkpoint(attention_inf_mask)), *ARGS, spec=grads(attention_inf_mask))
    assert r.verdict == "equivalent", r.reason
    assert stage_outcomes.count("unknown") == 0, stage_outcomes
