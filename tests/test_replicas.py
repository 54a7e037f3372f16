"""Every device's copy counts: a shard_map result that its out_specs call replicated
(`out_specs=P()`, or a mesh axis left out) is computed by every device holding it, and XLA
keeps each device's own copy (`check_vma=False` does not check that they agree). tv checks
every copy against the spec and names the device whose copy differs; a replication it could
not prove is never assumed (docs/equivalence.md, "Replicas")."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import tv_ir
from tv_ir.errors import Unsupported
from tv_ir.pipeline import prepare
from tv_ir.prover.placement import Placement
from tv_ir.semantics.interpreters.interp import evaluate
from tv_ir.semantics.layout import Layout


@pytest.fixture(scope="module")
def mesh4():
    return Mesh(np.array(jax.devices()[:4]), ("x",))


@pytest.fixture(scope="module")
def mesh8():
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))


def lower(f, *args) -> str:
    return jax.jit(f).lower(*args).as_text(debug_info=True)


def smap(body, mesh, in_specs, out_specs):
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def device_copy(mesh, result, d: int) -> np.ndarray:
    """Device d's (partition id d's) own copy of a replicated JAX result."""
    dev = mesh.devices.flat[d]
    return next(np.asarray(s.data) for s in result.addressable_shards if s.device == dev)


def replay_on_jax(mesh, impl, spec, report):
    """The counterexample, run by XLA: the named device's copy differs from the spec's
    value at the reported index, and holds the reported value."""
    ce = report.counterexample
    args = [np.asarray(x, np.float32) for x in ce.inputs.values()]
    want = np.asarray(jax.jit(spec)(*args))
    got = device_copy(mesh, jax.jit(impl)(*args), ce.device)
    assert not np.allclose(got, want, rtol=1e-4, atol=1e-4)
    assert np.isclose(got[ce.index], ce.actual, rtol=1e-4, atol=1e-4)
    assert np.isclose(want[ce.index], ce.expected, rtol=1e-4, atol=1e-4)


# -- a per-device value returned as replicated ----------------------------------------------


def scaled_by_device(mesh):
    """Each device returns its block times (its index + 1): a different value per device."""

    def body(a):
        return a * (jax.lax.axis_index("x") + 1).astype(a.dtype)

    return smap(body, mesh, P("x"), P())


def test_jax_keeps_each_devices_copy(mesh4):
    """What XLA does: every device keeps its own copy; `np.asarray` is device 0's."""
    x = np.arange(8, dtype=np.float32)
    r = jax.jit(scaled_by_device(mesh4))(x)
    assert np.asarray(r).tolist() == [0.0, 1.0]  # device 0's copy
    assert device_copy(mesh4, r, 0).tolist() == [0.0, 1.0]
    assert device_copy(mesh4, r, 3).tolist() == [24.0, 28.0]


def test_device_0_value_is_not_the_program(mesh4):
    """The spec is device 0's copy; devices 1-3 hold other values: refuted on device 1."""
    x = np.arange(8, dtype=np.float32)
    impl = scaled_by_device(mesh4)

    def spec(a):
        return a[:2]

    report = tv_ir.check(lower(spec, x), lower(impl, x))
    assert report.verdict == "not_equivalent", report
    assert report.counterexample.device == 1
    assert report.counterexample.mesh_coords == {"x": 1}
    assert "held by device 1 (x=1)" in str(report)
    replay_on_jax(mesh4, impl, spec, report)


def test_another_devices_value_is_refuted_on_device_0(mesh4):
    x = np.arange(8, dtype=np.float32)
    impl = scaled_by_device(mesh4)

    def spec(a):
        return a[4:6] * 3  # device 2's copy

    report = tv_ir.check(lower(spec, x), lower(impl, x))
    assert report.verdict == "not_equivalent", report
    assert report.counterexample.device == 0
    assert report.counterexample.mesh_coords == {"x": 0}
    replay_on_jax(mesh4, impl, spec, report)


def test_per_device_value_on_a_2x4_mesh(mesh8):
    """out_specs P('data') leaves 'model' out: the 'model' devices' copies must agree."""
    x = np.ones((8, 4), np.float32)

    def body(a):
        return a * (jax.lax.axis_index("model") + 1).astype(a.dtype)

    impl = smap(body, mesh8, P(("data", "model")), P("data"))

    def spec(a):  # what the model=0 devices hold: rows 0 and 4 of the blocks
        return a.reshape(2, 4, 4)[:, 0, :]

    report = tv_ir.check(lower(spec, x), lower(impl, x))
    assert report.verdict == "not_equivalent", report
    assert report.counterexample.device == 1
    assert report.counterexample.mesh_coords == {"data": 0, "model": 1}
    replay_on_jax(mesh8, impl, spec, report)


