"""Shape reduction of the counts a training step divides by (issue #10, the Llama-3-405B-shaped
step at real sizes), on JAX programs written as users write them.

- RMSNorm's mean, forward and backward, over a micro-batch of one: its `1 / hidden` is spread
  over the hidden positions through a dimension of size 1, and must still shrink.
- A cross-entropy mean over a device's tokens (a micro-batch of 2 times a sequence shard),
  where the same count is also the whole sequence: the candidates differ only by the
  micro-batch, which cannot shrink, so they are one normaliser.
- The other direction: a count that could normalise either of two dimensions that both
  shrink is ambiguous; it stands for any positive number, so the proof holds whichever it
  counts, and where the pair needs its value the pair is checked again with its classes
  kept (an attention scale `1/sqrt(head_dim)` equal to a shard's row count, too).
- The reduced programs never hold more elements than the real ones: a splat is not copied
  where nothing shrank, and a reduction that would grow is said, and checked at real sizes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from test_shape_reduction import both, dp_mean_pair, dp_mean_spec, f32, kept, shrunk, smap
from tv_ir.passes import shape_reduction

import tv_ir

# -- RMSNorm over a micro-batch of one ---------------------------------------------------------

B, T, D = 2, 16, 64  # batch (one row per "data" shard), sequence, hidden


def rms_norm(x, w):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-5) * w


def norm_loss(x, w):
    return jnp.sum(jnp.tanh(rms_norm(x, w)))


def norm_grads(x, w):
    return jax.grad(norm_loss, argnums=(0, 1))(x, w)


def norm_grads_micro(x, w):
    """Each "data" shard's rows (one) as micro-batches of one, gradients accumulated."""

    def body(x, w):
        micro = x.reshape(x.shape[0], 1, T, D)
        gxs, gw = [], jnp.zeros_like(w)
        for m in range(micro.shape[0]):
            gx, g = jax.grad(norm_loss, argnums=(0, 1))(micro[m], w)
            gxs.append(gx)
            gw = gw + g
        return jnp.concatenate(gxs, axis=0), gw

    return smap(body, (P("data"), P()), (P("data"), P()))(x, w)


def norm_grads_micro_bug(x, w):
    def body(x, w):
        gx, gw = jax.grad(norm_loss, argnums=(0, 1))(x, w)
        return gx, gw * 2  # BUG: the weight's gradient counted twice

    return smap(body, (P("data"), P()), (P("data"), P()))(x, w)


def test_rms_norm_over_a_micro_batch_of_one_shrinks_the_hidden_size() -> None:
    reduced, _ = both(norm_grads_micro, f32(B, T, D), f32(D), spec=norm_grads, expect="equivalent")
    # the backward of the mean divides by D under a dimension of size 1 (keepdims): that
    # dimension spreads over nothing, and D is still the count it normalises
    assert "spec argument 0 dim 2" in shrunk(reduced), reduced.reduction["summary"]
    assert "spec argument 0 dim 1" in shrunk(reduced), reduced.reduction["summary"]


def test_rms_norm_over_a_micro_batch_of_one_bug_refuted() -> None:
    reduced, _ = both(
        norm_grads_micro_bug, f32(B, T, D), f32(D), spec=norm_grads, expect="not_equivalent"
    )
    assert "spec argument 0 dim 2" in shrunk(reduced), reduced.reduction["summary"]


# -- a cross-entropy mean over a device's tokens -----------------------------------------------

NB, NT, ND, NV = 8, 32, 12, 24  # batch, sequence, width, vocabulary


@functools.cache
def token_mesh() -> Mesh:
    """The batch over "model" (4 shards of 2 rows), the sequence over "data" (2 shards)."""
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))


def xent(x, w, targets):
    logp = jax.nn.log_softmax(x @ w, axis=-1)
    return -jnp.mean(jnp.sum(targets * logp, axis=-1))


def xent_grad(x, w, targets):
    return jax.value_and_grad(xent, argnums=1)(x, w, targets)


def xent_grad_tokens(x, w, targets):
    """Each device's mean over its 2 x 16 tokens (as many as the whole sequence), averaged
    over the 8 token shards."""

    def local(x, w, targets):
        return xent(x, w, targets) / 8

    def body(x, w, targets):
        loss, g = jax.value_and_grad(local, argnums=1)(x, w, targets)
        return jax.lax.psum(loss, ("data", "model")), jax.lax.psum(g, ("data", "model"))

    tokens = P("model", "data")
    return jax.shard_map(
        body,
        mesh=token_mesh(),
        in_specs=(tokens, P(), tokens),
        out_specs=(P(), P()),
        check_vma=False,
    )(x, w, targets)


