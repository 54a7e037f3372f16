"""`jax.shard_map` implementations (`sdy.manual_computation` with explicit collectives)
proved against plain single-device specs, and planted collective bugs refuted."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import tv_ir
from tv_ir.pipeline import prepare
from tv_ir.prover.placement import Placement
from tv_ir.semantics.algebra import NumpyAlgebra
from tv_ir.semantics.interpreters.spmd import SpmdInterpreter

SHAPES = [(8, 16), (16, 32), (32, 16)]


@pytest.fixture(scope="module")
def mesh():
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))


def lower(f, *args) -> str:
    return jax.jit(f).lower(*args).as_text(debug_info=True)


def mlp_args():
    return [np.ones(s, np.float32) for s in SHAPES]


def plain_mlp(x, w1, w2):
    return jax.nn.relu(x @ w1) @ w2


def megatron(mesh, reduce, check_vma=True):
    """Megatron MLP: batch over 'data', hidden over 'model'; `reduce` completes the sum."""

    def body(x, w1, w2):
        return reduce(jax.nn.relu(x @ w1) @ w2)

    return jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(P("data", None), P(None, "model"), P("model", None)),
        out_specs=P("data", None),
        check_vma=check_vma,
    )


def no_psum(y):
    return y  # BUG: the partial products over 'model' are never summed


def test_megatron_psum_proved(mesh):
    impl = megatron(mesh, lambda y: jax.lax.psum(y, "model"))
    report = tv_ir.check(lower(plain_mlp, *mlp_args()), lower(impl, *mlp_args()))
    assert report.verdict == "equivalent", report.reason


def test_placement_is_replicated_on_the_mesh(mesh):
    impl = megatron(mesh, lambda y: jax.lax.psum(y, "model"))
    spec_m = prepare(lower(plain_mlp, *mlp_args()), "spec")
    impl_m = prepare(lower(impl, *mlp_args()), "impl")
    place = Placement.from_module(spec_m.main, impl_m)
    assert place.num_devices == 8
    assert all(lay.is_replicated for lay in place.args + place.results)


def test_missing_psum_refuted(mesh):
    impl = megatron(mesh, no_psum, check_vma=False)
    report = tv_ir.check(lower(plain_mlp, *mlp_args()), lower(impl, *mlp_args()))
    assert report.verdict == "not_equivalent"
    site = report.location.impl
    assert site is not None
    # the refutation names the shard_map (its body lacks the collective)
    assert site.op == "sdy.manual_computation"


def test_psum_over_wrong_axis_refuted(mesh):
    impl = megatron(mesh, lambda y: jax.lax.psum(y, "data"), check_vma=False)
    report = tv_ir.check(lower(plain_mlp, *mlp_args()), lower(impl, *mlp_args()))
    assert report.verdict == "not_equivalent"
    assert report.counterexample is not None
    # the collective inside the shard_map body is where the programs part ways
    assert report.location.impl.op == "stablehlo.all_reduce"
    assert report.location.impl.file.endswith("test_shard_map.py")


def loss(w, x, y):
    return jnp.mean((x @ w - y) ** 2)


def dp_grad(mesh, reduce):
    """Data parallel: each device's batch shard gives a gradient; `reduce` combines them.

    check_vma=False: with it, `jax.grad` w.r.t. the invariant `w` already sums the local
    gradients over the devices (and tv refutes a further pmean: 8x the mean gradient).
    """

    def body(w, x, y):
        return reduce(jax.grad(loss)(w, x, y), ("data", "model"))

    return jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(P(), P(("data", "model")), P(("data", "model"))),
        out_specs=P(),
        check_vma=False,
    )


@pytest.mark.parametrize(
    ("reduce", "verdict"),
    [(jax.lax.pmean, "equivalent"), (jax.lax.psum, "not_equivalent")],
    ids=["pmean", "psum"],
)
def test_data_parallel_gradient(mesh, reduce, verdict):
    args = [np.ones(s, np.float32) for s in [(4, 2), (16, 4), (16, 2)]]
    spec = lower(jax.grad(loss), *args)
    report = tv_ir.check(spec, lower(dp_grad(mesh, reduce), *args))
    assert report.verdict == verdict, report.reason


def gathered_mlp(mesh):
    """Hidden activations computed column-sharded, then all-gathered (tiled) over 'model'."""

    def body(x, w1, w2):
        h = jax.nn.relu(x @ w1)
        return jax.lax.all_gather(h, "model", axis=1, tiled=True) @ w2

    return jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(P("data", None), P(None, "model"), P()),
        out_specs=P("data", None),
        check_vma=False,  # all_gather's result is replicated over 'model'; jax cannot tell
    )


def test_all_gather_mlp_proved(mesh):
    report = tv_ir.check(lower(plain_mlp, *mlp_args()), lower(gathered_mlp(mesh), *mlp_args()))
    assert report.verdict == "equivalent", report.reason


def test_interpreter_matches_jax(mesh):
    """The lockstep interpreter computes what XLA's execution of the shard_map computes."""
    impl = megatron(mesh, lambda y: jax.lax.psum(y, "model"))
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    expected = np.asarray(jax.jit(impl)(*args))
    module = prepare(lower(impl, *args), "impl")
    outs = SpmdInterpreter(module, NumpyAlgebra()).run([list(args) for _ in range(8)])
    for d in range(8):
        np.testing.assert_allclose(outs[d][0], expected, rtol=1e-5, atol=1e-5)


