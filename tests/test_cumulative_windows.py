"""Running sums (`jnp.cumsum`, `lax.cummax`) under shape reduction: a reduce_window folding
the whole of a dimension (a prefix or suffix; XLA's partitioned form, a window of the row's
size slid over each device's stretch of the padded, gathered row) is read at any size of
it, so the dimension shrinks; a running count compared with a constant keeps it
(`passes/shape_reduction/windows.py`). Before the forty-ninth session the dimension kept
its size ("a window of reduce_window"), and a jit `cumsum` over 4,096 columns on 8 devices
took 31 s."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tv_ir.frontends.jax import verify

import tv_ir

ROWS = jax.ShapeDtypeStruct((4, 4096), jnp.float32)


def classes(report) -> dict[int, int]:
    return {c["real"]: c["reduced"] for c in report.reduction["classes"]}


def columns_sharded(f):
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    sh = NamedSharding(mesh, P(None, "data"))
    return jax.jit(f, in_shardings=sh, out_shardings=sh)


def lower(f, *args) -> str:
    return jax.jit(f).lower(*args).as_text(debug_info=True)


def test_a_jit_cumsum_over_sharded_columns_is_proved_at_reduced_shapes() -> None:
    def f(x):
        return jnp.cumsum(x, axis=1)

    report = verify(columns_sharded(f), ROWS, spec=f)
    assert report.verdict == "equivalent", str(report)
    assert classes(report)[4096] <= 64, report.reduction


def test_a_jit_running_max_is_proved_at_reduced_shapes() -> None:
    def f(x):
        return jax.lax.cummax(x, axis=1)

    report = verify(columns_sharded(f), ROWS, spec=f)
    assert report.verdict == "equivalent", str(report)
    assert classes(report)[4096] <= 64, report.reduction


def test_a_running_count_compared_keeps_its_dimension() -> None:
    """`cumsum(ones) <= 4000` drops the last 96 columns: at a reduced size no column would
    be dropped. The count keeps the dimension, and the bug is refuted."""

    def keep_all(x):
        return x

    def drops_the_tail(x):  # BUG: 4000, not 4096
        return jnp.where(jnp.cumsum(jnp.ones_like(x), axis=1) <= 4000, x, 0.0)

    report = verify(columns_sharded(drops_the_tail), ROWS, spec=keep_all)
    assert report.verdict == "not_equivalent", str(report)
    assert report.counterexample.index[1] >= 4000
    assert "its count (reduce_window" in report.reduction["summary"], report.reduction


def exclusive_prefix(bug: bool):
    """A shard_map cumsum: each device's own running sum plus the totals of the devices
    before it (or, with the bug, of those before it and its own: an inclusive prefix)."""
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))

    def body(x):
        local = jnp.cumsum(x, axis=1)
        totals = jax.lax.all_gather(local[:, -1], "data", axis=1)  # (rows, devices)
        i = jax.lax.axis_index("data")
        before = jnp.arange(totals.shape[1]) <= i if bug else jnp.arange(totals.shape[1]) < i
        return local + jnp.sum(jnp.where(before, totals, 0.0), axis=1, keepdims=True)

    return jax.shard_map(body, mesh=mesh, in_specs=P(None, "data"), out_specs=P(None, "data"))


def test_a_shard_map_cumsum_is_proved_and_an_inclusive_prefix_refuted() -> None:
    def spec(x):
        return jnp.cumsum(x, axis=1)

    good = tv_ir.check(lower(spec, ROWS), lower(exclusive_prefix(False), ROWS))
    assert good.verdict == "equivalent", str(good)
    assert classes(good)[4096] < 4096, good.reduction
    bad = tv_ir.check(lower(spec, ROWS), lower(exclusive_prefix(True), ROWS))
    assert bad.verdict == "not_equivalent", str(bad)


def test_a_reversed_cumsum_shrinks_and_a_missing_flip_is_refuted() -> None:
    def spec(x):
        return jax.lax.cumsum(x, axis=1, reverse=True)

    def flipped(x):
        return jnp.flip(jnp.cumsum(jnp.flip(x, axis=1), axis=1), axis=1)

    def unflipped(x):  # BUG: a forward cumsum
        return jnp.cumsum(x, axis=1)

    good = tv_ir.check(lower(spec, ROWS), lower(flipped, ROWS))
    assert good.verdict == "equivalent", str(good)
    assert classes(good)[4096] < 4096, good.reduction
    bad = tv_ir.check(lower(spec, ROWS), lower(unflipped, ROWS))
    assert bad.verdict == "not_equivalent", str(bad)