def test_token_mean_whose_count_is_also_the_sequence_is_a_normaliser() -> None:
    args = (f32(NB, NT, ND), f32(ND, NV), f32(NB, NT, NV))
    reduced, _ = both(xent_grad_tokens, *args, spec=xent_grad, expect="equivalent")
    # 32 = 2 rows x 16 positions on a device, or the whole sequence: the rows cannot shrink
    # (a mean reduces the 2 of them), so both read the same reduced count
    assert "spec argument 0 dim 1" in shrunk(reduced), reduced.reduction["summary"]


def test_a_token_count_that_is_also_vocabulary_times_a_shards_tokens_keeps_the_vocabulary():
    """The spec's mean over 8 x 32 tokens divides by 256, which is also the vocabulary (8)
    times a device's 2 x 16 tokens (the classes are shared with the implementation): two
    readings of one constant. Before, neither was taken and nothing was kept: the tokens
    shrank, the 256 stayed, and the reduced pair differed where the real one does not (the
    llama405b step on 2 x 4 x 2 x 2 devices was refuted, its real programs too large to
    replay). Now the class only one reading holds keeps its size and the constant is read
    by the others."""
    args = (f32(NB, NT, ND), f32(ND, 8), f32(NB, NT, 8))
    reduced, _ = both(xent_grad_tokens, *args, spec=xent_grad, expect="equivalent")
    assert not any("did not carry over" in n for n in reduced.notes), reduced.notes
    assert "may count its positions" in kept(reduced)["spec argument 1 dim 1"]
    assert "spec argument 0 dim 1" in shrunk(reduced), reduced.reduction["summary"]


def token_sum_spec(x, y):
    return jnp.sum(x * y) / (16 * 12)  # a mean over the tokens of a sum over the vocabulary


def token_sum_psum(x, y):
    """The 16 rows over "model" and the vocabulary of 8 over "data": a device sums 4 rows x
    12 positions x 4 words, 192, as many as the tokens the mean counts."""

    def body(x, y):
        return jax.lax.psum(jnp.sum(x * y), ("data", "model")) / (16 * 12)

    spec = P("model", None, "data")
    return jax.shard_map(
        body, mesh=token_mesh(), in_specs=(spec, spec), out_specs=P(), check_vma=False
    )(x, y)


def token_sum_psum_bug(x, y):
    def body(x, y):
        return jax.lax.psum(jnp.sum(x * y), "model") / (16 * 12)  # BUG: half the vocabulary

    spec = P("model", None, "data")
    return jax.shard_map(
        body, mesh=token_mesh(), in_specs=(spec, spec), out_specs=P(), check_vma=False
    )(x, y)


def test_a_count_after_a_psum_counts_the_devices_it_adds() -> None:
    """The spec's 192 tokens are also a device's 4 rows x 12 positions x 4 words. The spec
    counts its own dimensions (not a device's), and the psum'd sum adds 8 devices' sums: a
    device's 192 positions is no count of it. One reading is left (the tokens), and the
    vocabulary shrinks (before, it kept its 8 as "may count its positions")."""
    args = (f32(16, 12, 8), f32(16, 12, 8))
    reduced, _ = both(token_sum_psum, *args, spec=token_sum_spec, expect="equivalent")
    assert "spec argument 0 dim 2" in shrunk(reduced), reduced.reduction["summary"]
    assert "spec argument 0 dim 0" in shrunk(reduced), reduced.reduction["summary"]


def test_a_count_after_a_psum_bug_refuted() -> None:
    args = (f32(16, 12, 8), f32(16, 12, 8))
    both(token_sum_psum_bug, *args, spec=token_sum_spec, expect="not_equivalent")


# -- an ambiguous count stands for any value ---------------------------------------------------


def both_axes_spec(x):
    return jnp.sum(x, axis=(0, 1)) / NT  # NT: the rows' count, or the columns'?


def both_axes_dp(x):
    def body(x):
        return jax.lax.psum(jnp.sum(x, axis=(0, 1)), "data") / NT

    return smap(body, P("data"), P(), check_vma=False)(x)


@pytest.mark.usefixtures("scales_at_any_size")
def test_count_of_either_of_two_shrinking_dimensions_is_proved_for_any_value() -> None:
    # NT may count the rows or the columns (both shrink): it stands for any positive number,
    # so the proof holds whichever it counts (before, both classes kept their sizes)
    reduced, _ = both(both_axes_dp, f32(NT, NT, 4), spec=both_axes_spec, expect="equivalent")
    for name in ("spec argument 0 dim 0", "spec argument 0 dim 1", "spec argument 0 dim 2"):
        assert name in shrunk(reduced), reduced.reduction["summary"]
    assert "proved for any positive value" in reduced.reduction["summary"]


