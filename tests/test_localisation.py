"""Where a refutation says the programs part ways, in a pipelined tensor-parallel step.

A GPipe schedule reshapes the batch into micro-batches (a value the spec never computes,
though each micro-batch is a tile of the spec's batch again) and feeds a pipeline stage that
has not started with zeros (so a stage's tile, summed with those zeros, looks like a partial
sum). Neither is where a missing collective is: the report names the op that made the
partial sum and the line that uses it as a whole.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import tv_ir

STAGES, TP, MICRO, LAYERS = 2, 2, 2, 4
B, D, F = 8, 4, 8


def spec(x, w1, w2):
    h = x
    for i in range(LAYERS):
        h = h + jnp.tanh(h @ w1[i]) @ w2[i]
    return jnp.mean(h * h)


def pipelined(bug: bool):
    def body(x, w1, w2):
        stage = jax.lax.axis_index("stage")
        xs = x.reshape(MICRO, -1, x.shape[1])

        def stage_layers(h):
            for i in range(w1.shape[0]):
                y = jnp.tanh(h @ w1[i]) @ w2[i]
                if bug and i == w1.shape[0] - 1:
                    h = h + y  # BUG: not summed over "model"
                else:
                    h = h + jax.lax.psum(y, "model")
            return h

        state = jnp.zeros_like(xs[0])
        loss = 0.0
        for t in range(MICRO + STAGES - 1):
            out = stage_layers(jnp.where(stage == 0, xs[min(t, MICRO - 1)], state))
            if 0 <= t - (STAGES - 1) < MICRO:
                share = jnp.mean(out * out) / MICRO
                loss = loss + jnp.where(stage == STAGES - 1, share, 0.0)
            if t < MICRO + STAGES - 2:
                state = jax.lax.ppermute(out, "stage", [(0, 1)])
        return jax.lax.psum(loss, "stage")

    mesh = Mesh(np.array(jax.devices()[: STAGES * TP]).reshape(STAGES, TP), ("stage", "model"))
    return jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(P(), P("stage", None, "model"), P("stage", "model", None)),
        out_specs=P(),
        check_vma=False,
    )


def _lower(f):
    shapes = [(B, D), (LAYERS, D, F), (LAYERS, F, D)]
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    return jax.jit(f).lower(*args).as_text(debug_info=True)


def _line(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if f"# {marker}" in text)


def test_correct_pipeline_is_proved() -> None:
    r = tv_ir.check(_lower(spec), _lower(pipelined(False)))
    assert r.verdict == "equivalent", r.reason


def test_missing_psum_is_named_where_the_partial_sum_is_used() -> None:
    r = tv_ir.check(_lower(spec), _lower(pipelined(True)))
    assert r.verdict == "not_equivalent", r.reason
    loc = r.location
    # not the micro-batch reshape, nor the stage-0 select fed with zeros
    assert loc.impl.op == "stablehlo.dot_general", str(r)
    assert loc.used_at is not None and loc.used_at.line == _line("BUG"), str(r)
    assert "used as a whole at" in str(r)


def test_running_out_of_time_while_localising_keeps_the_refutation(monkeypatch) -> None:
    """The counterexample is replayed before the search for the diverging op starts: when
    that search hits the time limit the verdict stays `not_equivalent`, without an op."""
    from tv_ir.limits import OutOfTime
    from tv_ir.prover import localise

    def out_of_time(*args, **kwargs):
        raise OutOfTime("time limit of 1 s reached")

    monkeypatch.setattr(localise, "_impl_site", out_of_time)
    x = jax.ShapeDtypeStruct((4,), jnp.float32)
    spec_text = jax.jit(lambda v: v * 2.0).lower(x).as_text()
    impl_text = jax.jit(lambda v: v * 3.0).lower(x).as_text()
    r = tv_ir.check(spec_text, impl_text)
    assert r.verdict == "not_equivalent", r.reason
    assert r.counterexample.expected != r.counterexample.actual
    assert r.location.impl is None and "time limit" in r.location.note
    assert "the diverging op was not found" in str(r)


def test_a_search_for_the_op_that_never_ends_leaves_time_to_replay_at_real_size(
    monkeypatch,
) -> None:
    """A refutation at reduced shapes is replayed at the real sizes afterwards. A search for
    the diverging op that would run past the time limit (the 405B-shaped step's, over
    thousands of values) gets only a share of the time left, so the replay still runs and
    the verdict is `not_equivalent`, not `unknown`."""
    import time

    from tv_ir.limits import check_time
    from tv_ir.prover import localise

    def never_done(*args, **kwargs):
        while True:
            check_time()
            time.sleep(0.01)

    monkeypatch.setattr(localise, "_impl_site", never_done)
    x = jax.ShapeDtypeStruct((64, 256), jnp.float32)
    w = jax.ShapeDtypeStruct((256, 64), jnp.float32)
    spec_text = jax.jit(lambda a, b: jnp.tanh(a @ b) * 2.0).lower(x, w).as_text()
    impl_text = jax.jit(lambda a, b: jnp.tanh(a @ b) * 3.0).lower(x, w).as_text()
    r = tv_ir.check(spec_text, impl_text, time_limit=8)
    assert r.reduction and r.reduction["reduced"], r.reduction
    assert r.verdict == "not_equivalent", r.reason
    assert r.counterexample.expected != r.counterexample.actual
    assert r.location.impl is None and "time limit" in r.location.note


STAGE_FNS = [jnp.tanh, jnp.sin, lambda h: h * 2.0, jnp.cos]


def per_stage_functions(bug: str | None):
    """Each stage applies its own function, picked by `lax.switch` on its stage index: a
    `case` whose branches read the data without taking it as an operand."""

    def body(w, x):
        h = x @ w[0]
        i = jax.lax.axis_index("stage")
        if bug == "order":
            y = jax.lax.switch(i, [STAGE_FNS[k] for k in (0, 1, 3, 2)], h)  # ORDER
        elif bug == "scale":
            y = jax.lax.switch(i, STAGE_FNS, h) * 1.5  # SCALE
        else:
            y = jax.lax.switch(i, STAGE_FNS, h)
        return y[None]

    mesh = Mesh(np.array(jax.devices()[:4]), ("stage",))
    return jax.shard_map(body, mesh=mesh, in_specs=(P("stage"), P()), out_specs=P("stage"))


def stages_spec(w, x):
    return jnp.stack([f(x @ w[k]) for k, f in enumerate(STAGE_FNS)])


def test_a_bug_after_a_switch_on_the_stage_is_named_at_its_line() -> None:
    """The values a `case` computes from data captured by its branches are data: the walk
    named the whole shard_map (it read the switch's results as index arithmetic, as if
    they came from the stage index alone)."""
    args = [
        jax.ShapeDtypeStruct((4, 16, 16), jnp.float32),
        jax.ShapeDtypeStruct((8, 16), jnp.float32),
    ]

    def lower(f):
        return jax.jit(f).lower(*args).as_text(debug_info=True)

    assert tv_ir.check(lower(stages_spec), lower(per_stage_functions(None))).verdict == "equivalent"
    for bug, op in (("order", "stablehlo.case"), ("scale", "stablehlo.multiply")):
        r = tv_ir.check(lower(stages_spec), lower(per_stage_functions(bug)))
        assert r.verdict == "not_equivalent", r.reason
        assert r.location.impl.op == op and r.location.impl.line == _line(bug.upper()), str(r)