@pytest.fixture
def gspmd():
    """Lower shard_map in GSPMD mode: @SPMDFullToShardShape / call / @SPMDShardToFullShape."""
    before = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", False)
    yield
    jax.config.update("jax_use_shardy_partitioner", before)


@pytest.mark.parametrize(
    ("reduce", "verdict"),
    [(lambda y: jax.lax.psum(y, "model"), "equivalent"), (no_psum, "not_equivalent")],
    ids=["psum", "no_psum"],
)
def test_gspmd_form(mesh, gspmd, reduce, verdict):
    impl_text = lower(megatron(mesh, reduce, check_vma=False), *mlp_args())
    assert "SPMDFullToShardShape" in impl_text and "manual_computation" not in impl_text
    report = tv_ir.check(lower(plain_mlp, *mlp_args()), impl_text)
    assert report.verdict == verdict, report.reason


def test_calls_inside_shard_map_bodies_are_inlined(mesh):
    """JAX emits `jax.nn.silu` inside a shard_map body as a call to a private function; the
    inline-calls pass inlines it there too, so the prover can cut inside it."""

    def body(x, w):
        return jax.lax.psum(jax.nn.silu(x @ w), "model")

    f = jax.shard_map(
        body, mesh=mesh, in_specs=(P("data", "model"), P("model", None)), out_specs=P("data")
    )
    x, w = np.ones((8, 16), np.float32), np.ones((16, 8), np.float32)
    text = lower(f, x, w)
    assert "call @" in text  # JAX's form: silu is a private function called in the body
    module = prepare(text, "impl")
    manual = next(op for op in module.main.body.ops if op.name == "sdy.manual_computation")
    names = [op.name for op in manual.regions[0].block.ops]
    assert "func.call" not in names and "stablehlo.exponential" in names


@pytest.mark.parametrize(
    ("reduce", "verdict"),
    [(lambda y: jax.lax.psum(y, "model"), "equivalent"), (no_psum, "not_equivalent")],
)
def test_a_shard_map_on_an_abstract_mesh_runs_on_the_mesh_devices(reduce, verdict):
    # a plan checked before its machines exist: JAX lowers a shard_map on an AbstractMesh
    # (16 devices here, past the host's 8) with mhlo.num_partitions = 1; the program is the
    # mesh's (tv refused it: "mesh has 16 devices, program has 1")
    from jax.sharding import AbstractMesh
    from tv_ir.frontends.jax import verify

    mesh = AbstractMesh((4, 4), ("data", "model"))
    args = [jax.ShapeDtypeStruct(s, np.float32) for s in SHAPES]
    text = lower(megatron(mesh, reduce, check_vma=False), *args)
    assert "mhlo.num_partitions = 1 " in text
    r = verify(megatron(mesh, reduce, check_vma=False), *args, spec=plain_mlp)
    assert r.verdict == verdict, str(r)
    if verdict == "not_equivalent":
        assert any("of the real 16" in n for n in r.notes), r.notes


def first_stage_doubled(x):
    """The spec of `stage_dependent_psum`: rows of stage 0 get twice the sum of the column
    blocks, rows of stage 1 the sum."""
    top = 2 * (x[:2, :2] + x[:2, 2:])
    return jnp.concatenate([top, x[2:, :2] + x[2:, 2:]])


def stage_dependent_psum(k: float):
    """A branch on the pipeline stage, each branch summing over the tensor axis: devices of
    a stage take their branch together, so every psum group meets (XLA runs it)."""
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("stage", "model"))

    def body(x):
        first = jax.lax.axis_index("stage") == 0
        return jax.lax.cond(
            first,
            lambda v: jax.lax.psum(k * v, "model"),  # BUG when k != 2
            lambda v: jax.lax.psum(v, "model"),
            x,
        )

    return jax.shard_map(
        body, mesh=mesh, in_specs=P("stage", "model"), out_specs=P("stage"), check_vma=False
    )


@pytest.mark.parametrize(("k", "verdict"), [(2.0, "equivalent"), (3.0, "not_equivalent")])
def test_a_branch_on_the_stage_holding_a_psum_over_the_tensor_axis(k, verdict):
    # before: unknown ("the branch index differs across devices and a branch holds
    # stablehlo.all_reduce")
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    report = tv_ir.check(lower(first_stage_doubled, x), lower(stage_dependent_psum(k), x))
    assert report.verdict == verdict, report.reason
    np.testing.assert_allclose(jax.jit(stage_dependent_psum(2.0))(x), first_stage_doubled(x))
