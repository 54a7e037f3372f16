"""gather / scatter with indices computed from integer inputs, and sort on input keys:
proved by case analysis, refuted with counterexamples that replay in JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tv_ir

X = np.arange(6, dtype=np.float32)
IDX = np.array([1, 4, 0], np.int32)


def lower(f, *args) -> str:
    return jax.jit(f).lower(*args).as_text(debug_info=True)


def take(x, idx):  # gather, out-of-range indices clamped
    return jnp.take(x, idx, mode="clip")


def one_hot_take(x, idx):
    pos = jnp.clip(idx, 0, x.shape[0] - 1)
    hit = jnp.arange(x.shape[0])[None, :] == pos[:, None]
    return jnp.sum(jnp.where(hit, x[None, :], 0.0), axis=1)


def one_hot_take_unclamped(x, idx):  # wrong for indices outside [0, 5]
    hit = jnp.arange(x.shape[0])[None, :] == idx[:, None]
    return jnp.sum(jnp.where(hit, x[None, :], 0.0), axis=1)


def shifted_take(x, idx):  # reads one element to the right
    return jnp.take(x, idx + 1, mode="clip")


def put(x, idx, u):  # scatter-add; out-of-range updates dropped
    return jnp.asarray(x).at[idx].add(u, mode="drop")


def one_hot_put(x, idx, u):
    idx = jnp.where(idx < 0, idx + x.shape[0], idx)  # JAX counts negative indices from the end
    hit = jnp.arange(x.shape[0])[None, :] == idx[:, None]
    return x + jnp.sum(jnp.where(hit, u[:, None], 0.0), axis=0)


def one_hot_put_wrong(x, idx, u):  # adds only the first update
    hit = jnp.arange(x.shape[0]) == idx[0]
    return x + jnp.where(hit, u[0], 0.0)


def test_gather_with_input_indices_equals_its_one_hot_form():
    r = tv_ir.check(lower(take, X, IDX), lower(one_hot_take, X, IDX))
    assert r.verdict == "equivalent", str(r)


@pytest.mark.parametrize("impl", [one_hot_take_unclamped, shifted_take])
def test_wrong_index_arithmetic_is_refuted_with_integer_inputs(impl):
    r = tv_ir.check(lower(take, X, IDX), lower(impl, X, IDX))
    assert r.verdict == "not_equivalent", str(r)
    x, idx = (np.asarray(v) for v in r.counterexample.inputs.values())
    idx = idx.astype(np.int32)
    want = np.asarray(take(x.astype(np.float32), idx))
    got = np.asarray(impl(x.astype(np.float32), idx))
    i = r.counterexample.index
    assert want[i] == pytest.approx(r.counterexample.expected)
    assert got[i] == pytest.approx(r.counterexample.actual)
    assert want[i] != got[i]


def test_scatter_with_input_indices_equals_its_one_hot_form():
    u = np.ones(3, np.float32)
    r = tv_ir.check(lower(put, X, IDX, u), lower(one_hot_put, X, IDX, u))
    assert r.verdict == "equivalent", str(r)


def test_scatter_dropping_updates_is_refuted():
    u = np.ones(3, np.float32)
    r = tv_ir.check(lower(put, X, IDX, u), lower(one_hot_put_wrong, X, IDX, u))
    assert r.verdict == "not_equivalent", str(r)
    x, idx, uu = (np.asarray(v) for v in r.counterexample.inputs.values())
    args = (x.astype(np.float32), idx.astype(np.int32), uu.astype(np.float32))
    i = r.counterexample.index
    assert np.asarray(put(*args))[i] != np.asarray(one_hot_put_wrong(*args))[i]


IDX6 = np.array([1, 1, 9, 1, -2, 0], np.int32)  # colliding, out of range, negative
U6 = np.arange(1, 7, dtype=np.float32)


def put_in_halves(x, idx, u):  # what a psum of two devices' scatter-adds computes
    return put(x, idx[:3], u[:3]) + put(jnp.zeros_like(x), idx[3:], u[3:])


def put_in_halves_one_lost(x, idx, u):  # the second half's last update never lands
    return put(x, idx[:3], u[:3]) + put(jnp.zeros_like(x), idx[3:5], u[3:5])


def test_scatter_add_over_a_batch_is_the_sum_over_its_halves():
    assert np.array_equal(put(X, IDX6, U6), put_in_halves(X, IDX6, U6))  # XLA agrees
    r = tv_ir.check(lower(put, X, IDX6, U6), lower(put_in_halves, X, IDX6, U6))
    assert r.verdict == "equivalent", str(r)
    assert r.stats.proved_by_z3 == 0, r.stats  # equal normal forms, no case split


def test_scatter_add_losing_an_update_is_refuted():
    r = tv_ir.check(lower(put, X, IDX6, U6), lower(put_in_halves_one_lost, X, IDX6, U6))
    assert r.verdict == "not_equivalent", str(r)
    x, idx, u = (np.asarray(v) for v in r.counterexample.inputs.values())
    args = (x.astype(np.float32), idx.astype(np.int32), u.astype(np.float32))
    i = r.counterexample.index
    assert np.asarray(put(*args))[i] != np.asarray(put_in_halves_one_lost(*args))[i]


def test_jax_is_the_oracle_for_the_programs_above():
    assert np.array_equal(take(X, IDX), one_hot_take(X, IDX))
    assert jax.device_count() >= 1


V = np.array([3.0, -1.0, 2.0, 0.5], np.float32)


def test_sort_on_input_keys_is_a_selection_network():
    r = tv_ir.check(lower(lambda v: jnp.sort(v)[-1], V), lower(jnp.max, V))
    assert r.verdict == "equivalent", str(r)
    pairs = lower(lambda v: jnp.sort(jnp.stack([v, -v]), axis=1)[:, 0], V)
    r = tv_ir.check(pairs, lower(lambda v: jnp.stack([jnp.min(v), -jnp.max(v)]), V))
    assert r.verdict == "equivalent", str(r)


def test_sorting_the_wrong_way_is_refuted():
    r = tv_ir.check(lower(lambda v: jnp.sort(v)[0], V), lower(jnp.max, V))
    assert r.verdict == "not_equivalent", str(r)
    (v,) = (np.asarray(a, np.float32) for a in r.counterexample.inputs.values())
    assert np.sort(v)[0] != np.max(v)


def test_bitwise_ops_on_input_integers_are_unknown_not_logical():
    # `or` on integers is bitwise; terms have no bits, so tv must not read it as logical or
    i = np.array([3, 4], np.int32)
    r = tv_ir.check(lower(lambda a: a | 0, i), lower(lambda a: a * 1, i))
    assert r.verdict == "unknown" and "bitwise" in r.reason, str(r)


def test_reducing_an_empty_axis_symbolically():
    x = np.ones((2, 0), np.float32)
    r = tv_ir.check(
        lower(lambda a: a.sum(axis=1), x), lower(lambda a: jnp.zeros(2) + a.max(initial=0.0), x)
    )
    assert r.verdict == "equivalent", str(r)


def min_put(x, idx, u):  # scatter-min; out-of-range updates dropped
    return jnp.asarray(x).at[idx].min(u, mode="drop")


def min_put_by_halves(x, idx, u):  # as a partitioner writes it: halves padded with +inf
    pad = jnp.full_like(x, jnp.inf)
    lo = pad.at[idx[:2]].min(u[:2], mode="drop")
    hi = pad.at[idx[2:]].min(u[2:], mode="drop")
    return jnp.minimum(x, jnp.minimum(hi, lo))


def min_put_padded_with_zero(x, idx, u):  # the wrong identity: 0 where nothing lands
    pad = jnp.zeros_like(x)
    return jnp.minimum(x, pad.at[idx].min(u, mode="drop"))


def max_put_reversed(x, idx, u):
    return jnp.asarray(x).at[idx[::-1]].max(u[::-1], mode="drop")


U4 = np.array([0.5, -1.0, 2.0, 3.0], np.float32)
IDX4 = np.array([1, 4, 1, 0], np.int32)


def test_min_scatter_padded_with_its_identity_and_combined_is_proved():
    # the partitioned form of a min scatter (each part's updates into +inf, then a min
    # across the parts): guarded items of one flat min; +inf only ever weighed by order
    r = tv_ir.check(lower(min_put, X, IDX4, U4), lower(min_put_by_halves, X, IDX4, U4))
    assert r.verdict == "equivalent", str(r)
    spec = lower(lambda x, i, u: x.at[i].max(u, mode="drop"), X, IDX4, U4)
    r = tv_ir.check(spec, lower(max_put_reversed, X, IDX4, U4))
    assert r.verdict == "equivalent", str(r)


def test_min_scatter_padded_with_the_wrong_identity_is_refuted():
    r = tv_ir.check(lower(min_put, X, IDX4, U4), lower(min_put_padded_with_zero, X, IDX4, U4))
    assert r.verdict == "not_equivalent", str(r)
    x, i, u = (np.asarray(a) for a in r.counterexample.inputs.values())
    assert not np.array_equal(min_put(x, i, u), min_put_padded_with_zero(x, i, u))


def test_min_scatter_that_loses_an_update_is_refuted():
    # indices clamped, so every update lands and random inputs show the loss (with dropped
    # out-of-bounds indices the difference is left to the solver, whose model may put an
    # update within float32 rounding of the value it should replace: then no replay)
    def clipped(x, idx, u):
        return jnp.asarray(x).at[idx].min(u, mode="clip")

    def drops_last(x, idx, u):
        return jnp.minimum(x, jnp.full_like(x, jnp.inf).at[idx[:3]].min(u[:3], mode="clip"))

    r = tv_ir.check(lower(clipped, X, IDX4, U4), lower(drops_last, X, IDX4, U4))
    assert r.verdict == "not_equivalent", str(r)
    x, i, u = (np.asarray(a) for a in r.counterexample.inputs.values())
    assert not np.array_equal(clipped(x, i, u), drops_last(x, i, u))