# -- every device right but one ---------------------------------------------------------------


def sum_of_blocks(a):
    return a.reshape(4, 2).sum(0)


def off_on_device_3(mesh):
    def body(a):
        y = jax.lax.psum(a, "x")
        return jnp.where(jax.lax.axis_index("x") == 3, y + 1, y)  # device 3 is off

    return smap(body, mesh, P("x"), P())


def test_one_replica_off_is_refuted(mesh4):
    x = np.arange(8, dtype=np.float32)
    impl = off_on_device_3(mesh4)
    report = tv_ir.check(lower(sum_of_blocks, x), lower(impl, x))
    assert report.verdict == "not_equivalent", report
    ce = report.counterexample
    assert ce.device == 3 and ce.mesh_coords == {"x": 3}
    assert ce.actual == pytest.approx(ce.expected + 1)
    assert report.location.impl.op == "stablehlo.add"
    assert report.location.impl.file.endswith("test_replicas.py")
    replay_on_jax(mesh4, impl, sum_of_blocks, report)


def test_one_replica_off_in_gspmd_form(mesh4):
    before = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", False)
    try:
        x = np.arange(8, dtype=np.float32)
        text = lower(off_on_device_3(mesh4), x)
    finally:
        jax.config.update("jax_use_shardy_partitioner", before)
    assert "SPMDShardToFullShape" in text and "manual_computation" not in text
    report = tv_ir.check(lower(sum_of_blocks, x), text)
    assert report.verdict == "not_equivalent", report
    assert report.counterexample.device == 3


def off_on(mesh, device: int):
    """A column sum psum'd over all 8 devices, wrong (doubled) on `device` only."""

    def body(a):
        y = jax.lax.psum(a.sum(0, keepdims=True), ("data", "model"))
        i = jax.lax.axis_index("data") * 4 + jax.lax.axis_index("model")
        return jnp.where(i == device, 2 * y, y)

    return smap(body, mesh, P(("data", "model")), P())


def column_sum(a):
    return a.sum(0, keepdims=True)


def test_last_of_eight_devices_is_named(mesh8):
    x = np.ones((8, 4), np.float32)
    impl = off_on(mesh8, 7)
    report = tv_ir.check(lower(column_sum, x), lower(impl, x))
    assert report.verdict == "not_equivalent", report
    assert report.counterexample.device == 7
    assert report.counterexample.mesh_coords == {"data": 1, "model": 3}
    assert "held by device 7 (data=1, model=3)" in str(report)
    replay_on_jax(mesh8, impl, column_sum, report)


def test_no_device_off_is_proved(mesh8):
    x = np.ones((8, 4), np.float32)
    report = tv_ir.check(lower(column_sum, x), lower(off_on(mesh8, -1), x))
    assert report.verdict == "equivalent", report


# -- correct replicated results are still proved ----------------------------------------------


@pytest.mark.parametrize(
    ("reduce", "scale"), [(jax.lax.psum, 1.0), (jax.lax.pmean, 1 / 8)], ids=["psum", "pmean"]
)
def test_reduced_replicas_proved(mesh8, reduce, scale):
    x = np.ones((8, 4), np.float32)

    def body(a):
        return reduce(a.sum(0), ("data", "model"))

    impl = smap(body, mesh8, P(("data", "model")), P())
    report = tv_ir.check(lower(lambda a: a.sum(0) * scale, x), lower(impl, x))
    assert report.verdict == "equivalent", report


def test_replicated_over_one_axis_proved(mesh8):
    """psum over 'model' makes the 'model' copies of each 'data' block agree."""
    x, w = np.ones((8, 16), np.float32), np.ones((16, 4), np.float32)

    def body(x, w):
        return jax.lax.psum(x @ w, "model")

    impl = smap(body, mesh8, (P("data", "model"), P("model", None)), P("data", None))
    report = tv_ir.check(lower(lambda x, w: x @ w, x, w), lower(impl, x, w))
    assert report.verdict == "equivalent", report


