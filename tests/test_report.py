"""Reports of distributed refutations: the device holding the first differing element, with
its coordinates on the implementation's mesh (text and JSON)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import tv_ir
from tv_ir.pipeline import prepare
from tv_ir.prover.localise import mesh_coords


def double(x):
    return 2 * x


def one_device_off(mesh: Mesh):
    """Doubles x on a (data, model) mesh, but device (data=1, model=2) adds 1."""

    def body(x):
        off = (jax.lax.axis_index("data") == 1) & (jax.lax.axis_index("model") == 2)
        return jnp.where(off, 2 * x + 1, 2 * x)

    spec = P("data", "model")
    return jax.shard_map(body, mesh=mesh, in_specs=(spec,), out_specs=spec)


def lower(f, *args) -> str:
    return jax.jit(f).lower(*args).as_text(debug_info=True)


def mesh_2x4() -> Mesh:
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))


def test_refutation_names_device_and_mesh_coordinates() -> None:
    x = np.zeros((4, 8), np.float32)
    report = tv_ir.check(lower(double, x), lower(one_device_off(mesh_2x4()), x))
    assert report.verdict == "not_equivalent"
    ce = report.counterexample
    # the first differing element is in the block of device 6 = (data=1, model=2)
    assert ce.index == (2, 4)
    assert ce.device == 6
    assert ce.mesh_coords == {"data": 1, "model": 2}
    assert "held by device 6 (data=1, model=2)" in str(report)
    out = json.loads(report.to_json())
    assert out["counterexample"]["device"] == 6
    assert out["counterexample"]["mesh_coords"] == {"data": 1, "model": 2}


def test_mesh_coordinates_follow_the_mesh_device_ids() -> None:
    x = np.zeros((4, 8), np.float32)
    text = lower(one_device_off(mesh_2x4()), x)
    plain = prepare(text, "impl")
    assert mesh_coords(plain, 1, 8) == {"data": 0, "model": 1}  # row-major
    axes = '<["data"=2, "model"=4]>'
    assert axes in text
    # mesh position k holds device 7 - k
    text = text.replace(axes, '<["data"=2, "model"=4], device_ids=[7, 6, 5, 4, 3, 2, 1, 0]>')
    listed = prepare(text, "impl")
    assert mesh_coords(listed, 7, 8) == {"data": 0, "model": 0}
    assert mesh_coords(listed, 1, 8) == {"data": 1, "model": 2}


def test_single_device_report_has_no_device() -> None:
    x = np.zeros((4, 8), np.float32)
    report = tv_ir.check(lower(double, x), lower(lambda x: 2 * x + 1, x))
    assert report.verdict == "not_equivalent"
    assert report.counterexample.device is None
    assert report.counterexample.mesh_coords is None
    assert "held by device" not in str(report)
