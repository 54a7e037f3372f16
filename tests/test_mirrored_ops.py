"""Element-wise stages that mirror a spec op on the same terms at the same box are cut
without computing their terms (tv_ir/prover/mirrored_ops.py); anything else is not."""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import tv_ir
from tv_ir.prover import engine

ARGS = (jax.ShapeDtypeStruct((4, 6), jnp.float32), jax.ShapeDtypeStruct((4, 6), jnp.float32))


def spec(x, y):
    return jnp.tanh(x * y + x) / (1.0 + y * y)


def sharded(body):
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    return jax.shard_map(
        body, mesh=mesh, in_specs=(P("data"), P("data")), out_specs=P("data"), check_vma=False
    )


def shifted(x, y):
    """y from the other device: the same ops on another block of y."""
    return spec(x, jax.lax.ppermute(y, "data", [(0, 1), (1, 0)]))


def other_op(x, y):
    return jnp.tanh(x * y - x) / (1.0 + y * y)  # BUG: subtracts


def other_constant(x, y):
    return jnp.tanh(x * y + x) / (1.5 + y * y)


def lowered(fn) -> str:
    return jax.jit(fn).lower(*ARGS).as_text(debug_info=True)


def line_of(fn, marker: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if marker in line)


def test_elementwise_ops_on_the_spec_blocks_are_mirrored():
    report = tv_ir.check(lowered(spec), lowered(sharded(spec)))
    assert report.verdict == "equivalent"
    assert report.stats.mirrored_stages >= 4  # multiply, add, tanh, divide...
    assert "mirroring a spec op" in str(report)


def test_verdicts_agree_without_mirroring(monkeypatch):
    impls = [sharded(f) for f in (spec, shifted, other_op, other_constant)]
    with_ = [tv_ir.check(lowered(spec), lowered(f)) for f in impls]
    monkeypatch.setattr(engine, "mirrored_cut", lambda *args: None)
    without = [tv_ir.check(lowered(spec), lowered(f)) for f in impls]
    assert [r.verdict for r in with_] == [r.verdict for r in without]
    assert [r.verdict for r in with_][1:] == ["not_equivalent"] * 3
    assert without[0].stats.mirrored_stages == 0


def test_another_block_another_op_or_another_constant_is_refuted():
    report = tv_ir.check(lowered(spec), lowered(sharded(other_op)))
    assert report.verdict == "not_equivalent"
    assert report.location.line == line_of(other_op, "# BUG: subtracts")
    for fn in (shifted, other_constant):
        assert tv_ir.check(lowered(spec), lowered(sharded(fn))).verdict == "not_equivalent"


# -- dot_general: blocks holding whole contracting dimensions -----------------------------

W = jax.ShapeDtypeStruct((6, 5), jnp.float32)


def dense(x, w):
    return jnp.tanh(x @ w)


def reversed_rows(x, w):
    return jnp.tanh(x @ w[::-1])  # BUG: rows reversed


def lowered_dense(fn) -> str:
    return jax.jit(fn).lower(ARGS[0], W).as_text(debug_info=True)


def by_rows(body):
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    return jax.shard_map(
        body, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"), check_vma=False
    )


def by_contraction(x, w, summed=True):
    mesh = Mesh(np.array(jax.devices()[:2]), ("model",))

    def body(x, w):
        partial = x @ w
        return jnp.tanh(jax.lax.psum(partial, "model") if summed else partial)

    return jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(P(None, "model"), P("model", None)),
        out_specs=P(),
        check_vma=False,
    )(x, w)


def test_a_dot_of_row_blocks_with_the_whole_weight_is_mirrored():
    report = tv_ir.check(lowered_dense(dense), lowered_dense(by_rows(dense)))
    assert report.verdict == "equivalent"
    assert report.stats.mirrored_stages == 2  # the dot and the tanh


def test_a_dot_over_part_of_its_contraction_is_not_mirrored():
    report = tv_ir.check(lowered_dense(dense), lowered_dense(by_contraction))
    assert report.verdict == "equivalent"  # the partial sums are proved as before
    assert report.stats.mirrored_stages == 1  # the tanh of the summed dot only
    unsummed = functools.partial(by_contraction, summed=False)
    assert tv_ir.check(lowered_dense(dense), lowered_dense(unsummed)).verdict == "not_equivalent"


def test_a_dot_on_other_terms_is_refuted():
    report = tv_ir.check(lowered_dense(dense), lowered_dense(by_rows(reversed_rows)))
    assert report.verdict == "not_equivalent"
    assert report.location.line == line_of(reversed_rows, "# BUG: rows reversed")


def test_arrays_the_same_terms_share_a_key():
    """`terms_key` files arrays for the per-device search of an equal earlier device: any
    two `same_terms` calls equal share a key (a number and its constant term alike), so
    filing by it never loses a match; arrays whose first elements differ do not."""
    from tv_ir.prover.mirrored_ops import same_terms, terms_key
    from tv_ir.semantics import terms as T

    x, y = T.symbol("x"), T.symbol("y")
    a = np.array([T.add(x, y), T.const(2)], dtype=object)
    b = np.array([T.add(y, x), 2], dtype=object)  # equal terms, a plain number
    c = np.array([T.mul(x, y), T.const(2)], dtype=object)
    bools = np.array([T.compare("GT", x, T.ZERO)], dtype=object)
    for p, q in ((a, b), (bools, np.array([T.compare("GT", x, T.ZERO)], dtype=object))):
        assert same_terms(p, q)
        assert terms_key(p) == terms_key(q) and hash(terms_key(p)) == hash(terms_key(q))
    assert terms_key(a) != terms_key(c)
    assert terms_key(a) != terms_key(a.reshape(1, 2))
    empty = np.empty((0, 3), dtype=object)
    assert terms_key(empty) == terms_key(np.empty((0, 3), dtype=object))
