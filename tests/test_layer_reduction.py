"""The layer count of a scan over stacked layers shrinks like a dimension class
(passes/shape_reduction/layer_stacks.py; docs/equivalence.md, "Layer stacks"), and a pair
whose meaning depends on the count is never proved from fewer layers: it is checked at the
real count too."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from tv_ir.passes.inline_calls import run_in_loops
from tv_ir.passes.shape_reduction import reduce_pair

import tv_ir
from tv_ir.pipeline import prepare
from tv_ir.prover import real_size
from tv_ir.prover.placement import Placement

LIMITS = dict(time_limit=300, memory_limit=3500)
HIDDEN = 4


def lower(f, *args) -> str:
    return jax.jit(f).lower(*args).as_text(debug_info=True)


def sds(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def scan_step(layer):
    """One SGD step of a stack of `layer`s written as a scan over stacked weights."""

    def loss(w, x):
        y, _ = jax.lax.scan(lambda c, wi: (layer(c, wi, w), None), x, w)
        return jnp.sum(y * y)

    def step(w, x):
        value, grad = jax.value_and_grad(loss)(w, x)
        return w - 0.1 * grad, value

    return step


def dense(c, wi, w):
    return jnp.tanh(c @ wi)


def first_layer_everywhere(c, wi, w):
    return jnp.tanh(c @ jax.lax.dynamic_index_in_dim(w, jnp.int32(0), keepdims=False))


def layers_of(spec_text: str, impl_text: str) -> list:
    spec = run_in_loops(prepare(spec_text, "spec", unroll=False))
    impl = run_in_loops(prepare(impl_text, "impl", unroll=False))
    red = reduce_pair(spec, impl, Placement.from_module(spec.main, impl))
    return red.layer_loops


def test_scan_layers_shrink_with_their_stack():
    text = lower(scan_step(dense), sds(8, HIDDEN, HIDDEN), sds(2, HIDDEN))
    loops = layers_of(text, text)
    # forward and reversed backward scan in each program, 8 layers -> 2
    assert [(n, k) for _, n, k in loops] == [(8, 2)] * 4


def singled_out_loss(w, x):
    def body(carry, wi):
        c, i = carry
        c = jnp.where(i == 3, -c, c) @ wi  # layer 3 differs
        return (c, i + 1), None

    (y, _), _ = jax.lax.scan(body, (x, 0), w)
    return jnp.sum(y)


def test_a_singled_out_layer_shrinks_but_is_not_proved_from_fewer_layers():
    """`where(i == 3, ...)` on a carried counter: the count shrinks (for refutations), the
    layers are said not to be one function repeated, and the pair is proved unrolled."""
    text = lower(singled_out_loss, sds(8, HIDDEN, HIDDEN), sds(2, HIDDEN))
    spec = run_in_loops(prepare(text, "spec", unroll=False))
    impl = run_in_loops(prepare(text, "impl", unroll=False))
    red = reduce_pair(spec, impl, Placement.from_module(spec.main, impl))
    assert [(n, k) for _, n, k in red.layer_loops] == [(8, 2)] * 2
    assert red.singled_out and "compares its layer index with 3" in red.singled_out[0]


def residual_at_layer(k: int):
    """`scanned(dense)` with a residual added at layer k (the layer counted in the carry)."""

    def f(w, x):
        def body(carry, wi):
            c, i = carry
            y = dense(c, wi, w)
            return (jnp.where(i == k, y + c, y), i + 1), None

        (y, _), _ = jax.lax.scan(body, (x, 0), w)
        return y

    return f


def test_equal_pipelines_singling_out_a_layer_are_proved_unrolled():
    """Spec and pipeline both add a residual at layer 5 of 8: proved at fewer layers, which
    says nothing here, so the proof is made with the loops unrolled."""
    args = (sds(8, HIDDEN, HIDDEN), sds(2, HIDDEN))
    spec, impl = lower(residual_at_layer(5), *args), lower(one_layer_bug(1, 1), *args)
    report = tv_ir.check(spec, impl, **LIMITS)
    assert report.verdict == "equivalent", report.reason
    assert "proved at fewer layers, but not used" in str(report.notes), report.notes


def test_a_counter_compared_by_order_keeps_the_count():
    def loss(w, x):
        def body(carry, wi):
            c, i = carry
            c = jnp.where(i < 3, -c, c) @ wi  # the first 3 layers differ: not one layer
            return (c, i + 1), None

        (y, _), _ = jax.lax.scan(body, (x, 0), w)
        return jnp.sum(y)

    text = lower(loss, sds(8, HIDDEN, HIDDEN), sds(2, HIDDEN))
    assert all(k == n for _, n, k in layers_of(text, text))


def scan_pair(spec_layer, impl_layer, layers: int):
    """Stacks whose layers carry `c` and write `2 * w_i` to a stacked output."""

    def make(layer):
        def f(w, x):
            return jax.lax.scan(lambda c, wi: (layer(c), 2 * wi), x, w)

        return f

    args = (sds(layers, 3), sds(3))
    return lower(make(spec_layer), *args), lower(make(impl_layer), *args)


def identity(c):
    return c


def negate(c):  # agrees with identity at even counts
    return -c


def rotate(c):  # a weightless rotation of period 3: agrees with identity at multiples of 3
    return jnp.roll(c, 1)


@pytest.mark.parametrize(
    "impl_layer, layers, verdict",
    [
        (negate, 8, "equivalent"),  # reduced to 2: equal there, and at 8
        # reduced to 2 (9 is one unit of layers): equal there, but the run at 9 differs, so
        # the proof is not used: checked unrolled, refuted
        (negate, 9, "not_equivalent"),
        (rotate, 6, "equivalent"),  # refuted at 2, but at 6 the rotation is the identity
        (rotate, 4, "not_equivalent"),  # refuted at 2, and at 4 too
        # reduced to 2: refuted there, which does not replay at 9: checked unrolled, proved
        (rotate, 9, "equivalent"),
    ],
)
def test_count_dependent_layers_get_the_real_verdict(impl_layer, layers, verdict):
    spec, impl = scan_pair(identity, impl_layer, layers)
    report = tv_ir.check(spec, impl, **LIMITS)
    assert report.verdict == verdict, report.reason


@pytest.mark.parametrize("at_scale", [False, True])
def test_a_difference_past_the_reduced_count_is_not_proved(at_scale, monkeypatch):
    """A float counter in the carry: equal for the first 2 layers, different from the 3rd.
    The counter changes with each layer without reading data, so the layers are not one
    function repeated and a proof at fewer layers is not used: checked unrolled, refuted
    (also at scale, the real programs treated as too large to run)."""
    if at_scale:
        monkeypatch.setattr(real_size, "REPLAY_LIMIT", 0)

    args = (sds(6, 3), sds(3))
    report = tv_ir.check(
        lower(float_counter(False), *args), lower(float_counter(True), *args), **LIMITS
    )
    assert report.verdict == "not_equivalent", report.reason
    assert "changes with each layer without reading data" in str(report.notes)


def test_a_float_counter_singling_out_a_layer_on_rare_inputs_is_not_proved():
    """Layer 5 of 8 doubles its output when the input's first element is 3 (a float counter
    in the carry picks the layer): proved at 2 layers, and no run on random inputs at 8
    shows it. Until the forty-ninth session this was `equivalent`; now the layers are not
    one function repeated, the pair is checked unrolled, and it is never proved."""

    def layer(h, wi):
        return jnp.tanh(h @ wi) + h

    def spec(x, w):
        return jax.lax.scan(lambda h, wi: (layer(h, wi), None), x, w)[0]

    def impl(x, w):
        def body(c, wi):
            h, t = c
            o = layer(h, wi)
            o = jnp.where((t == 5.0) & (x[0, 0] == 3.0), o * 2.0, o)  # BUG: on rare inputs
            return (o, t + 1.0), None

        return jax.lax.scan(body, (x, jnp.float32(0)), w)[0][0]

    args = (sds(2, 4), sds(8, 4, 4))
    report = tv_ir.check(lower(spec, *args), lower(impl, *args), time_limit=60)
    assert report.verdict != "equivalent", str(report)
    assert "changes with each layer without reading data" in str(report), str(report)


def test_state_changing_without_data_is_told_from_data_and_constants():
    """`evolving_state`: a float counter and a value computed from it change without data;
    the activations (read from the input) and the integer counter do not count."""
    from tv_ir.passes.shape_reduction.layer_stacks import evolving_state

    def f(w, x):
        def body(c, wi):
            h, t, s, k = c
            return (jnp.tanh(h @ wi), t + 1.0, s * 0.5 + t, k), None

        return jax.lax.scan(body, (x, 0.0, 1.0, 3.0), w)[0]

    module = run_in_loops(prepare(lower(f, sds(4, 3, 3), sds(3)), "impl", unroll=False))
    loop = next(op for op in module.main.body.ops if op.name == "stablehlo.while")
    counters = {j for j, v in enumerate(loop.operands) if v.type.is_integer and v.type.shape == ()}
    evolving = evolving_state(loop, counters)
    floats = [j for j, v in enumerate(loop.operands) if j not in counters and v.type.shape == ()]
    assert len(evolving) == 2 and set(evolving) == set(floats), (evolving, floats)


def test_equal_scans_proved_at_fewer_layers():
    args = (sds(8, HIDDEN, HIDDEN), sds(2, HIDDEN))

    def einsum_layer(c, wi, w):
        return jnp.tanh(jnp.einsum("bi,ij->bj", c, wi))

    report = tv_ir.check(lower(scan_step(dense), *args), lower(scan_step(einsum_layer), *args))
    assert report.verdict == "equivalent", report.reason


STAGES = 2


def pipelined(layer):
    """The stack over a "stage" mesh axis: each stage scans its own layers; stage 0's output
    is sent to stage 1, whose output is the result (a two-stage pipeline)."""
    mesh = Mesh(np.array(jax.devices()[:STAGES]), ("stage",))
    return jax.shard_map(
        two_stages(layer), mesh=mesh, in_specs=(P("stage"), P()), out_specs=P(), check_vma=False
    )


def two_stages(layer):
    """One device's program of the two-stage pipeline (`pipelined`)."""

    def body(w_local, x):
        stage = jax.lax.axis_index("stage")
        h0, _ = jax.lax.scan(lambda c, wi: (layer(c, wi, w_local), None), x, w_local)
        h = jax.lax.ppermute(h0, "stage", [(0, 1)])
        h1, _ = jax.lax.scan(lambda c, wi: (layer(c, wi, w_local), None), h, w_local)
        return jax.lax.psum(jnp.where(stage == STAGES - 1, h1, 0.0), "stage")

    return body


