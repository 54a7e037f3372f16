"""Stages of a repeated form matched to the spec value an earlier one was, renamed
(tv_ir/prover/repeated_stages.py): layers after the first are not looked for in simulation."""

from __future__ import annotations

import inspect
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import tv_ir
from tv_ir.prover import repeated_stages
from tv_ir.prover.engine import StageProver

LAYERS, SEQ, D = 4, 3, 4


def layer(x, w, g, bug=False):
    m = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - m) * (x - m), axis=-1, keepdims=True)
    h = ((x - m) * jax.lax.rsqrt(var + 1e-5) * g) @ w
    if bug:
        return x + jnp.tanh(h) * 1.0001  # BUG: one layer scaled
    return x + jnp.tanh(h)


def moments_layer(x, w, g):
    """The same layer with the variance as E[x^2] - m^2 (each stage needs an expansion)."""
    m = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(x * x, axis=-1, keepdims=True) - m * m
    return x + jnp.tanh(((x - m) * jax.lax.rsqrt(var + 1e-5) * g) @ w)


def spec(x, ws, gs):
    for i in range(LAYERS):
        x = layer(x, ws[i], gs[i])
    return x


def pipelined(bug_layer: int | None = None, rewrite=layer):
    """Two pipeline stages over a "stage" axis (replicated over a "model" axis), 2 layers
    each: every stage applies its layers to the input, then to what the stage before it
    sent (stage 0 to nothing); stage 1's second result is the model's output."""
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("stage", "model"))
    per_stage = LAYERS // 2

    def layers(x, ws, gs, s):
        for i in range(per_stage):
            y = rewrite(x, ws[i], gs[i])
            if bug_layer is not None:
                y = jnp.where(s * per_stage + i == bug_layer, layer(x, ws[i], gs[i], True), y)
            x = y
        return x

    def body(x, ws, gs):
        s = jax.lax.axis_index("stage")
        first = layers(x, ws, gs, s)
        second = layers(jax.lax.ppermute(first, "stage", [(0, 1)]), ws, gs, s)
        return second[None]

    staged = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(P(), P("stage"), P("stage")),
        out_specs=P("stage"),
        check_vma=False,
    )

    def impl(x, ws, gs):
        return staged(x, ws, gs)[-1]

    return impl


ARGS = (
    jax.ShapeDtypeStruct((SEQ, D), jnp.float32),
    jax.ShapeDtypeStruct((LAYERS, D, D), jnp.float32),
    jax.ShapeDtypeStruct((LAYERS, D), jnp.float32),
)


def lowered(fn) -> str:
    return jax.jit(fn).lower(*ARGS).as_text(debug_info=True)


def bug_line() -> int:
    lines, start = inspect.getsourcelines(layer)
    return start + next(i for i, line in enumerate(lines) if "# BUG: one layer" in line)


def test_layers_after_the_first_are_matched_by_their_form():
    report = tv_ir.check(lowered(spec), lowered(pipelined(rewrite=moments_layer)))
    assert report.verdict == "equivalent"
    assert report.stats.repeated_stages > 0
    assert json.loads(report.to_json())["stats"]["repeated_stages"] > 0
    assert "matched by the form of an earlier stage" in str(report)


def test_verdicts_agree_without_repeated_stages(monkeypatch):
    pairs = [(lowered(spec), lowered(pipelined(rewrite=moments_layer)))]
    pairs.append((pairs[0][0], lowered(pipelined(bug_layer=3))))
    with_ = [tv_ir.check(*pair) for pair in pairs]
    monkeypatch.setattr(repeated_stages.RepeatedStages, "predict", lambda *_: None)
    without = [tv_ir.check(*pair) for pair in pairs]
    assert [r.verdict for r in with_] == [r.verdict for r in without]
    assert [r.verdict for r in with_] == ["equivalent", "not_equivalent"]
    assert with_[0].stats.repeated_stages > 0 == without[0].stats.repeated_stages


def test_a_bug_in_one_layer_of_the_repeated_ones_is_refuted_at_its_line():
    report = tv_ir.check(lowered(spec), lowered(pipelined(bug_layer=3)))
    assert report.verdict == "not_equivalent"
    assert report.location.line == bug_line()


def test_a_wrong_prediction_costs_time_not_a_verdict(monkeypatch):
    """Every prediction made the earlier stage's own spec values (not renamed): each one
    fails in simulation or in its proof, and the stage is looked for as before."""

    def unrenamed(self, form, numbering):
        earlier = self._proved.get(form)
        return None if earlier is None else earlier[1]

    outcomes = []
    tried = StageProver._cut_as_predicted

    def counted(self, *args):
        out = tried(self, *args)
        outcomes.append(out is not None)
        return out

    monkeypatch.setattr(repeated_stages.RepeatedStages, "predict", unrenamed)
    monkeypatch.setattr(StageProver, "_cut_as_predicted", counted)
    report = tv_ir.check(lowered(spec), lowered(pipelined(rewrite=moments_layer)))
    assert report.verdict == "equivalent"
    assert outcomes.count(False) > 0  # predictions made, wrong, and not used
    bug = tv_ir.check(lowered(spec), lowered(pipelined(bug_layer=3)))
    assert bug.verdict == "not_equivalent"