# -- never larger than the real programs -------------------------------------------------------


def windowed_spec(x, y):
    """x keeps both its sizes (a window) and is scaled by one splat three times (one value
    after tv's CSE); y shrinks, saving less than three copies of the splat would cost."""
    pooled = jax.lax.reduce_window(x, 0.0, jax.lax.add, (2, 2), (1, 1), "VALID")
    return (pooled * 3.0) * 3.0 + jnp.tanh(pooled) * 3.0, jnp.tanh(y) * 3.0


def windowed_dp(x, y):
    return smap(windowed_spec, (P(), P("data")), (P(), P("data")))(x, y)


WINDOWED = (f32(NT, ND), f32(2, 2))


def test_reduced_programs_never_hold_more_than_the_real_ones() -> None:
    reduced, _ = both(windowed_dp, *WINDOWED, spec=windowed_spec, expect="equivalent")
    r = reduced.reduction
    assert r["reduced"], f"{r['summary']}\n{reduced.notes}"
    assert r["reduced_elements"] < r["real_elements"], r["summary"]
    for c in r["classes"]:
        assert c["reduced"] <= c["real"], r["summary"]


def test_a_reduction_that_grows_is_said_and_checked_at_real_sizes(monkeypatch) -> None:
    from tv_ir.passes.shape_reduction.rewrite import Rewriter

    def copy_per_use(self, v, t):  # the splat copied at every use, as before
        return self.copy_splat(self.splats[v.id], v, t)

    monkeypatch.setattr(Rewriter, "splat_at", copy_per_use)
    reduced, _ = both(windowed_dp, *WINDOWED, spec=windowed_spec, expect="equivalent")
    assert not reduced.reduction["reduced"], reduced.reduction["summary"]
    assert any("made the programs larger" in n for n in reduced.notes), str(reduced)


def test_a_factor_that_does_not_divide_a_size_keeps_its_class() -> None:
    from tv_ir.passes.shape_reduction.classes import DimClasses
    from tv_ir.passes.shape_reduction.factors import check_factors

    d = DimClasses()
    a, b = d.add((1, 0), 12, "a"), d.add((2, 0), 6, "b")
    d.tie(a, b)
    c = d.add((3, 0), 8, "c")
    factor = {d.find(a): 4, d.find(c): 4}  # 4 does not divide 6: b would not be a whole size
    check_factors(d, d.classes(), factor)
    assert factor == {d.find(a): 1, d.find(c): 4}
    assert "does not divide size 6" in d.reason_kept([a, b])
    assert d.reason_kept([c]) is None


def test_report_says_why_a_class_no_op_keeps_did_not_shrink() -> None:
    # 4 rows, 2 per "data" shard, as micro-batches of one: the batch cannot shrink (a member
    # of size 1), and the report says so instead of leaving it out
    reduced, _ = both(
        norm_grads_micro, f32(2 * B, T, D), f32(D), spec=norm_grads, expect="equivalent"
    )
    assert "has size 1" in kept(reduced).get("spec argument 0 dim 0", ""), reduced.reduction
    assert "spec argument 0 dim 0: 4 kept" in reduced.reduction["summary"]


# -- a loss share is a count of devices, not of positions (issue #12) ---------------------------

SB, SD, SH, MICRO = 32, 16, 12, 2  # rows (4 per device), width, hidden, micro-batches
DEVICES = 8  # the (2, 4) mesh


def share_loss(x, w):
    return jnp.mean(jnp.sum(jnp.tanh(x @ w), axis=-1))


def share_grad(x, w):
    return jax.value_and_grad(share_loss, argnums=1)(x, w)


def share_grad_dp(x, w, shares=MICRO * DEVICES):
    """Each device's rows as 2 micro-batches, each micro-batch's mean divided by its share
    of the global batch, 1/(micro * devices) = 1/16 (the width's size too); shares and
    gradients psum'd over every device."""

    def local(x, w):
        micro = x.reshape(MICRO, -1, SD)
        loss = 0.0
        for m in range(MICRO):
            loss = loss + share_loss(micro[m], w) / shares
        return loss

    def body(x, w):
        loss, g = jax.value_and_grad(local, argnums=1)(x, w)
        return jax.lax.psum(loss, ("data", "model")), jax.lax.psum(g, ("data", "model"))

    rows = P(("data", "model"))
    return smap(body, (rows, P()), (P(), P()), check_vma=False)(x, w)


def share_grad_dp_bug(x, w):
    return share_grad_dp(x, w, shares=MICRO)  # BUG: the share of one device's micro-batches


