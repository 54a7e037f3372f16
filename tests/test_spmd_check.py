"""Distributed implementations: XLA's per-device programs proved against the spec, and
planted partitioning bugs refuted with the device and the collective at fault."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import tv_ir
from tv_ir.pipeline import partition_and_check, prepare
from tv_ir.prover.placement import Placement
from tv_ir.xla.partitioner import partition

GROUPS = "replica_groups={{0,1,2,3},{4,5,6,7}}"


def mlp(x, w1, w2):
    return jax.nn.relu(x @ w1) @ w2


@pytest.fixture(scope="module")
def megatron():
    """The Megatron MLP (batch over 'data', hidden over 'model') on a (2, 4) mesh."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))

    def s(*spec):
        return NamedSharding(mesh, P(*spec))

    f = jax.jit(
        mlp,
        in_shardings=(s("data", None), s(None, "model"), s("model", None)),
        out_shardings=s("data", None),
    )
    args = [np.ones(sh, np.float32) for sh in [(8, 16), (16, 32), (32, 16)]]
    pre = f.lower(*args).as_text(debug_info=True)
    return pre, partition(pre)


def _check(pre, parted, hlo):
    spec = prepare(pre, "spec")
    placement = Placement.from_shardings(
        spec.main, parted.arg_shardings, parted.out_shardings, parted.num_partitions
    )
    return tv_ir.check(pre, hlo, placement=placement)


def test_xla_partitioning_is_proved(megatron) -> None:
    pre, parted = megatron
    assert GROUPS in parted.per_device_hlo
    r = partition_and_check(pre)
    assert r.verdict == "equivalent", r.reason
    assert r.stats.stages >= 2


def test_annotated_module_as_impl_is_partitioned_and_proved(megatron) -> None:
    pre, _ = megatron
    spec = jax.jit(mlp).lower(*[np.ones(sh, np.float32) for sh in [(8, 16), (16, 32), (32, 16)]])
    r = tv_ir.check(spec.as_text(debug_info=True), pre)
    assert r.verdict == "equivalent", r.reason
    assert "SPMD partitioning" in r.impl_name


@pytest.mark.parametrize(
    "groups, what",
    [
        ("replica_groups={{0,1},{2,3},{4,5},{6,7}}", "reduces over half of the model axis"),
        ("replica_groups={{0},{1},{2},{3},{4},{5},{6},{7}}", "missing all_reduce"),
        ("replica_groups={{0,4},{1,5},{2,6},{3,7}}", "reduces over the wrong mesh axis"),
    ],
)
def test_wrong_replica_groups_are_refuted(megatron, groups: str, what: str) -> None:
    pre, parted = megatron
    bad = parted.per_device_hlo.replace(GROUPS, groups)
    r = _check(pre, parted, bad)
    assert r.verdict == "not_equivalent", what
    assert r.counterexample.device is not None
    assert r.location.impl.op == "stablehlo.all_reduce"