def scanned(layer):
    def f(w, x):
        y, _ = jax.lax.scan(lambda c, wi: (layer(c, wi, w), None), x, w)
        return y

    return f


@pytest.mark.parametrize("layers", [8, 32])
def test_pipelined_stack_proved_at_two_layers_per_stage(layers):
    args = (sds(layers, HIDDEN, HIDDEN), sds(2, HIDDEN))
    report = tv_ir.check(lower(scanned(dense), *args), lower(pipelined(dense), *args), **LIMITS)
    assert report.verdict == "equivalent", report.reason
    assert any("layer loops proved at fewer layers" in n for n in report.notes), report.notes
    trips = {(d["real"], d["reduced"]) for d in report.reduction["layer_loops"]}
    assert trips == {(layers, 4), (layers // STAGES, 2)}  # the spec's and each stage's


def sine(c, wi, w):
    return jnp.sin(c @ wi)


@pytest.mark.parametrize("layers", [10, 14])
def test_a_prime_count_of_layers_per_stage_shrinks_to_two(layers):
    """5 or 7 layers per stage: no factor divides them, so the count shrank by none and
    every layer was proved; read in units of a stage's layers, each stage keeps 2."""
    args = (sds(layers, HIDDEN, HIDDEN), sds(2, HIDDEN))
    report = tv_ir.check(lower(scanned(dense), *args), lower(pipelined(dense), *args), **LIMITS)
    assert report.verdict == "equivalent", report.reason
    assert any("layer loops proved at fewer layers" in n for n in report.notes), report.notes
    trips = {(d["real"], d["reduced"]) for d in report.reduction["layer_loops"]}
    assert trips == {(layers, 4), (layers // STAGES, 2)}


def test_a_wrong_layer_in_a_prime_count_per_stage_is_refuted_at_two():
    args = (sds(10, HIDDEN, HIDDEN), sds(2, HIDDEN))
    report = tv_ir.check(lower(scanned(dense), *args), lower(pipelined(sine), *args), **LIMITS)
    assert report.verdict == "not_equivalent", report.reason
    # the counterexample at 2 layers per stage, replayed at 5: real layer p of 5 reads
    # reduced layer p * 2 // 5
    assert "refuted with the layer loops at fewer layers" in str(report.notes), report.notes
    trips = {(d["real"], d["reduced"]) for d in report.reduction["layer_loops"]}
    assert trips == {(10, 4), (5, 2)}


def biased(first_only: bool):
    """A layer of stacked weights and biases; `first_only`: the weights read at layer 0 for
    every layer (the biases at their own layer)."""

    def layer(c, wb, stack):
        w, b = wb
        if first_only:
            w = jax.lax.dynamic_index_in_dim(stack[0], jnp.int32(0), keepdims=False)
        return jnp.tanh(c @ w + b)

    return layer


def test_pipelined_stage_reading_its_first_layer_everywhere_is_refuted():
    args = ((sds(8, HIDDEN, HIDDEN), sds(8, HIDDEN)), sds(2, HIDDEN))
    spec = lower(scanned(biased(False)), *args)
    impl = lower(pipelined(biased(True)), *args)
    report = tv_ir.check(spec, impl, **LIMITS)
    # the constant pick of layer 0 (a slice of size 1 along the stack) keeps the layer
    # count: checked unrolled, refuted there
    assert report.verdict == "not_equivalent", report.reason


def test_pipelined_biased_stack_proved():
    args = ((sds(8, HIDDEN, HIDDEN), sds(8, HIDDEN)), sds(2, HIDDEN))
    spec = lower(scanned(biased(False)), *args)
    report = tv_ir.check(spec, lower(pipelined(biased(False)), *args), **LIMITS)
    assert report.verdict == "equivalent", report.reason
    assert "layer loops proved at fewer layers" in str(report.notes), report.notes


def test_scanned_stack_reading_its_first_layer_everywhere_is_refuted():
    args = (sds(8, HIDDEN, HIDDEN), sds(2, HIDDEN))
    spec = lower(scan_step(dense), *args)
    impl = lower(scan_step(first_layer_everywhere), *args)
    report = tv_ir.check(spec, impl, **LIMITS)
    assert report.verdict == "not_equivalent", report.reason
    assert "refuted with the layer loops at fewer layers" in str(report.notes), report.notes


def one_layer_bug(bad_stage: int, bad_local: int):
    """`pipelined(dense)` with one layer (local layer `bad_local` of stage `bad_stage`)
    adding a residual: the scanned layer carries its index."""
    mesh = Mesh(np.array(jax.devices()[:STAGES]), ("stage",))

    def body(w_local, x):
        stage = jax.lax.axis_index("stage")

        def layer(carry, wi):
            c, i = carry
            y = dense(c, wi, w_local)
            y = jnp.where((stage == bad_stage) & (i == bad_local), y + c, y)  # BUG: one layer
            return (y, i + 1), None

        (h0, _), _ = jax.lax.scan(layer, (x, 0), w_local)
        h = jax.lax.ppermute(h0, "stage", [(0, 1)])
        (h1, _), _ = jax.lax.scan(layer, (h, 0), w_local)
        return jax.lax.psum(jnp.where(stage == STAGES - 1, h1, 0.0), "stage")

    return jax.shard_map(
        body, mesh=mesh, in_specs=(P("stage"), P()), out_specs=P(), check_vma=False
    )


@pytest.mark.parametrize("at_scale", [False, True])
def test_a_bug_in_one_pipelined_layer_is_refuted_at_fewer_layers(at_scale, monkeypatch):
    """Layer 13 of 16 (stage 1's local layer 5 of 8): refuted with 2 layers per stage (the
    marker `i == 5` read as 5 // 4 = 1, the reduced layer standing for layers 4-7), replayed
    at the real layer count, and located at the `where`. At scale (the real programs
    treated as too large to run) the run at the real layer count shows it."""
    if at_scale:
        monkeypatch.setattr(real_size, "REPLAY_LIMIT", 0)
    args = (sds(16, HIDDEN, HIDDEN), sds(2, HIDDEN))
    report = tv_ir.check(lower(scanned(dense), *args), lower(one_layer_bug(1, 5), *args), **LIMITS)
    assert report.verdict == "not_equivalent", report.reason
    assert "refuted with the layer loops at fewer layers" in str(report.notes), report.notes
    trips = {(d["real"], d["reduced"]) for d in report.reduction["layer_loops"]}
    assert trips == {(16, 4), (8, 2)}
    lines = Path(__file__).read_text().splitlines()
    bug_line = next(n for n, t in enumerate(lines, 1) if t.rstrip().endswith("# BUG: one layer"))
    assert (report.location.file, report.location.line) == (__file__, bug_line), report.location


TOKEN_LOOP = """
func.func @main(%x: tensor<8x16xf32>, %steps: tensor<i32>) -> tensor<8x16xf32> {
  %t = stablehlo.after_all : !stablehlo.token
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %c1 = stablehlo.constant dense<1> : tensor<i32>
  %c3 = stablehlo.constant dense<3> : tensor<i32>
  %r:3 = stablehlo.while(%i = %c0, %tok = %t, %acc = %x)
    : tensor<i32>, !stablehlo.token, tensor<8x16xf32>
    cond {
      %m = stablehlo.minimum %steps, %c3 : tensor<i32>
      %lt = stablehlo.compare LT, %i, %m : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    } do {
      %n = stablehlo.add %i, %c1 : tensor<i32>
      %y = stablehlo.add %acc, %acc : tensor<8x16xf32>
      stablehlo.return %n, %tok, %y : tensor<i32>, !stablehlo.token, tensor<8x16xf32>
    }
  return %r#2 : tensor<8x16xf32>
}
"""


def test_a_loop_carrying_a_token_is_no_crash_under_shape_reduction():
    """A while whose state holds a token (XLA's ShardingPreprocessOrderWhile) is no layer
    loop: shape reduction says so instead of reading the token's shape (an AttributeError
    before). Its trip count depends on an input, so the loop stays a loop: no verdict is
    claimed for it (unknown, named), but it is no crash, and a difference is still refuted."""
    report = tv_ir.check(TOKEN_LOOP, TOKEN_LOOP, **LIMITS)
    assert report.verdict == "unknown" and "depends on the inputs" in report.reason, str(report)
    bad = TOKEN_LOOP.replace("stablehlo.add %acc, %acc", "stablehlo.multiply %acc, %acc")
    assert tv_ir.check(TOKEN_LOOP, bad, **LIMITS).verdict == "not_equivalent"


def float_counter(flip: bool):
    """The float counter of `test_a_difference_past_the_reduced_count_is_not_proved`."""

    def f(w, x):
        def body(carry, wi):
            c, t = carry
            return (c, t + 1.0), 2 * wi

        (c, t), ys = jax.lax.scan(body, (x, jnp.float32(0)), w)
        return (jnp.where(t < 2.5, c, -c) if flip else c), ys

    return f


@pytest.mark.parametrize("pair", ["pipelined", "period 2"])
def test_real_count_checks_run_beside_the_proof(pair, monkeypatch):
    """With a core free for it (here: workers=2) the concrete checks at the real layer count
    run in a forked child while the pair at fewer layers is proved; a difference the child
    finds still overturns the proof (the float counter, with the real programs treated as
    too large to run: only that check shows it)."""
    from tv_ir.prover import workers

    forked = []

    class Recorded(workers.Beside):
        def __init__(self, job, **how):
            super().__init__(job, **how)
            forked.append(self.forked)

    monkeypatch.setattr(workers, "Beside", Recorded)
    if pair == "pipelined":
        args = (sds(8, HIDDEN, HIDDEN), sds(2, HIDDEN))
        spec, impl = lower(scanned(dense), *args), lower(pipelined(dense), *args)
    else:  # a weightless negation: equal at 2 layers, not at 9
        monkeypatch.setattr(real_size, "REPLAY_LIMIT", 0)
        spec, impl = scan_pair(identity, negate, 9)
    report = tv_ir.check(spec, impl, workers=2, **LIMITS)
    assert forked[:1] == [True]
    if pair == "pipelined":
        assert report.verdict == "equivalent", report.reason
        assert any("checked concretely at the real layer count" in n for n in report.notes)
    else:
        assert report.verdict == "not_equivalent", report.reason
        assert "but at 9 (other classes reduced) the programs differ" in str(report.notes)


def test_running_out_after_the_loops_were_not_proved_says_why_they_were_not(monkeypatch):
    """The pair at fewer layers ran out of memory, and then its unrolled check did too: the
    verdict's reason says both (before, only the last, so the 405B-shaped step on
    TrainVerify's plan read as if the loops had never been tried)."""
    from tv_ir import pipeline
    from tv_ir.limits import OutOfMemoryBudget
    from tv_ir.report.result import Report

    calls = []

    def unaffordable(need_mb, what):  # the pair at fewer layers, then the unrolled one
        calls.append(what)
        if len(calls) > 1:
            raise OutOfMemoryBudget(f"{what} would take about 9.9 GB")

    def out_of_memory(spec, impl, placement, options):
        return Report("unknown", reason="memory limit of 9000 MB reached")

    monkeypatch.setattr(pipeline, "refuse_unaffordable", unaffordable)
    monkeypatch.setattr(pipeline, "_prove", out_of_memory)
    args = (sds(8, HIDDEN, HIDDEN), sds(2, HIDDEN))
    report = tv_ir.check(lower(scanned(dense), *args), lower(pipelined(dense), *args), **LIMITS)
    assert report.verdict == "unknown"
    assert report.reason.startswith("simulating the programs"), report.reason
    assert "loops checked unrolled, not by induction:" in report.reason
    assert "at fewer layers the verdict was unknown" in report.reason


def test_real_count_checks_run_on_the_reduced_mesh(monkeypatch, tmp_path):
    """A data-parallel pipeline on 4 x 2 devices: the pair at fewer layers is proved on 2 x 2
    (mesh reduction), and so are the concrete checks at the real layer count and a larger
    one (each device's count recorded in a file: they may run in a forked child)."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, STAGES), ("data", "stage"))
    impl = jax.shard_map(
        two_stages(dense),
        mesh=mesh,
        in_specs=(P("stage"), P("data")),
        out_specs=P("data"),
        check_vma=False,
    )
    seen = tmp_path / "devices"
    differs = real_size.differs_on_random_inputs

    def recorded(spec, impl, placement, *a, **k):
        with open(seen, "a") as f:
            f.write(f"{placement.num_devices}\n")
        return differs(spec, impl, placement, *a, **k)

    monkeypatch.setattr(real_size, "differs_on_random_inputs", recorded)
    args = (sds(8, HIDDEN, HIDDEN), sds(8, HIDDEN))
    report = tv_ir.check(lower(scanned(dense), *args), lower(impl, *args), **LIMITS)
    assert report.verdict == "equivalent", report.reason
    assert report.mesh_reduction["devices"] == [8, 4]
    assert any("checked concretely at the real layer count" in n for n in report.notes)
    assert sorted(set(seen.read_text().split())) == ["4"]  # both layer counts, on 2 x 2


def test_a_splat_starting_two_stacks_ties_neither():
    """Two accumulators started from one zeros constant (CSE shares it): `u v^T` and `v u^T`
    summed over the layers. Through the shared splat the accumulators' rows would be one
    class, and so u's and v's sizes; they are not."""
    from tv_ir.passes.shape_reduction.classes import DimClasses
    from tv_ir.passes.shape_reduction.rules import ShapeRules

    def f(p, q):
        def step(c, uv):
            (a, b), (u, v) = c, uv
            return (a + jnp.outer(u, v), b + jnp.outer(v, u)), None

        zeros = jnp.zeros((HIDDEN, HIDDEN))
        (a, b), _ = jax.lax.scan(step, (zeros, zeros), (p, q))
        return a, b

    m = run_in_loops(prepare(lower(f, sds(8, HIDDEN), sds(8, HIDDEN)), "spec", unroll=False))
    d = DimClasses()
    ShapeRules(d, m, "spec", 1, 1, False).run(m.main)
    p, q = m.main.args
    assert d.find((p.id, 1)) != d.find((q.id, 1))
