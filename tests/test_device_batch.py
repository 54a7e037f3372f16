"""Concrete SPMD runs evaluate ordinary ops once for all devices (interpreters/device_batch):
the results are what device-by-device evaluation and XLA give, ops whose operands differ
per device in a way the batched form cannot follow are evaluated device by device, and a
hook that replaces values is seen by the ops after it."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from tv_ir.pipeline import prepare
from tv_ir.semantics.algebra import NumpyAlgebra
from tv_ir.semantics.interpreters import device_batch
from tv_ir.semantics.interpreters.device_batch import DEVICE_BATCH
from tv_ir.semantics.interpreters.spmd import SpmdInterpreter


@pytest.fixture(scope="module")
def mesh():
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))


def stack_step(mesh):
    """A scan over stacked layers per device (dynamic_slice / dynamic_update_slice at the
    counter), dot_general, reduce, broadcast, transpose, pad, concatenate, select, a
    psum, and a slice at each device's own offset (axis_index: differs per device)."""

    def layer(h, w):
        y = jnp.tanh(h @ w)
        return y + jnp.mean(y, axis=-1, keepdims=True), jnp.sum(y * y)

    def body(x, ws):
        h, norms = jax.lax.scan(layer, x, ws)
        h = jax.lax.psum(h, "model")
        h = jnp.where(h > 0, h, 0.5 * h).T
        padded = jnp.pad(h, ((1, 2), (0, 0)))
        k = jax.lax.axis_index("model")
        own = jax.lax.dynamic_slice_in_dim(padded, k, 2, axis=0)
        return jnp.concatenate([own, own * 2], axis=0), norms

    return jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(P("data", None), P()),
        out_specs=(P("data", "model"), P("data")),
        check_vma=False,
    )


def args():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    ws = rng.standard_normal((3, 16, 16)).astype(np.float32) * 0.3
    return x, ws


def run(module, batched: bool, hook=None):
    token = DEVICE_BATCH.set(batched)
    try:
        interp = SpmdInterpreter(module, NumpyAlgebra(), hook=hook)
        outs = interp.run([list(args()) for _ in range(interp.num_devices)])
    finally:
        DEVICE_BATCH.reset(token)
    return interp, outs


@pytest.mark.parametrize("keep_copies", [True, False])
def test_batched_run_matches_device_by_device_and_jax(mesh, keep_copies, monkeypatch):
    if not keep_copies:  # stacks copied from the devices' arrays made again at each use
        monkeypatch.setattr(device_batch, "KEEP_COPIES_BYTES", 0)
    impl = stack_step(mesh)
    x, ws = args()
    expected = jax.jit(impl)(x, ws)
    module = prepare(jax.jit(impl).lower(x, ws).as_text(), "impl")
    batched, outs = run(module, True)
    plain, ref = run(module, False)
    assert plain.batch is None
    assert batched.batch.batched > 20  # the loop body's ops, once per iteration
    for d in range(8):
        for k in range(2):
            np.testing.assert_allclose(outs[d][k], ref[d][k], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(outs[d][k], np.asarray(expected[k]), rtol=1e-5, atol=1e-5)


def test_hook_replacing_values_is_seen_by_batched_ops(mesh):
    """A stacked value is reused only while the devices still hold its very objects: a
    hook's replacement (the prover cuts values this way) is what the next op reads."""
    impl = stack_step(mesh)
    x, ws = args()
    module = prepare(jax.jit(impl).lower(x, ws).as_text(), "impl")
    scaled = []

    def hook(op, results):
        if op.name == "stablehlo.transpose" and not scaled:
            scaled.append(op)
            return [[np.asarray(r) * 3.0 for r in rs] for rs in results]
        return results

    batched, outs = run(module, True, hook)
    scaled.clear()
    plain, ref = run(module, False, hook)
    assert batched.batch.batched > 0
    _, unhooked = run(module, False)
    assert not np.allclose(ref[0][0], unhooked[0][0])  # the replacement shows downstream
    for d in range(8):
        for k in range(2):
            np.testing.assert_allclose(outs[d][k], ref[d][k], rtol=1e-12, atol=1e-12)


def test_the_latest_write_of_a_value_is_what_each_device_reads():
    """A value held stacked for all devices, then written per device (a loop's next
    iteration evaluated device by device), then stacked again: each device reads the
    latest, never an older copy."""
    batch = device_batch.DeviceBatch(2, NumpyAlgebra())
    op = SimpleNamespace(results=[SimpleNamespace(id=7)])
    batch.put(op, device_batch.Stacked([np.array([[1.0], [2.0]])]))
    assert [float(env[7][0]) for env in batch.envs] == [1.0, 2.0]
    for d, env in enumerate(batch.envs):
        env[7] = np.array([10.0 + d])
    assert [float(env[7][0]) for env in batch.envs] == [10.0, 11.0]
    np.testing.assert_array_equal(batch.stacked(7), [[10.0], [11.0]])
    batch.put(op, device_batch.Stacked([np.array([[5.0], [6.0]])]))
    assert [float(env[7][0]) for env in batch.envs] == [5.0, 6.0]
    batch.put(op, device_batch.Stacked([device_batch.One(np.array([3.0]))]))
    assert batch.envs[0][7] is batch.envs[1][7]  # one object for every device
    assert batch.same(7) is not None


def collectives_step(mesh):
    """psum, psum_scatter and all_gather over each axis (all_reduce, reduce_scatter,
    all_gather), and a psum of an integer (another reducer type)."""

    def body(x):
        a = jax.lax.psum(x, "model")
        b = jax.lax.psum_scatter(x * 2.0, "data", scatter_dimension=1, tiled=True)
        c = jax.lax.all_gather(b, "model", axis=0, tiled=True)
        d = jax.lax.all_gather(x, "data", axis=1, tiled=True)
        n = jax.lax.psum(jnp.ones((), jnp.int32), ("data", "model"))
        return a, c, d, jnp.max(a) * n

    return jax.shard_map(
        body,
        mesh=mesh,
        in_specs=P("data", "model"),
        out_specs=(P("data", "model"), P(None, ("data", "model")), P("data", None), P()),
        check_vma=False,
    )


def test_collectives_on_stacked_values_match_device_by_device_and_jax(mesh, monkeypatch):
    """all_reduce, reduce_scatter and all_gather evaluated on the devices' stacked values
    (DeviceBatch.collective) give what each device computes on its own, and what JAX does."""
    impl = collectives_step(mesh)
    x = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)
    expected = jax.jit(impl)(x)
    module = prepare(jax.jit(impl).lower(x).as_text(), "impl")
    on_stacks: list[str] = []
    real = device_batch.DeviceBatch.collective

    def counted(self, op, ctx, groups):
        out = real(self, op, ctx, groups)
        if out is not None:
            on_stacks.append(op.name.split(".")[-1])
        return out

    monkeypatch.setattr(device_batch.DeviceBatch, "collective", counted)

    def outputs(batched: bool):
        token = DEVICE_BATCH.set(batched)
        try:
            interp = SpmdInterpreter(module, NumpyAlgebra())
            return interp.run([[x] for _ in range(interp.num_devices)])
        finally:
            DEVICE_BATCH.reset(token)

    outs, ref = outputs(True), outputs(False)
    assert {"all_reduce", "reduce_scatter", "all_gather"} <= set(on_stacks)
    for d in range(8):
        for k in range(4):
            np.testing.assert_array_equal(outs[d][k], ref[d][k])
    for k in range(4):
        np.testing.assert_allclose(outs[0][k], np.asarray(expected[k]), rtol=1e-5, atol=1e-5)