def test_result_without_a_layout_is_bad_input(megatron, tmp_path) -> None:
    pre, parted = megatron
    (tmp_path / "spec.mlir").write_text(pre)
    (tmp_path / "impl.hlo").write_text(parted.per_device_hlo)  # result sharding not in HLO
    r = subprocess.run(
        [sys.executable, "-m", "tv_ir.cli", "check", "spec.mlir", "impl.hlo"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 3, r.stderr
    assert "layout" in r.stderr and "Traceback" not in r.stderr


def test_tv_partition_command(megatron, tmp_path) -> None:
    pre, _ = megatron
    (tmp_path / "pre.mlir").write_text(pre)
    r = subprocess.run(
        [sys.executable, "-m", "tv_ir.cli", "partition", "pre.mlir"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("EQUIVALENT")


# a jit step annotated for 512 x 8 devices (lowered on an AbstractMesh)
PRE_4096 = """
module @jit_step attributes {mhlo.num_partitions = 4096 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["data"=512, "model"=8]>
  func.func public @main(
      %arg0: tensor<32x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}]>},
      %arg1: tensor<1024x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>})
      -> (tensor<16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"model"}]>}) {
    %0 = stablehlo.dot_general %arg1, %arg0, contracting_dims = [1] x [0]
      : (tensor<1024x32xf32>, tensor<32x16xf32>) -> tensor<1024x16xf32>
    %1 = stablehlo.tanh %0 : tensor<1024x16xf32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %2 = stablehlo.reduce(%1 init: %cst) applies stablehlo.add across dimensions = [0]
      : (tensor<1024x16xf32>, tensor<f32>) -> tensor<16xf32>
    return %2 : tensor<16xf32>
  }
}
"""


def test_tv_partition_asks_xla_for_the_modules_devices(tmp_path) -> None:
    # no XLA_FLAGS: the command reads the partition count (4,096: past what XLA's CPU
    # client compiles for without collectives, which tv gives it)
    (tmp_path / "pre.mlir").write_text(PRE_4096)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    r = subprocess.run(
        [sys.executable, "-m", "tv_ir.cli", "partition", "pre.mlir"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("EQUIVALENT"), r.stdout
    assert "(4096 devices)" in r.stdout and "mesh reduction: 4,096 ->" in r.stdout, r.stdout


def test_large_constants_survive_partitioning() -> None:
    """XLA's dumps elide constants of more than a few elements (`constant({...})`) unless
    asked: a causal mask must reach the per-device program whole, and an elided dump is
    refused rather than read with made-up values."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    mask = np.tril(np.ones((16, 16), bool))

    def masked(x):
        return jax.numpy.where(mask, x, 0.0)

    x = np.ones((16, 16), np.float32)
    s = NamedSharding(mesh, P("data", None))
    pre = jax.jit(masked, in_shardings=s, out_shardings=s).lower(x).as_text(debug_info=True)
    r = tv_ir.check(jax.jit(masked).lower(x).as_text(), pre)
    assert r.verdict == "equivalent", str(r)
    elided = "constant({...})"
    hlo = partition(pre).per_device_hlo
    cut = hlo.index("pred[16,16]{1,0} constant(") + len("pred[16,16]{1,0} ")
    hlo = hlo[:cut] + elided + hlo[hlo.index(")", hlo.index("} })", cut)) + 1 :]
    with pytest.raises(tv_ir.BadInput, match="elided constants"):
        tv_ir.load(hlo)


def test_mesh_axes_replica_groups_keep_their_device_order() -> None:
    """XLA prints replica groups over a mesh whose devices are permuted
    (`mesh[...], device_ids=([2,4]T(1,0)) {'axis_0'}`); jaxlib's HLO -> StableHLO conversion
    drops the permutation, so tv expands the groups itself. A reshard that XLA partitions into
    such an all_to_all must be proved."""
    from tv_ir.ir.importer import dense_mesh_replica_groups

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))

    def reshard(x):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("model", None))) * 2

    x = np.ones((8, 8), np.float32)
    f = jax.jit(
        reshard,
        in_shardings=NamedSharding(mesh, P(None, "model")),
        out_shardings=NamedSharding(mesh, P("model", None)),
    )
    pre = f.lower(x).as_text(debug_info=True)
    assert "device_ids=" in partition(pre).per_device_hlo  # the form this test is about
    assert partition_and_check(pre).verdict == "equivalent"
    groups = "replica_groups=mesh['a'=4,'b'=1,'c'=2], device_ids=([2,4]T(1,0)) {'a'}"
    assert dense_mesh_replica_groups(groups) == "replica_groups={{0,1,2,3},{4,5,6,7}}"
    sub = "replica_groups=mesh['x'=8] {'x':(2)2}"
    assert dense_mesh_replica_groups(sub) == "replica_groups={{0,2},{1,3},{4,6},{5,7}}"


def test_refutation_through_the_partitioner_names_mesh_coordinates() -> None:
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    x = np.ones((8, 8), np.float32)
    s = NamedSharding(mesh, P("data", "model"))
    impl = jax.jit(lambda a: a * 3, in_shardings=s, out_shardings=s).lower(x)
    r = tv_ir.check(jax.jit(lambda a: a * 2).lower(x).as_text(), impl.as_text(debug_info=True))
    assert r.verdict == "not_equivalent"
    ce = r.counterexample
    row, col = ce.index
    assert ce.mesh_coords == {"data": row // 4, "model": col // 2}
    assert f"(data={row // 4}, model={col // 2})" in str(r)
