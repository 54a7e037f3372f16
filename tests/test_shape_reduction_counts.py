"""Counts compared (passes/shape_reduction/counts.py): a sum of bounded values over a class
(how many pad tokens a row holds) lies in a range that grows with the class, so where a
comparison reads it the class keeps its size; where it is only computed with (a loss
normalised by its token count) the class still shrinks.

Each of these bugs was once proved `equivalent`: at the reduced size of 2 a row cannot hold
3 pad tokens, and random inputs never hold an exact 1.0 nor often 3 pad tokens in a row,
so the concrete confirmations agreed too."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from test_shape_reduction import F32, I32, S, both, kept, mesh, shrunk
from tv_ir.frontends.jax import verify

from tv_ir.prover import real_size

B, T = 4, 16
PAD = 7


def row_sum(x):
    return jnp.sum(x, axis=-1)


def row_sum_unless_three_ones(x):
    return jnp.where(jnp.sum(x == 1.0, axis=-1) >= 3, 0.0, jnp.sum(x, axis=-1))  # BUG


def masked_sum(tok, w):
    return jnp.sum(jnp.where(tok != PAD, w, 0.0), axis=-1)


def masked_sum_dropping_padded_rows(tok, w):
    s = jnp.sum(jnp.where(tok != PAD, w, 0.0), axis=-1)
    return jnp.where(jnp.sum(tok == PAD, axis=-1) > 2, 0.0, s)  # BUG: drops rows of 3+ pads


def sigmoid_total(x):
    return jnp.sum(x, axis=-1)


def sigmoid_total_clipped(x):
    total = jnp.sum(jax.nn.sigmoid(x), axis=-1)
    return jnp.where(total > 2.5, 0.0, jnp.sum(x, axis=-1))  # BUG: sums of 3+ sigmoids


def masked_mean_loss(tok, logits):
    """A loss normalised by its token count: computed with, never compared."""
    m = (tok != PAD).astype(F32)
    return jnp.sum(logits * m) / jnp.sum(m)


def masked_mean_loss_in_steps(tok, logits):
    m = jnp.where(tok == PAD, 0.0, 1.0)
    per_row = jnp.sum(logits * m, axis=-1)
    return jnp.sum(per_row) / jnp.sum(jnp.sum(m, axis=-1))


def _seq_kept(report) -> str:
    return kept(report).get("spec argument 0 dim 1", "")


def test_a_count_of_exact_values_compared_is_refuted() -> None:
    x = S((B, T), F32)
    reduced, _ = both(row_sum_unless_three_ones, x, spec=row_sum, expect="not_equivalent")
    assert "is compared by compare" in _seq_kept(reduced), reduced.reduction["summary"]


def test_a_count_of_pad_tokens_compared_is_refuted() -> None:
    args = (S((B, T), I32), S((B, T), F32))
    reduced, _ = both(
        masked_sum_dropping_padded_rows, *args, spec=masked_sum, expect="not_equivalent"
    )
    assert "is compared by compare" in _seq_kept(reduced), reduced.reduction["summary"]


def _verify_with_the_sequence_split(impl):
    """`impl` under jit, the sequence split over "model" (each device counts its part, XLA
    adds them), against `masked_sum`."""
    m = mesh()
    split = NamedSharding(m, P("data", "model"))
    jitted = jax.jit(impl, in_shardings=(split, split), out_shardings=NamedSharding(m, P("data")))
    return verify(jitted, S((B, T), I32), S((B, T), F32), spec=masked_sum)


def test_a_count_of_pad_tokens_compared_is_refuted_under_jit_with_shardings() -> None:
    report = _verify_with_the_sequence_split(masked_sum_dropping_padded_rows)
    assert report.verdict == "not_equivalent", str(report)
    tok = np.array(report.counterexample.inputs["tok"])
    assert (np.sum(tok == PAD, axis=-1) > 2).any(), tok  # the rows the bug drops


def test_a_sum_of_sigmoids_compared_is_refuted() -> None:
    x = S((B, T), F32)
    reduced, _ = both(sigmoid_total_clipped, x, spec=sigmoid_total, expect="not_equivalent")
    assert "is compared by compare" in _seq_kept(reduced), reduced.reduction["summary"]


def test_a_count_compared_is_refuted_when_the_real_programs_are_too_large(monkeypatch) -> None:
    """No concrete run at the real sizes: the class kept, the pair is checked at them."""
    monkeypatch.setattr(real_size, "REPLAY_LIMIT", 0)
    args = (S((B, T), I32), S((B, T), F32))
    report = verify(masked_sum_dropping_padded_rows, *args, spec=masked_sum)
    assert report.verdict == "not_equivalent", str(report)


def test_a_loss_normalised_by_its_token_count_still_shrinks() -> None:
    args = (S((B, T), I32), S((B, T), F32))
    for impl in (masked_mean_loss, masked_mean_loss_in_steps):
        reduced, _ = both(impl, *args, spec=masked_mean_loss, expect="equivalent")
        assert "spec argument 0 dim 1" in shrunk(reduced), reduced.reduction["summary"]


# -- counts summed over devices: mesh reduction (passes/mesh_reduction/device_counts.py) --


def _psum_dropping_padded_rows(tok, w):
    s = jax.lax.psum(jnp.sum(jnp.where(tok != PAD, w, 0.0), axis=-1), "model")
    n = jax.lax.psum(jnp.sum(tok == PAD, axis=-1), "model")
    return jnp.where(n > 6, 0.0, s)  # BUG: drops rows of 7+ pads (at most 4 on 2 devices)


def masked_sum_dropping_rows_of_nine_pads(tok, w):
    s = jnp.sum(jnp.where(tok != PAD, w, 0.0), axis=-1)
    return jnp.where(jnp.sum(tok == PAD, axis=-1) > 8, 0.0, s)  # BUG: drops rows of 9+ pads


def test_a_count_summed_over_devices_and_compared_is_refuted() -> None:
    """Each of 4 "model" devices counts its 4 tokens and `psum` adds them: on 2 devices a
    row holds at most 8 of them, so "model" keeps its 4 devices."""
    impl = jax.shard_map(
        _psum_dropping_padded_rows,
        mesh=mesh(),
        in_specs=(P(None, "model"), P(None, "model")),
        out_specs=P(),
    )
    report = verify(impl, S((B, T), I32), S((B, T), F32), spec=masked_sum)
    assert report.verdict == "not_equivalent", str(report)
    assert not (report.mesh_reduction or {}).get("reduced"), report.mesh_reduction


def test_a_count_summed_by_xla_over_devices_and_compared_is_refuted() -> None:
    """The same under jit: on 2 of the 4 "model" devices a row holds at most 8 pad tokens."""
    report = _verify_with_the_sequence_split(masked_sum_dropping_rows_of_nine_pads)
    assert report.verdict == "not_equivalent", str(report)


def count_in_int32(m):
    return jnp.sum(m.astype(I32), axis=-1)


def count_in_int8(m):
    return jnp.sum(m.astype(jnp.int8), axis=-1, dtype=jnp.int8).astype(I32)  # BUG: wraps


def test_a_count_in_eight_bits_wraps_past_127() -> None:
    """A mask of 200 counted in int8 wraps at 128 (200 ones: -56); at the reduced length it
    never does, and random masks hold about 100 ones: the class keeps its size."""
    m = S((2, 200), jnp.bool_)
    reduced, _ = both(count_in_int8, m, spec=count_in_int32, expect="not_equivalent")
    why = _seq_kept(reduced)
    assert "can pass the i8 range" in why or "wraps in i8" in why, reduced.reduction["summary"]


def guarded_masked_mean(tok, w):
    m = (tok != PAD).astype(F32)
    return jnp.sum(w * m, axis=-1) / jnp.maximum(jnp.sum(m, axis=-1), 1.0)


def guarded_masked_mean_in_steps(tok, w):
    m = jnp.where(tok == PAD, 0.0, 1.0)
    per_row = jnp.sum(w * m, axis=-1)
    return per_row / jnp.maximum(jnp.sum(m, axis=-1), 1.0)


def sum_of_kept_rows(tok, w):
    n = jnp.sum(tok != PAD, axis=-1)
    return jnp.where(n > 0, jnp.sum(w * (tok != PAD), axis=-1), 0.0)


def sum_of_kept_rows_in_steps(tok, w):
    m = (tok != PAD).astype(F32)
    kept = jnp.sum(m, axis=-1) > 0
    return jnp.where(kept, jnp.sum(m * w, axis=-1), 0.0)


def test_a_count_guarded_against_zero_still_shrinks() -> None:
    """`maximum(count, 1)` and `count > 0` ask only whether the count is 0, 1 or more, which
    2 positions show as the real size does: the class shrinks (a threshold of 2 keeps it,
    above)."""
    args = (S((B, T), I32), S((B, T), F32))
    for impl, spec in (
        (guarded_masked_mean_in_steps, guarded_masked_mean),
        (sum_of_kept_rows_in_steps, sum_of_kept_rows),
    ):
        reduced, _ = both(impl, *args, spec=spec, expect="equivalent")
        assert "spec argument 0 dim 1" in shrunk(reduced), reduced.reduction["summary"]


# -- bounded values the ranges follow through how operands relate (a second sweep) --------


def _kept_by_reduction(fn, *args) -> dict[str, str]:
    """The classes shape reduction keeps for `fn` against `jnp.sum(x, -1)`, and why (the
    reduction alone: these pairs' proofs at the real sizes are long)."""
    from tv_ir.passes.shape_reduction import reduce_pair

    from tv_ir.pipeline import prepare
    from tv_ir.prover.placement import Placement

    spec_text = jax.jit(lambda x, *rest: jnp.sum(x, axis=-1)).lower(*args).as_text()
    spec = prepare(spec_text, "spec")
    impl = prepare(jax.jit(fn).lower(*args).as_text(), "impl")
    red = reduce_pair(spec, impl, Placement.from_module(spec.main, impl))
    return {c["name"]: c["kept"] for c in red.to_json()["classes"] if c["kept"]}


def _dropped_past(statistic, threshold):
    def impl(x, *rest):
        return jnp.where(statistic(x, *rest) > threshold, 0.0, jnp.sum(x, axis=-1))

    return impl


SECOND_SWEEP = {
    # a softmax's probabilities summed over tokens: an expert's load, over a capacity
    "softmax load": lambda x: jnp.sum(jax.nn.softmax(x, axis=0), axis=0)[:1].repeat(B),
    # the top gate of each token, summed (a max of sigmoids: the -inf start is no bound)
    "top gate mass": lambda x: jnp.sum(jnp.max(jax.nn.sigmoid(x), axis=0)) + 0 * x[:, 0],
    "rbf density": lambda x: jnp.sum(jnp.exp(-x * x), axis=-1),
    "unit rows": lambda x: jnp.sum(x / jnp.sqrt(jnp.sum(x * x, -1, keepdims=True)) + 1, -1),
    "hard decisions": lambda x: jnp.sum(jnp.round(jax.nn.sigmoid(x)), axis=-1),
}


@pytest.mark.parametrize("name", sorted(SECOND_SWEEP))
def test_a_bounded_statistic_compared_keeps_its_class(name) -> None:
    """Each was proved `equivalent` at a reduced size that cannot reach the threshold; the
    ranges now follow softmax shares, maxima of bounded values, -x * x, x / |x|, rounding
    and abs."""
    kept = _kept_by_reduction(_dropped_past(SECOND_SWEEP[name], 10.5), S((B, T), F32))
    assert any("its count" in why for why in kept.values()), kept


def test_a_count_past_a_kink_keeps_its_class() -> None:
    """`abs(load - 12)`: its kink lies past what 2 positions can sum to (it was proved equal
    to `12 - load`); `abs` of a count of 0 / 1 values (>= 0) has no kink in reach."""
    kept = _kept_by_reduction(
        lambda x: jnp.abs(jnp.sum(jax.nn.sigmoid(x), axis=-1) - 12.0), S((B, T), F32)
    )
    assert any("compared by abs" in why for why in kept.values()), kept


def test_a_count_against_another_count_plus_a_margin_is_refuted() -> None:
    def impl(x, y):
        ca, cb = jnp.sum(jnp.abs(x) > 2.5, axis=-1), jnp.sum(jnp.abs(y) > 2.5, axis=-1)
        return jnp.where(ca > cb + 2, 0.0, jnp.sum(x, axis=-1))  # BUG: rows of 3+ more

    report = verify(impl, S((B, T), F32), S((B, T), F32), spec=lambda x, y: jnp.sum(x, -1))
    assert report.verdict == "not_equivalent", str(report)


def test_narrow_pixels_summed_in_a_narrow_accumulator_wrap() -> None:
    """uint8 pixels summed over 512 in uint16 wrap (all 255: 65024, not 130560); 2 never do."""
    x = S((2, 512), jnp.uint8)
    report = verify(
        lambda x: jnp.sum(x.astype(jnp.uint16), -1, dtype=jnp.uint16).astype(I32),
        x,
        spec=lambda x: jnp.sum(x.astype(I32), -1),
    )
    assert report.verdict == "not_equivalent", str(report)


# -- values bounded on one side only, and ops the ranges did not follow (a third sweep) -------

ONE_SIDED = {
    # >= -1 each: 16 of them sum to -16, 2 to no less than -2
    "squares less one": (lambda x: jnp.sum(x * x - 1.0, axis=-1), "<", -10.0),
    # <= 0.5 each (softplus >= 0 through its log1p and its NaN guard)
    "negated softplus": (lambda x: jnp.sum(0.5 - jax.nn.softplus(x), axis=-1), ">", 3.0),
    # unknown ops, now followed: atan2 in [-pi, pi], erf in [-1, 1], log1p increasing
    "arctan": (lambda x: jnp.sum(jnp.arctan2(x, 1.0), axis=-1), ">", 4.0),
    "erf": (lambda x: jnp.sum(jax.scipy.special.erf(x), axis=-1), ">", 3.0),
    "log1p of squares": (lambda x: jnp.sum(jnp.log1p(x * x) - 1.0, axis=-1), "<", -3.0),
}


@pytest.mark.parametrize("name", sorted(ONE_SIDED))
def test_a_statistic_bounded_on_one_side_compared_keeps_its_class(name) -> None:
    """Each was proved `equivalent` (`squares less one`, `negated softplus`) or escaped the
    ranges (an unknown op reads as unbounded, whose sums are no counts): a sum of values
    with a finite end on the far side of 0 grows with the class at that end."""
    statistic, direction, threshold = ONE_SIDED[name]

    def impl(x):
        s = statistic(x)
        dropped = s < threshold if direction == "<" else s > threshold
        return jnp.where(dropped, 0.0, jnp.sum(x, axis=-1))

    kept = _kept_by_reduction(impl, S((B, T), F32))
    assert any("its count" in why for why in kept.values()), kept


def test_a_sum_of_squares_less_one_compared_is_refuted() -> None:
    """At 2 positions `sum(x * x - 1)` is at least -2 and never below -10: the reduced pair
    was equal and random inputs at 16 rarely sum below -10 (chi-square with 16 degrees)."""

    def impl(x):
        return jnp.where(jnp.sum(x * x - 1.0, axis=-1) < -10.0, 0.0, jnp.sum(x, axis=-1))  # BUG

    report = verify(impl, S((B, T), F32), spec=row_sum)
    assert report.verdict == "not_equivalent", str(report)


def test_a_sum_of_squares_compared_still_shrinks() -> None:
    """A sum of values >= 0 (a squared norm against a clipping threshold) is any value >= 0
    over any number of positions: its class shrinks."""

    def impl(x):
        return jnp.where(jnp.sum(x * x, axis=-1) > 10.0, 0.0, jnp.sum(x, axis=-1))

    kept = _kept_by_reduction(impl, S((B, T), F32))
    assert not any("its count" in why for why in kept.values()), kept


# -- a third sweep (forty-seventh session): shares of a sum, counts against other counts'
# maxima, integer sums that pass their type's range at the real size only ------------------

SHARES = {
    "soft_sign": lambda x: jnp.sum(jax.nn.soft_sign(x), axis=-1),
    "x2 share": lambda x: jnp.einsum("bt->b", x * x / (1.0 + x * x)),
    "smooth sign": lambda x: jnp.sum(x * jax.lax.rsqrt(x * x + 1.0), axis=-1),
    "smooth sign by sqrt": lambda x: jnp.sum(x / jnp.sqrt(x * x + 1.0), axis=-1),
    "two-way softmax": lambda x: jnp.sum(jnp.exp(x) / (jnp.exp(x) + jnp.exp(-x)), axis=-1),
}


@pytest.mark.parametrize("name", sorted(SHARES))
def test_a_share_of_a_sum_of_nonnegatives_is_bounded(name) -> None:
    """`x / (|x| + 1)`, `x * x / (1 + x * x)`, `x * rsqrt(x * x + 1)` and a softmax over two
    written by hand lie in [-1, 1] whatever x: the ranges read them off the denominator, a
    sum of values >= 0 one of which bounds the numerator. Each was proved `equivalent`
    when its sum was compared with a constant the reduced size cannot reach."""
    kept = _kept_by_reduction(_dropped_past(SHARES[name], 10.0), S((B, T), F32))
    assert any("its count" in why for why in kept.values()), kept


def load_imbalanced(x, r):
    """An MoE load check: tokens routed top-1 to 4 experts; a step whose busiest expert
    holds 10 tokens past the mean load is scaled down."""
    load = jnp.sum(jax.nn.one_hot(jnp.argmax(r, -1), 4), axis=0)
    return jnp.where(jnp.max(load) > jnp.mean(load) + 10.0, 0.5, 1.0) * jnp.sum(x, axis=0)


def test_a_count_against_the_maximum_of_other_counts_is_refuted() -> None:
    """A count against its own maximum (`x == max(x)`) does not keep its class; against the
    maximum of another value (`max(load) > mean(load) + 10`) it does: at 2 tokens no expert
    holds 10 more than the mean, at 16 all of them on one expert do."""
    args = (S((16, 8), F32), S((16, 4), F32))
    report = verify(load_imbalanced, *args, spec=lambda x, r: jnp.sum(x, axis=0))
    assert report.verdict == "not_equivalent", str(report)


INTEGER_SUMS = {
    # the mean pixel of 256 uint8 images of 224 x 224 x 3 summed in int32: up to 9.9e9
    "uint8 pixels in int32": (
        lambda x: jnp.sum(x.astype(I32)).astype(F32),
        lambda x: jnp.sum(x.astype(F32)),
        S((256, 224, 224, 3), jnp.uint8),
    ),
    # int8 weights times int8 activations accumulated in int32 over 2^17: up to 2^31
    "int8 dot in int32": (
        lambda x, w: jnp.einsum("bk,k->b", x, w, preferred_element_type=I32).astype(F32),
        lambda x, w: jnp.einsum("bk,k->b", x.astype(F32), w.astype(F32)),
        S((2, 2**17), jnp.int8),
        S((2**17,), jnp.int8),
    ),
}


@pytest.mark.parametrize("name", sorted(INTEGER_SUMS))
def test_an_integer_sum_that_can_pass_its_range_keeps_its_class(name) -> None:
    """Two narrow values summed in int32 never wrap; 256 x 224 x 224 x 3 of them can (the
    mean pixel of random images was 16.0 instead of 127.5, proved `equivalent`)."""
    from tv_ir.passes.shape_reduction import reduce_pair

    from tv_ir.pipeline import prepare
    from tv_ir.prover.placement import Placement

    fn, spec_fn, *args = INTEGER_SUMS[name]
    spec = prepare(jax.jit(spec_fn).lower(*args).as_text(), "spec")
    impl = prepare(jax.jit(fn).lower(*args).as_text(), "impl")
    red = reduce_pair(spec, impl, Placement.from_module(spec.main, impl))
    kept = {c["name"]: c["kept"] for c in red.to_json()["classes"] if c["kept"]}
    assert any("can pass the i32 range" in why for why in kept.values()), kept


def test_an_integer_sum_over_devices_that_can_pass_its_range_keeps_the_axis() -> None:
    """Each of 8 devices sums its 32,768 int16 samples in int32 (at most 1.07e9); the
    all-reduce of the 8 sums can reach 8.6e9 and wrap, 2 devices' sums never do."""
    from jax.sharding import Mesh

    m = Mesh(np.array(jax.devices()[:8]), ("data",))
    fn = jax.jit(
        lambda x: jnp.sum(x.astype(I32)).astype(F32),
        in_shardings=NamedSharding(m, P("data")),
        out_shardings=NamedSharding(m, P()),
    )
    x = S((8 * 2**15,), jnp.int16)
    report = verify(fn, x, spec=lambda x: jnp.sum(x.astype(F32)), time_limit=10)
    assert report.verdict != "equivalent", str(report)
    assert "can pass the i32 range" in " ".join(report.notes), report.notes


def test_a_product_with_a_sum_holding_its_factor_is_no_share() -> None:
    """`e * (e + 1)` (e = exp(x) >= 0) is unbounded: only a quotient of such a sum, or a
    product with its rsqrt, is a share. Read as one in [0, 1], a count of 0 / 1 values met
    by it through `maximum` would pass as met by a threshold of at most 1, and shrink."""

    def impl(x):
        e = jnp.exp(x)
        n = jnp.sum(x > 0.0, axis=-1).astype(F32)
        return jnp.sum(jnp.maximum(n[:, None], e * (e + 1.0)), axis=-1)

    kept = _kept_by_reduction(impl, S((B, T), F32))
    assert any("its count" in why for why in kept.values()), kept
