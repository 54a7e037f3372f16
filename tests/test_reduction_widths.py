"""Integers that wrap, or round, only at the real size: a device's coordinate or a position
converted to a narrower integer type (`axis_index(...).astype(jnp.int8)`, an iota as int8),
or multiplied past its type's range. On a reduced mesh, or at reduced shapes, every value
fits, so the reduced pair does not show what the wrap does on the real one; the axis, or
the class, keeps its size instead. The meshes and shapes here are too large to run
concretely, so the verdict rests on the reduction alone (before the forty-eighth session
each of these bugs was proved `equivalent`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

import tv_ir


def lower(f, *args) -> str:
    return jax.jit(f).lower(*args).as_text(debug_info=True)


def rows(n: int, width: int = 128):
    return jax.ShapeDtypeStruct((n, width), jnp.float32)


def sharded(body, devices: int):
    mesh = AbstractMesh((devices,), ("x",))
    return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)


def spec(x):
    return jnp.sin(x) * 2


def by_sign(i):
    """The spec's value where `i` is not negative: a bug wherever it is."""

    def body(x):
        return jnp.where(i() < 0, jnp.sin(x) * 3, jnp.sin(x) * 2)

    return body


def axes_of(report) -> dict:
    return {a["name"]: (a["real"], a["reduced"]) for a in report.mesh_reduction["axes"]}


# -- a device's coordinate ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, coordinate, first",
    [
        ("int8", lambda: jax.lax.axis_index("x").astype(jnp.int8), 128),
        ("int8 times 4", lambda: jax.lax.axis_index("x").astype(jnp.int8) * 4, 32),
        ("times 2**24", lambda: jax.lax.axis_index("x") * (1 << 24), 128),
    ],
)
def test_a_coordinate_that_wraps_on_the_real_mesh_is_refuted(name, coordinate, first):
    """Devices 128 to 255 of 256 see a negative coordinate as int8 (from device 32 on, times
    4 in int8), and from device 128 on one times 2**24 passes int32's range: the axis keeps
    its 256 devices, and the first device where it wraps is named."""
    x = rows(256 * 4096)
    r = tv_ir.check(lower(spec, x), lower(sharded(by_sign(coordinate), 256), x))
    assert r.verdict == "not_equivalent", str(r)
    assert r.counterexample.mesh_coords["x"] >= first, r.counterexample.mesh_coords
    assert '"x": 256 kept' in str(r), str(r)


def test_a_coordinate_that_fits_is_still_reduced():
    x = rows(256 * 4096)
    ok = by_sign(lambda: jax.lax.axis_index("x").astype(jnp.int16))
    r = tv_ir.check(lower(spec, x), lower(sharded(ok, 256), x))
    assert r.verdict == "equivalent", str(r)
    assert axes_of(r)["x"][1] < 256


def own_block(convert):
    """Each device takes its own block back from an all-gather, at `convert(i) * tile`."""

    def body(x):
        g = jax.lax.all_gather(x, "x", tiled=True)
        i = convert(jax.lax.axis_index("x"))
        return jnp.sin(jax.lax.dynamic_slice_in_dim(g, i * x.shape[0], x.shape[0], 0))

    return body


def test_a_tile_start_that_wraps_is_refuted():
    """Device 300 of 512 takes block 300 % 256 = 44 when its coordinate passes uint8."""
    x = rows(512 * 2, 64)
    wraps = own_block(lambda i: i.astype(jnp.uint8).astype(jnp.int32))
    r = tv_ir.check(lower(jnp.sin, x), lower(sharded(wraps, 512), x))
    assert r.verdict == "not_equivalent", str(r)
    assert r.counterexample.mesh_coords["x"] >= 256, r.counterexample.mesh_coords


def test_a_tile_start_in_int32_is_reduced():
    x = rows(512 * 2, 64)
    r = tv_ir.check(lower(jnp.sin, x), lower(sharded(own_block(lambda i: i), 512), x))
    assert r.verdict == "equivalent", str(r)
    assert axes_of(r) == {"x": (512, 2)}


# -- positions ---------------------------------------------------------------------------------


def by_row_sign(dtype):
    def impl(x):
        r = jax.lax.broadcasted_iota(jnp.int32, x.shape, 0).astype(dtype)
        return jnp.where(r < 0, jnp.sin(x) * 3, jnp.sin(x) * 2)

    return impl


def kept(report) -> dict[str, str]:
    return {c["name"]: c["kept"] for c in report.reduction["classes"] if c["kept"]}


def test_positions_that_wrap_at_the_real_size_keep_their_class():
    """Rows 128 on of 2**22 are negative as int8; at 2 rows none is."""
    x = rows(1 << 22, 64)
    r = tv_ir.check(lower(spec, x), lower(by_row_sign(jnp.int8), x))
    assert r.verdict == "not_equivalent", str(r)
    assert r.counterexample.index[0] >= 128
    assert "holds positions up to 4194303 in i8" in kept(r)["spec argument 0 dim 0"]


def test_positions_that_fit_still_shrink():
    x = rows(1 << 22, 64)
    r = tv_ir.check(lower(spec, x), lower(by_row_sign(jnp.int32), x))
    assert r.verdict == "equivalent", str(r)
    assert "spec argument 0 dim 0" not in kept(r)


def rope_angles(dtype):
    """Rotary angles from positions held as `dtype`."""

    def angles(x):
        pos = jax.lax.broadcasted_iota(jnp.int32, x.shape, 0).astype(dtype)
        return jnp.sin(pos.astype(jnp.float32) * x)

    return angles


def test_positions_as_bf16_still_shrink():
    """tv reads floats as reals: a position held as bf16 is the position (the rounding past
    256 is float rounding, which `equivalent` allows), so the rows still shrink."""
    x = rows(8192, 4)
    r = tv_ir.check(lower(rope_angles(jnp.float32), x), lower(rope_angles(jnp.bfloat16), x))
    assert r.verdict == "equivalent", str(r)
    assert "spec argument 0 dim 0" not in kept(r), kept(r)