def test_groups_of_eight_reduce_as_each_group_alone():
    """All groups reduced at once (`collectives.group_values`) add in the order one group
    alone does, to the bit: eight members (numpy sums eight or more pairwise), scalars and
    tensors, float32 values of very different magnitudes."""
    mesh = Mesh(np.array(jax.devices()[:8]), ("x",))

    def body(v, s):
        return (
            jax.lax.psum(v, "x"),
            jax.lax.psum(s, "x"),
            jax.lax.psum_scatter(v, "x", scatter_dimension=1, tiled=True),
        )

    impl = jax.shard_map(
        body, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=(P(), P(), P(None, "x")),
        check_vma=False,
    )  # fmt: skip
    rng = np.random.default_rng(3)
    v = (rng.standard_normal((8, 16)) * 10.0 ** rng.integers(-6, 7, (8, 16))).astype(np.float32)
    s = (rng.standard_normal(8) * 10.0 ** rng.integers(-6, 7, 8)).astype(np.float32)
    module = prepare(jax.jit(impl).lower(v, s).as_text(), "impl")

    def outputs(batched: bool):
        token = DEVICE_BATCH.set(batched)
        try:
            interp = SpmdInterpreter(module, NumpyAlgebra())
            return interp.run([[v, s] for _ in range(interp.num_devices)])
        finally:
            DEVICE_BATCH.reset(token)

    outs, ref = outputs(True), outputs(False)
    for d in range(8):
        for k in range(3):
            np.testing.assert_array_equal(outs[d][k], ref[d][k])


def test_a_hook_that_only_reads_leaves_the_values_stacked(mesh):
    """A hook that only records the devices' values (a traced run) sees what each device
    computes, and the values it returns unchanged stay held once for all devices: none is
    written device by device."""
    impl = stack_step(mesh)
    x, ws = args()
    module = prepare(jax.jit(impl).lower(x, ws).as_text(), "impl")

    def recorder(seen):
        def hook(op, results):
            for k, v in enumerate(op.results):
                seen[v.id] = [r[k] for r in results]
            return results

        return hook

    seen, seen_plain = {}, {}
    batched, outs = run(module, True, recorder(seen))
    _, ref = run(module, False, recorder(seen_plain))
    (shard_map,) = [op for op in module.main.body.ops if op.name == "sdy.manual_computation"]
    moved = {"stablehlo.transpose", "stablehlo.pad", "stablehlo.concatenate"}
    ordinary = [op.results[0].id for op in shard_map.regions[0].block.ops if op.name in moved]
    assert len(ordinary) >= 3 and set(ordinary) <= set(seen)
    assert not set(ordinary) & batched.batch.store.own  # none written device by device
    assert seen.keys() == seen_plain.keys()
    for vid, values in seen.items():
        for a, b in zip(values, seen_plain[vid], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    for d in range(8):
        for k in range(2):
            np.testing.assert_allclose(outs[d][k], ref[d][k], rtol=1e-12, atol=1e-12)
