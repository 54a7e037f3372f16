"""Programs that never return: the devices of a collective's group part ways at a branch,
and those that reach the collective wait for the others forever (on XLA, its CPU runtime
aborts after a minute). Where the spec returns on the same inputs, that is a refutation
whose counterexample is the inputs and the devices that wait."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from test_collectives import CHANNEL, DIVERGING_IF, GLOBAL_IDS, region
from tv_ir.frontends.jax import verify

import tv_ir
from tv_ir.cli import main as tv_main


def lower(f, *args) -> str:
    return jax.jit(f).lower(*args).as_text(debug_info=True)


def sum_where_positive(mesh):
    """Each device psums its rows over "model" only where its own first element is
    positive: devices of one psum group decide differently on most inputs."""

    def body(x):
        return jax.lax.cond(
            x[0, 0] > 0,  # BUG: a per-device decision guarding a collective
            lambda v: jax.lax.psum(v, "model"),
            lambda v: v,
            x,
        )

    return jax.shard_map(
        body, mesh=mesh, in_specs=P(None, "model"), out_specs=P(None, "model"), check_vma=False
    )


def summed_blocks(x):
    return x


def test_a_collective_under_a_per_device_decision_is_refuted_as_a_hang():
    mesh = Mesh(np.array(jax.devices()[:2]), ("model",))
    x = np.ones((4, 8), np.float32)
    report = tv_ir.check(lower(summed_blocks, x), lower(sum_where_positive(mesh), x))
    assert report.verdict == "not_equivalent", report.reason
    ce = report.counterexample
    assert ce.hang is not None and "all_reduce" in ce.hang and "group [0, 1]" in ce.hang
    assert ce.device in (0, 1) and ce.mesh_coords == {"model": ce.device}
    # the devices decide differently on the counterexample: device 0's block against 1's
    x = ce.inputs[next(iter(ce.inputs))]
    assert (x[0, 0] > 0) != (x[0, 4] > 0)
    assert report.location.impl.op == "stablehlo.case"
    assert report.location.impl.file.endswith("test_hangs.py")
    assert any(site.op == "stablehlo.all_reduce" for site in report.location.related)
    text = str(report)
    assert "the implementation never returns" in text and f"device {ce.device}" in text
    # the same through the JAX front end (its notes name outputs: none here)
    again = verify(sum_where_positive(mesh), x, spec=summed_blocks)
    assert again.verdict == "not_equivalent" and again.counterexample.hang is not None


def test_a_loop_whose_trip_count_differs_across_a_psum_group_is_refuted_as_a_hang():
    # each device psums as many times as its own block says: one device goes round again
    # and waits at the psum for one that has left the loop
    mesh = Mesh(np.array(jax.devices()[:2]), ("model",))

    def body(x):
        trips = (x[0, 0] > 0).astype(jnp.int32) + 1
        return jax.lax.fori_loop(0, trips, lambda i, v: jax.lax.psum(v, "model") / 2, x)

    impl = jax.shard_map(
        body, mesh=mesh, in_specs=P(None, "model"), out_specs=P(None, "model"), check_vma=False
    )
    x = np.ones((4, 8), np.float32)
    report = tv_ir.check(lower(summed_blocks, x), lower(impl, x))
    assert report.verdict == "not_equivalent", report.reason
    ce = report.counterexample
    assert "stablehlo.while: the loop predicate differs" in ce.hang, ce.hang
    assert "all_reduce" in ce.hang and "group [0, 1]" in ce.hang
    assert report.location.impl.op == "stablehlo.while"


def test_a_branch_every_group_takes_whole_is_not_a_hang():
    # the same decision on every device (the first element of the whole input): proved
    mesh = Mesh(np.array(jax.devices()[:2]), ("model",))

    def body(x, first):
        return jax.lax.cond(
            first[0] > 0, lambda v: 2 * jax.lax.psum(v, "model"), lambda v: 2 * v, x
        )

    impl = jax.shard_map(
        body, mesh=mesh, in_specs=(P(None, "model"), P()), out_specs=P(None, "model"),
        check_vma=False,
    )  # fmt: skip

    def spec(x, first):
        both = x[:, :4] + x[:, 4:]
        return jnp.where(first[0] > 0, 2 * jnp.concatenate([both, both], axis=1), 2 * x)

    x, first = np.ones((4, 8), np.float32), np.ones((1,), np.float32)
    report = tv_ir.check(lower(spec, x, first), lower(impl, x, first))
    assert report.verdict == "equivalent", report.reason


HANGS_EVERYWHERE = """module @hangs attributes {
    mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%a0: tensor<2xf32> {mhlo.sharding = "{replicated}"})
      -> (tensor<2xf32> {mhlo.sharding = "{replicated}"}) {
BODY
  }
}
""".replace(
    "BODY",
    DIVERGING_IF.replace(
        "TAKEN",
        f"""%s = "stablehlo.all_reduce"(%a0) {region("add")}{{replica_groups = dense<[[0, 4],
          [1, 5], [2, 6], [3, 7]]> : tensor<4x2xi64>, {CHANNEL}, {GLOBAL_IDS}}}
          : (tensor<2xf32>) -> tensor<2xf32>
      stablehlo.return %s : tensor<2xf32>""",
    ),
)


IDENTITY = (
    "func.func @main(%a0: tensor<2xf32>) -> tensor<2xf32> {\n  return %a0 : tensor<2xf32>\n}\n"
)


def test_tv_check_says_the_per_device_program_hangs(tmp_path, capsys):
    # devices 0-3 take the branch, each all-reducing with one of 4-7, which never do: the
    # program hangs on every input; the spec (the identity) returns
    impl = tmp_path / "impl.mlir"
    impl.write_text(HANGS_EVERYWHERE)
    spec = tmp_path / "spec.mlir"
    spec.write_text(IDENTITY)
    code = tv_main(["check", str(spec), str(impl), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1, out
    assert out["verdict"] == "not_equivalent"
    ce = out["counterexample"]
    assert "whose group [0, 4]: device 0 takes and device 4 does not" in ce["hang"]
    assert ce["device"] == 0 and ce["output"] is None


def test_a_hang_the_inputs_decide_is_never_proved():
    """Symbolic inputs decide nothing: a program that hangs only on inputs no concrete
    run meets is `unknown`, or refuted where a run meets them, never `equivalent`."""
    mesh = Mesh(np.array(jax.devices()[:2]), ("model",))

    def body(x):
        return jax.lax.cond(
            x[0, 0] > 1e30,  # no random input reaches it
            lambda v: jax.lax.psum(v, "model"),
            lambda v: v,
            x,
        )

    impl = jax.shard_map(
        body, mesh=mesh, in_specs=P(None, "model"), out_specs=P(None, "model"), check_vma=False
    )
    x = np.ones((4, 8), np.float32)
    report = tv_ir.check(lower(summed_blocks, x), lower(impl, x), time_limit=60)
    assert report.verdict in ("unknown", "not_equivalent"), report
    if report.verdict == "not_equivalent":
        assert report.counterexample.hang is not None


def test_a_hang_found_on_the_reduced_mesh_is_replayed_on_the_real_one():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))

    def body(x):
        return jax.lax.cond(
            x[0, 0] > 0, lambda v: jax.lax.psum(v, "model"), lambda v: v, x
        )  # BUG: each device decides on its own block

    impl = jax.shard_map(
        body, mesh=mesh, in_specs=P("data", "model"), out_specs=P("data", "model"),
        check_vma=False,
    )  # fmt: skip
    x = np.ones((8, 8), np.float32)
    report = tv_ir.check(lower(summed_blocks, x), lower(impl, x))
    assert report.verdict == "not_equivalent", report.reason
    assert report.mesh_reduction["devices"] == [8, 4]
    assert report.counterexample.hang is not None
    assert any("replayed on every device of the real mesh" in n for n in report.notes)


def test_a_suite_line_says_the_pair_hangs(tmp_path, capsys):
    d = tmp_path / "suite"
    d.mkdir()
    (d / "hang.impl.mlir").write_text(HANGS_EVERYWHERE)
    (d / "hang.spec.mlir").write_text(IDENTITY)
    code = tv_main(["check", str(d), "--cache", str(tmp_path / "cache"), "--workers", "1"])
    out = capsys.readouterr().out
    line = next((x for x in out.splitlines() if " hang" in x), out)
    assert code == 1 and line.startswith("FAIL not_equivalent"), line
    assert "hangs at impl stablehlo.if" in line


def skips_psum_on(mesh, axis: str, device: int, over: str):
    """Every device psums over `over`, except the one at `device` along `axis` (a bug planted
    on one device): its group waits for it forever."""

    def body(x):
        return jax.lax.cond(
            jax.lax.axis_index(axis) == device,  # BUG: one device skips the psum
            lambda v: v,
            lambda v: jax.lax.pcast(jax.lax.psum(v, over), over, to="varying"),
            x,
        )

    return jax.shard_map(body, mesh=mesh, in_specs=P(axis), out_specs=P(axis))


def psum_blocks_of(n: int):
    def spec(x):
        return jnp.tile(x.reshape(n, -1).sum(0), n)

    return spec


def test_a_hang_on_device_4095_of_8192_is_named_at_its_real_device():
    """Issue #12: the real mesh is too large to run, so the hang is found on the reduced mesh;
    the report names the real device that skips the collective, with its coordinates, and
    the real group (it named the reduced mesh's device ids; the check for counts of devices
    run beside crashed on the hang)."""
    from jax.sharding import AbstractMesh

    x = jax.ShapeDtypeStruct((8192 * 64,), jnp.float32)
    impl = skips_psum_on(AbstractMesh((8192,), ("data",)), "data", 4095, "data")
    report = tv_ir.check(lower(psum_blocks_of(8192), x), lower(impl, x))
    assert report.verdict == "not_equivalent", report.reason
    assert report.mesh_reduction["devices"] == [8192, 8]
    hang = report.counterexample.hang
    assert "whose group [0-8191]: devices [0-4094, 4096-8191] take and device 4095 (data=4095)" \
        " does not" in hang, hang  # fmt: skip
    assert report.counterexample.hang_waiting == [d for d in range(8192) if d != 4095]
    assert not any("replayed on every device of the real mesh" in n for n in report.notes)


def test_a_hang_across_a_strided_group_names_its_devices_in_runs():
    """A psum over "data" on a data x model mesh: each group strides the device ids; the
    hang's devices are written as runs, not a list of 64 ids (both with the real mesh
    replayed and with only the reduced one run)."""
    from jax.sharding import AbstractMesh

    mesh = AbstractMesh((64, 4), ("data", "model"))
    impl = jax.shard_map(
        lambda x: jax.lax.cond(
            jax.lax.axis_index("data") == 37,  # BUG: one row of devices skips the psum
            lambda v: v,
            lambda v: jax.lax.pcast(jax.lax.psum(v, "data"), "data", to="varying"),
            x,
        ),
        mesh=mesh,
        in_specs=P("data", "model"),
        out_specs=P("data", "model"),
    )

    def spec(x):
        return jnp.tile(x.reshape(64, -1, x.shape[1]).sum(0), (64, 1))

    for rows in (64, 64 * 512):  # the real mesh run, then too large to run
        x = jax.ShapeDtypeStruct((rows, 8), jnp.float32)
        report = tv_ir.check(lower(spec, x), lower(impl, x))
        assert report.verdict == "not_equivalent", report.reason
        ce = report.counterexample
        group = f"whose group [{ce.device}, {ce.device + 4}, ..., {ce.device + 252}]: devices "
        assert group in ce.hang, ce.hang
        assert f"take and device {148 + ce.device} (data=37, model={ce.device}) does not" in ce.hang


def test_device_ids_are_written_in_runs():
    from tv_ir.errors import id_ranges

    assert id_ranges(range(512)) == "0-511"
    assert id_ranges([d for d in range(512) if d != 300]) == "0-299, 301-511"
    assert id_ranges([1, 2, 4]) == "1, 2, 4"
    assert (
        id_ranges([d for d in range(0, 512, 4) if d != 152]) == "0, 4, ..., 148, 156, 160, ..., 508"
    )
    squares = id_ranges([d * d for d in range(200)], limit=30)
    assert squares == "0, 1, 4, 9, 16, 25, 36, 49, ... (200 devices)"
