"""Shape reduction's witnesses: the reduced pair again with classes one step larger, checked
concretely before a proof at reduced shapes is trusted (when the real programs are too large
to run). Classes grow together in a few witnesses (`separating_groups`) instead of one
witness each: each class still grows in one, and every two classes are apart in one.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import pytest
from test_shape_reduction import f32
from tv_ir.frontends.jax import verify
from tv_ir.passes import shape_reduction
from tv_ir.passes.shape_reduction.factors import separating_groups

from tv_ir.prover import real_size

N, A, B = 16, 12, 20  # a summed dimension, and two that shrink to 1


@pytest.mark.parametrize("n", range(1, 70))
def test_groups_grow_every_class_and_tell_every_two_apart(n) -> None:
    groups = separating_groups(n)
    assert len(groups) == n.bit_length()
    assert set(itertools.chain.from_iterable(groups)) == set(range(n))
    for i, j in itertools.combinations(range(n), 2):
        assert any((i in g) != (j in g) for g in groups), (i, j, groups)


def sum_spec(x):
    return jnp.sum(x, axis=0) * 2.0


def max_plus_min(x):  # the sum of 2 positions, not of 16
    return (jnp.max(x, axis=0) + jnp.min(x, axis=0)) * 2.0


def sum_ok(x):
    return jnp.sum(x[: N // 2], axis=0) * 2.0 + jnp.sum(x[N // 2 :], axis=0) * 2.0


@pytest.fixture
def too_large_to_run(monkeypatch):
    """As if the real programs could not run: proofs are confirmed on the witnesses."""
    monkeypatch.setattr(real_size, "REPLAY_LIMIT", 0)


def test_bug_seen_only_one_class_larger_is_not_proved(too_large_to_run) -> None:
    report = verify(max_plus_min, f32(N, A, B), spec=sum_spec)
    assert report.verdict == "unknown", str(report)
    # the group that grew the summed dimension differed; its own witness names it
    assert "spec argument 0 dim 0 at 4 positions instead of 2" in report.reason, report.reason


@pytest.mark.parametrize("grouped", [True, False])
def test_equal_pair_is_confirmed_in_fewer_checks(too_large_to_run, monkeypatch, grouped) -> None:
    monkeypatch.setattr(shape_reduction, "WITNESS_GROUPS", grouped)
    report = verify(sum_ok, f32(N, A, B), spec=sum_spec)
    assert report.verdict == "equivalent", str(report)
    checks = "2 checks" if grouped else "3 checks"
    assert any(f"(3 classes in {checks})" in n for n in report.notes), report.notes


def _recomputed(d, factor, roots):
    """The witness factors as first written: every merged dimension recomputed recursively."""
    from tv_ir.passes.shape_reduction.factors import _definitions, _value, smallest_prime

    defs = _definitions(d)
    other = dict(factor)
    for r in roots:
        other[r] = factor[r] // smallest_prime(factor[r])
    for whole in defs:
        vals = _value(defs, other, whole)
        if len(vals) != 1:
            return None
        other[whole] = vals.pop()
    return other


def test_merged_dimensions_grow_with_their_parts_only() -> None:
    """heads x head_dim = hidden, hidden x seq = tokens (two levels of merged dimensions) and
    a second definition of hidden: growing a part regrows exactly the wholes that read it."""
    from tv_ir.passes.shape_reduction.classes import DimClasses
    from tv_ir.passes.shape_reduction.factors import MergedDims, grown

    d = DimClasses()
    heads, head_dim, hidden, seq, tokens, other_hidden, batch = (
        d.add(("v", i), n) for i, n in enumerate([8, 16, 128, 32, 4096, 128, 4])
    )
    d.product(hidden, (heads, head_dim))
    d.product(hidden, (other_hidden,))
    d.product(tokens, (hidden, seq))
    factor = {heads: 4, head_dim: 8, other_hidden: 32, hidden: 32, seq: 8, tokens: 256, batch: 2}
    merged = MergedDims(d, factor)
    assert merged.order is not None
    for roots in ([heads], [seq], [batch], [heads, seq], [other_hidden], [heads, head_dim]):
        assert merged.grown(roots) == _recomputed(d, factor, roots), roots
        assert grown(d, factor, roots) == _recomputed(d, factor, roots), roots
    assert merged.grown([batch])[tokens] == 256  # nothing it reads grew
    assert merged.grown([seq])[tokens] == 128
    assert merged.grown([heads]) is None  # hidden's two definitions would disagree


def _layernorm(x, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / jnp.sqrt(v + eps)


def _block(x, w1, w2):
    return _layernorm(x + jax.nn.gelu(x @ w1) @ w2)


def _block_without_residual(x, w1, w2):
    return _layernorm(jax.nn.gelu(x @ w1) @ w2)  # BUG: the residual x + ... dropped


def test_a_faint_counterexample_gives_way_to_a_clear_one() -> None:
    """A residual dropped before a layernorm: the reduced counterexample, blown up, gives
    rows of two values per half, whose layernorms with and without the residual agree but
    for eps (the report printed expected == actual, 2.00773521, a difference of 6e-9); the
    random inputs at the real sizes show the bug plainly."""
    args = (f32(8, 8), f32(8, 16), f32(16, 8))
    report = verify(_block_without_residual, *args, spec=_block)
    assert report.verdict == "not_equivalent", str(report)
    assert report.counterexample.max_abs_diff > 1e-3, str(report)