SHARE_ARGS = (f32(SB, SD), f32(SD, SH))


def test_loss_share_over_the_devices_does_not_keep_a_dimension_of_its_size() -> None:
    reduced, _ = both(share_grad_dp, *SHARE_ARGS, spec=share_grad, expect="equivalent")
    # 16 = 2 micro-batches x 8 devices, psum'd over the 8: the width of 16 still shrinks
    assert "spec argument 0 dim 1" in shrunk(reduced), reduced.reduction["summary"]
    assert "constant 16 " not in reduced.reduction["summary"], reduced.reduction["summary"]
    assert "constant 0.0625 " not in reduced.reduction["summary"], reduced.reduction["summary"]


def test_loss_share_of_one_device_only_is_refuted() -> None:
    reduced, _ = both(share_grad_dp_bug, *SHARE_ARGS, spec=share_grad, expect="not_equivalent")
    assert "spec argument 0 dim 1" in shrunk(reduced), reduced.reduction["summary"]


LB, LD, LH = 12, 4, 6  # rows (3 per micro-batch of a data shard), width, hidden


def last_stage_grad_dp(x, w, shares=MICRO * 2):
    """A pipeline's loss: each data shard's rows on every "model" device (a stage), but only
    the last stage's loss counts, `where(stage == 3, mean / shares, 0)` with shares =
    micro-batches x data shards = 4 (the width's size too), psum'd over all 8 devices: the
    2 devices of the last stage contribute, 2 x 2 micro-batches."""

    def local(x, w):
        micro = x.reshape(MICRO, -1, LD)
        last = jax.lax.axis_index("model") == 3
        loss = 0.0
        for m in range(MICRO):
            loss = loss + jnp.where(last, share_loss(micro[m], w) / shares, 0.0)
        return loss

    def body(x, w):
        loss, g = jax.value_and_grad(local, argnums=1)(x, w)
        return jax.lax.psum(loss, ("data", "model")), jax.lax.psum(g, ("data", "model"))

    return smap(body, (P("data"), P()), (P(), P()), check_vma=False)(x, w)


def test_loss_share_of_the_devices_a_select_keeps_does_not_keep_a_dimension_of_its_size():
    # 4 = 2 contributing devices (of the psum's 8: `stage == 3` holds on 2) x 2 micro-batches;
    # before, only a share of all 8 devices was read as one, and the width of 4 was kept
    reduced, _ = both(
        last_stage_grad_dp, f32(LB, LD), f32(LD, LH), spec=share_grad, expect="equivalent"
    )
    assert "spec argument 0 dim 1" in shrunk(reduced), reduced.reduction["summary"]


def test_loss_share_of_the_devices_a_select_keeps_written_wrong_is_refuted():
    reduced, _ = both(
        functools.partial(last_stage_grad_dp, shares=MICRO * 8),  # BUG: all 8 devices' share
        f32(LB, LD),
        f32(LD, LH),
        spec=share_grad,
        expect="not_equivalent",
    )
    assert reduced.counterexample is not None


def share_grad_dp_unsummed(x, w):
    """The same shares, each device's also returned as it is (not only psum'd): 1/16 may
    then be the width's count, and the width keeps its size as before."""

    def local(x, w):
        micro = x.reshape(MICRO, -1, SD)
        return sum(share_loss(micro[m], w) / (MICRO * DEVICES) for m in range(MICRO))

    def body(x, w):
        loss = local(x, w)
        return jax.lax.psum(loss, ("data", "model")), loss[None]

    rows = P(("data", "model"))
    return smap(body, (rows, P()), (P(), rows), check_vma=False)(x, w)


def share_unsummed_spec(x, w):
    per_device = x.reshape(DEVICES, MICRO, -1, SD)
    shares = jax.vmap(lambda d: sum(share_loss(d[m], w) for m in range(MICRO)))(per_device)
    return share_loss(x, w), shares / (MICRO * DEVICES)


def test_share_that_is_not_only_psummed_keeps_the_dimension_of_its_size() -> None:
    reduced, _ = both(
        share_grad_dp_unsummed, *SHARE_ARGS, spec=share_unsummed_spec, expect="equivalent"
    )
    assert "may be its size" in kept(reduced).get("spec argument 0 dim 1", ""), reduced.reduction[
        "summary"
    ]


def scaled_spec(x):
    # 16: the width's size, scaling a value no device sums; the width is summed over too
    return jnp.tanh(x) * 16.0, jnp.sum(x, axis=-1)


def scaled_dp(x):
    return smap(scaled_spec, P(("data", "model")), P(("data", "model")))(x)