# -- an unproved replication is not assumed ---------------------------------------------------


def test_divergent_intermediate_is_not_assumed(mesh8):
    """The first shard_map's 'replicated' result differs per device; the second averages
    each device's own copy, so every device's output is the spec's. Which copy a device
    reads is XLA's choice: tv does not call this equivalent, and names the device."""
    x = np.ones((8, 4), np.float32)

    def first(a):
        return a * (jax.lax.axis_index("model") == 0).astype(a.dtype) * 4

    def second(b):
        return jax.lax.pmean(b, "model")

    def impl(a):
        b = smap(first, mesh8, P(), P())(a)
        return smap(second, mesh8, P(), P())(b)

    report = tv_ir.check(lower(lambda a: a, x), lower(impl, x))
    assert report.verdict == "unknown", report
    assert "claimed replicated" in report.reason
    assert "device 1 (data=0, model=1)" in report.reason


def test_spec_with_divergent_replicas_has_no_meaning(mesh4):
    """A spec whose shard_map result differs per device computes no single function."""
    x = np.arange(8, dtype=np.float32)
    report = tv_ir.check(lower(off_on_device_3(mesh4), x), lower(sum_of_blocks, x))
    assert report.verdict == "unknown", report
    assert "device 3 (x=3)" in report.reason


def test_global_interpreter_gives_device_0s_copy(mesh4):
    """Read as one computation, a correctly replicated shard_map is device 0's copy, which is
    what JAX hands the user; a divergent one is refused, with the device named."""
    x = np.arange(8, dtype=np.float64)

    def good(a):
        return jax.lax.psum(a, "x")

    impl = smap(good, mesh4, P("x"), P())
    got = evaluate(prepare(lower(impl, x), "spec"), [x])[0]
    assert got.tolist() == np.asarray(jax.jit(impl)(x.astype(np.float32))).tolist()
    with pytest.raises(Unsupported, match=r"device 3 \(x=3\)"):
        evaluate(prepare(lower(off_on_device_3(mesh4), x), "spec"), [x])


# -- a per-device program's replicated result -------------------------------------------------

PER_DEVICE = """
module @m attributes {mhlo.num_partitions = 4 : i32} {
  func.func @main(%arg0: tensor<4xf32> {mhlo.sharding = "{replicated}"})
      -> (tensor<4xf32> {mhlo.sharding = "{replicated}"}) {
    %p = stablehlo.partition_id : tensor<ui32>
    %c = stablehlo.constant dense<3> : tensor<ui32>
    %eq = stablehlo.compare EQ, %p, %c : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
    %b = stablehlo.broadcast_in_dim %eq, dims = [] : (tensor<i1>) -> tensor<4xi1>
    %y = stablehlo.add %arg0, %arg0 : tensor<4xf32>
    %r = stablehlo.select %b, %y, %arg0 : tensor<4xi1>, tensor<4xf32>
    return %r : tensor<4xf32>
  }
}
"""

IDENTITY = """
func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  return %arg0 : tensor<4xf32>
}
"""


def test_per_device_program_replica_off_is_refuted():
    """A replicated result of a per-device program: device 3's copy is doubled. Simulation
    and replay compare every copy (they used to compare device 0's only: `unknown`)."""
    spec = prepare(IDENTITY, "spec")
    # every argument and result replicated on 4 devices (given: the module would otherwise
    # be read as a pre-partition one, global shapes with shardings)
    report = tv_ir.check(IDENTITY, PER_DEVICE, placement=Placement.replicated(spec.main, 4))
    assert report.verdict == "not_equivalent", report
    assert report.counterexample.device == 3
    assert report.counterexample.actual == pytest.approx(2 * report.counterexample.expected)


def test_layout_copies_lists_every_holder():
    lay = Layout.from_hlo_sharding("{devices=[2,1,2]<=[4] last_tile_dim_replicate}", (4, 2), 4)
    per_device = [np.full((2, 2), float(d)) for d in range(4)]
    copies = lay.copies(per_device)
    assert [(d, box) for d, box, _ in copies] == [
        (0, ((0, 2), (0, 2))),
        (1, ((0, 2), (0, 2))),
        (2, ((2, 4), (0, 2))),
        (3, ((2, 4), (0, 2))),
    ]
    assert [float(v[0, 0]) for _, _, v in copies] == [0.0, 1.0, 2.0, 3.0]