def test_constant_of_a_dimension_size_that_is_no_device_share_keeps_it() -> None:
    reduced, _ = both(scaled_dp, f32(SB, SD), spec=scaled_spec, expect="equivalent")
    assert "may be its size" in kept(reduced).get("spec argument 0 dim 1", ""), reduced.reduction[
        "summary"
    ]


# -- a global mean normalised in steps: the constants' product is the count --------------------
#
# `psum(s / rows / width) / devices` or `psum(s) * 2**-4 * 2**-4`: each constant scales the sum
# in turn. Read one at a time, each may be a size (16 is the width and the batch; 1/16 either
# of them), so every class kept its size; at 512 devices and width 4096 the check ran into
# its time limit. Their product counts the positions summed over, as one constant's would.
# Constants scaling the values element by element before the sum (`sum(y / width / rows)`)
# count the same way: their product, over two or more classes of the value; and so do those
# on both sides of the sum (`sum(y / width) / rows`).

MR, MW = 8, 16  # rows per "data" shard (2 shards: a batch of 16), width


def step_mean_dp(x, w, form="steps"):
    devices = 2

    def body(x, w):
        s = jnp.sum(jnp.tanh(x @ w) ** 2)
        if form == "steps":
            return jax.lax.psum(s / MR / MW, "data") / devices
        if form == "powers":
            return jax.lax.psum(s, "data") * 2.0**-4 * 2.0**-4
        y = jnp.tanh(x @ w) ** 2  # element by element, then summed
        if form == "elementwise":
            return jax.lax.psum(jnp.sum(y / MW / MR), "data") / devices
        if form == "elementwise-factors":
            return jax.lax.psum(jnp.sum(y * (1 / MR) * 0.5 * (2 / MW)), "data") / devices
        if form == "elementwise-bug":
            return jax.lax.psum(jnp.sum(y / MW / MR), "data")  # BUG: not divided by the devices
        if form == "split":  # the count split across the sum
            return jax.lax.psum(jnp.sum(y / MW) / MR, "data") / devices
        if form == "split-partial":  # a partial sum first, then the rest
            return jax.lax.psum(jnp.sum(jnp.sum(y * (1 / MW), 1)) * (1 / MR), "data") / devices
        if form == "split-bug":
            return jax.lax.psum(jnp.sum(y / (MW // 2)) / MR, "data") / devices  # BUG: half
        return jax.lax.psum(s / MR / MW, "data")  # BUG: not divided by the devices

    return smap(body, (P("data"), P()), P(), check_vma=False)(x, w)


STEP_ARGS = (f32(2 * MR, MW), f32(MW, MW))


@pytest.mark.parametrize(
    "form", ["steps", "powers", "elementwise", "elementwise-factors", "split", "split-partial"]
)
def test_a_mean_normalised_in_steps_reads_the_product_as_its_count(form) -> None:
    reduced, _ = both(
        functools.partial(step_mean_dp, form=form),
        *STEP_ARGS,
        spec=dp_mean_spec,
        expect="equivalent",
    )
    assert not kept(reduced), reduced.reduction["summary"]
    for name in ("spec argument 0 dim 0", "spec argument 0 dim 1", "spec argument 1 dim 1"):
        assert name in shrunk(reduced), reduced.reduction["summary"]


@pytest.mark.parametrize("form", ["bug", "elementwise-bug", "split-bug"])
def test_a_mean_normalised_in_steps_with_one_step_missing_is_refuted(form) -> None:
    reduced, real = both(
        functools.partial(step_mean_dp, form=form),
        *STEP_ARGS,
        spec=dp_mean_spec,
        expect="not_equivalent",
    )
    assert "spec argument 0 dim 1" in shrunk(reduced), reduced.reduction["summary"]
    assert reduced.location.impl.line == real.location.impl.line, str(reduced)


def test_a_sum_scaled_by_zero_then_by_a_count_is_no_count() -> None:
    """`psum(s * 0) / 16`: a chain through a zero counts nothing (it divided by zero)."""

    def body(x, w):
        return jax.lax.psum(jnp.sum(jnp.tanh(x @ w)) * 0.0, "data") / 16.0

    impl = smap(body, (P("data"), P()), P(), check_vma=False)
    both(impl, *STEP_ARGS, spec=lambda x, w: 0.0 * jnp.sum(x @ w), expect="equivalent")


@pytest.mark.parametrize("form", ["after", "elementwise", "split"])
def test_a_mean_normalised_in_steps_over_512_devices_is_proved_at_reduced_shapes(form) -> None:
    """The forms users write, at the size that ran into the time limit: 512 devices of 8
    rows, width 4096 (the batch of 4,096 is the width too); the steps after the sum, or
    element by element before it."""
    devices, rows, width = 512, 8, 4096

    def body(x, w):
        if form == "elementwise":
            return jax.lax.psum(jnp.sum(jnp.tanh(x @ w) ** 2 / width / rows), "data") / devices
        if form == "split":
            return jax.lax.psum(jnp.sum(jnp.tanh(x @ w) ** 2 / width) / rows, "data") / devices
        s = jnp.sum(jnp.tanh(x @ w) ** 2)
        return jax.lax.psum(s / rows / width, "data") / devices

    impl, x, w = dp_mean_pair(body, devices, rows, width)
    report = tv_ir.frontends.jax.verify(impl, x, w, spec=dp_mean_spec, time_limit=120)
    assert report.verdict == "equivalent", str(report)
    assert not kept(report), report.reduction["summary"]


# -- a constant equal to the size of a class nothing sums over: no count of it -----------------


def scale_only_spec(x):
    return jnp.tanh(x) * 16.0  # 16: the width's size; nothing sums over the width


def scale_only_dp(x):
    return smap(scale_only_spec, P(("data", "model")), P(("data", "model")))(x)


def scale_only_dp_bug(x):
    def body(x):
        return jnp.tanh(x) * 8.0  # BUG: another scale

    return smap(body, P(("data", "model")), P(("data", "model")))(x)


def test_a_constant_equal_to_the_size_of_a_class_nothing_sums_over_is_no_count() -> None:
    # an attention's 1/sqrt(256) beside 16 layers per pipeline stage: the layer stack is read
    # and written a layer at a time, never summed over, so 1/16 cannot be its count
    reduced, _ = both(scale_only_dp, f32(SB, SD), spec=scale_only_spec, expect="equivalent")
    assert "spec argument 0 dim 1" not in kept(reduced), reduced.reduction["summary"]
    assert "spec argument 0 dim 1" in shrunk(reduced), reduced.reduction["summary"]
    both(scale_only_dp_bug, f32(SB, SD), spec=scale_only_spec, expect="not_equivalent")


# -- a constant equal to the devices times a class that cannot shrink is no share by that -------

K = 2  # a contracted dimension of 2 (cannot shrink): 16 = 8 devices x K, and the hidden size


def hidden_sum_spec(x, w):
    return jnp.sum(jnp.tanh(x @ w))


def hidden_sum_dp(x, w):
    """Each device's rows, their hidden units averaged and the mean times 16 (the hidden
    size: a count of what shrinks) psum'd over the 8 devices: one summand per device, so
    16 is no device share (that would be 8); it equals 8 x K by coincidence."""

    def body(x, w):
        per_row = jnp.mean(jnp.tanh(x @ w), axis=-1)
        return jax.lax.psum(jnp.sum(per_row) * 16.0, ("data", "model"))

    return smap(body, (P(("data", "model")), P()), P(), check_vma=False)(x, w)


def test_count_equal_to_devices_times_a_fixed_size_is_no_device_share() -> None:
    reduced, _ = both(
        hidden_sum_dp, f32(SB, K), f32(K, SD), spec=hidden_sum_spec, expect="equivalent"
    )
    # read as a share, the hidden size shrank and the reduced pair differed (16 x a mean of 2)
    assert reduced.reduction, str(reduced)
    assert "may be its size" in kept(reduced).get("spec argument 1 dim 1", ""), reduced.reduction[
        "summary"
    ]
    assert not any("did not carry over" in n for n in reduced.notes), str(reduced)


# -- LayerNorm's backward as torch_xla emits it (batch_norm_grad over a unit batch) ------------
#
# torch_xla lowers `nn.LayerNorm` over (tokens, hidden) to batch_norm_training/_grad on a
# (1, tokens, hidden) view with the tokens as features: the sums run over the unit dimension
# and the hidden one, and the count N is the hidden size. The spec's batch_norm_grad writes
# `(scale * inv / N) * (N * g - sum(g) - ...)`: N scales values that are no sums, so read
# as written it is a constant equal to a size, and the hidden size stayed at its real size
# (passes/expand_batch_norm.py now takes 1/N into the sums: means, read at the reduced count).

LN_T, LN_D = 6, 64  # tokens (the feature dimension), hidden (the count N)
LN_X, LN_F = f"tensor<1x{LN_T}x{LN_D}xf32>", f"tensor<{LN_T}xf32>"
LN_EPS = 1e-5


def layer_norm_grad_torch_xla() -> str:
    """batch_norm_training then batch_norm_grad, as torch_xla emits a LayerNorm's backward."""
    three = f"({LN_X}, {LN_F}, {LN_F})"
    five = f"({LN_X}, {LN_F}, {LN_F}, {LN_F}, {LN_X})"
    attrs = "{epsilon = 9.99999974E-6 : f32, feature_index = 1 : i64}"
    return f"""module {{
  func.func public @main(%x: {LN_X}, %s: {LN_F}, %o: {LN_F}, %g: {LN_X}) -> {three} {{
    %y:3 = "stablehlo.batch_norm_training"(%x, %s, %o) {attrs} : {three} -> {three}
    %d:3 = "stablehlo.batch_norm_grad"(%x, %s, %y#1, %y#2, %g) {attrs} : {five} -> {three}
    return %d#0, %d#1, %d#2 : {LN_X}, {LN_F}, {LN_F}
  }}
}}"""


def _hand_layer_norm_grad(grad_operand) -> str:
    """The same three results written by hand in JAX; `grad_operand(g, c, inv, ve)` gives
    the operand's gradient from the centred input c, rsqrt(var + eps) and var + eps."""

    def f(x, s, o, g):
        m = x.mean(axis=(0, 2))
        c = x - m[None, :, None]
        ve = (c * c).mean(axis=(0, 2))[None, :, None] + np.float32(LN_EPS)
        inv = jax.lax.rsqrt(ve)
        dx = s[None, :, None] * inv * grad_operand(g, c, ve)
        return dx, (g * c * inv).sum(axis=(0, 2)), g.sum(axis=(0, 2))

    x, v = np.zeros((1, LN_T, LN_D), np.float32), np.zeros((LN_T,), np.float32)
    return jax.jit(f, keep_unused=True).lower(x, v, v, x).as_text()


def _means(g, c, ve):
    return (
        g - g.mean(axis=(0, 2), keepdims=True) - (g * c).mean(axis=(0, 2), keepdims=True) * c / ve
    )


def _means_missing_a_term(g, c, ve):
    return g - (g * c).mean(axis=(0, 2), keepdims=True) * c / ve  # BUG: no - mean(g)


def _count_folded(g, c, ve):
    n = np.float32(LN_D)  # the hidden size, written as a number: no mean's count
    return (
        g * n - g.sum(axis=(0, 2), keepdims=True) - (g * c).sum(axis=(0, 2), keepdims=True) * c / ve
    ) / n


def _check(impl: str, **options):
    return tv_ir.check(layer_norm_grad_torch_xla(), impl, time_limit=300, **options)


def test_layer_norm_backward_over_a_unit_batch_shrinks_the_hidden_size() -> None:
    report = _check(_hand_layer_norm_grad(_means))
    assert report.verdict == "equivalent", report
    assert shrunk(report).get("spec argument 0 dim 2") == (LN_D, 4), report.reduction["summary"]


def test_layer_norm_backward_bug_refuted_at_reduced_shapes() -> None:
    report = _check(_hand_layer_norm_grad(_means_missing_a_term))
    assert report.verdict == "not_equivalent", report
    assert "spec argument 0 dim 2" in shrunk(report), report.reduction["summary"]


def test_hidden_size_written_as_a_number_is_no_normaliser_and_keeps_its_class() -> None:
    # `g * 64` and `... / 64` scale values that are no sums: 64 may be the hidden size in a
    # way shape reduction cannot follow (a count folded by hand), so the class keeps it
    report = _check(_hand_layer_norm_grad(_count_folded))
    assert report.verdict == "equivalent", report
    why = kept(report).get("spec argument 0 dim 2", "")
    assert "may be its size" in why, report.reduction["summary"]


# -- a scale that may be a count: proved for any positive value --------------------------------
#
# An attention scale `1/sqrt(head_dim)` that equals the size of a class something sums over
# (16 heads of 256, 16 rows per data shard): its role cannot be read off the programs. It
# stands for any positive number in the proof, so the proof holds for its own value and for a
# count's at the reduced size; where the pair needs its value, the pair is checked again with
# the class kept.

AB, AD = 8, 16  # rows (4 per data shard), width; the scale 1/4 is a shard's row count


@pytest.fixture
def scales_at_any_size(monkeypatch):
    """Scales stand for symbols however little keeping their classes would cost (by default
    only where keeping them leaves the reduced programs twice as large and 200,000 elements or
    more: these programs are small)."""
    monkeypatch.setattr(shape_reduction, "SCALE_MIN", 0)
    monkeypatch.setattr(shape_reduction, "SCALE_GAIN", 1)


def attention_loss(x, w):
    scores = (x @ w) / 4.0  # 4 = sqrt(AD): an attention scale, not the 4 rows of a shard
    return jnp.sum(jax.nn.softmax(scores, axis=-1) @ w.T)


def attention_grad(x, w):
    return jax.grad(attention_loss, argnums=1)(x, w)


def attention_grad_dp(x, w):
    def body(x, w):
        return jax.lax.psum(jax.grad(attention_loss, argnums=1)(x, w), "data")

    return smap(body, (P("data"), P()), P(), check_vma=False)(x, w)


def attention_loss_reciprocal(x, w):
    scores = (x @ w) * 0.25  # the same scale as a product: the same real number
    return jnp.sum(jax.nn.softmax(scores, axis=-1) @ w.T)


def attention_grad_dp_reciprocal(x, w):
    def body(x, w):
        return jax.lax.psum(jax.grad(attention_loss_reciprocal, argnums=1)(x, w), "data")

    return smap(body, (P("data"), P()), P(), check_vma=False)(x, w)


def attention_grad_dp_bug(x, w):
    def body(x, w):
        g = jax.grad(attention_loss, argnums=1)(x, w)
        return jax.lax.psum(g, "data") / 4.0  # BUG: averaged over the 4 rows of a shard

    return smap(body, (P("data"), P()), P(), check_vma=False)(x, w)


@pytest.mark.usefixtures("scales_at_any_size")
def test_a_scale_that_may_be_a_count_shrinks_its_class_proved_for_any_value() -> None:
    # the backward carries the scale linearly into the weight gradient's sum over the rows:
    # 1/4 may be the count of a shard's rows; before, those rows kept their size
    reduced, _ = both(
        attention_grad_dp, f32(AB, AD), f32(AD, AD), spec=attention_grad, expect="equivalent"
    )
    summary = reduced.reduction["summary"]
    assert "spec argument 0 dim 0" in shrunk(reduced), summary
    assert "proved for any positive value" in summary, summary
    assert reduced.reduction["scales"], summary
    assert not any("checked again" in n for n in reduced.notes), reduced.notes


@pytest.mark.usefixtures("scales_at_any_size")
def test_a_scale_and_its_reciprocal_written_as_a_product_read_one_symbol() -> None:
    # `x / 4` in the spec, `x * 0.25` on the devices: `1/s` in both, proved for every s
    args = (f32(AB, AD), f32(AD, AD))
    reduced, _ = both(attention_grad_dp_reciprocal, *args, spec=attention_grad, expect="equivalent")
    assert "spec argument 0 dim 0" in shrunk(reduced), reduced.reduction["summary"]
    assert not any("checked again" in n for n in reduced.notes), reduced.notes


@pytest.mark.usefixtures("scales_at_any_size")
def test_a_scale_standing_for_any_value_still_refutes_a_bug() -> None:
    reduced, _ = both(
        attention_grad_dp_bug,
        f32(AB, AD),
        f32(AD, AD),
        spec=attention_grad,
        expect="not_equivalent",
    )
    assert reduced.counterexample is not None


def spread_spec(v, w):
    # the rows of v spread over 4 and summed back, through a matmul, times 1/4: v @ w,
    # because 1/4 counts the spread rows (at 2 of them, 1/4 would no longer be their count)
    spread = jnp.sum(jnp.broadcast_to(v, (4, *v.shape)), axis=0)
    return (spread @ w) * 0.25


def spread_identity(v, w):
    return ((v @ w) * 0.25) * 4.0  # the scale undone: v @ w


def spread_halved(v, w):
    return (v @ w) * 0.5  # BUG: at 2 spread rows, 2 x 0.25 is 0.5: only the real count tells


@pytest.mark.usefixtures("scales_at_any_size")
def test_a_scale_whose_value_the_pair_needs_is_checked_again_with_its_class_kept() -> None:
    # with 1/4 and 4 standing for 1/s and s, the spec is 4 (1/s) v w (2 (1/s) v w at 2
    # spread rows) and the implementation v w: not equal for every s, nor at s = 4 with 2
    # rows (the reduced pair differs concretely, so no proof is tried): the pair is checked
    # with the class of 4 kept, where it holds
    args = (f32(8, 16), f32(16, 16))
    reduced, _ = both(spread_identity, *args, spec=spread_spec, expect="equivalent")
    assert any("scales standing for any values" in n for n in reduced.notes), reduced.notes


@pytest.mark.usefixtures("scales_at_any_size")
def test_a_scale_read_at_its_own_value_would_prove_a_bug_that_any_value_refutes() -> None:
    # with 1/4 read as a fixed number and the spread rows at 2, the reduced pair is equal
    # (2 x 0.25 = 0.5): the symbol's proof fails and the class kept refutes the bug
    both(spread_halved, f32(8, 16), f32(16, 16), spec=spread_spec, expect="not_equivalent")
