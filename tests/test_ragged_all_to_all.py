"""`jax.lax.ragged_all_to_all` (MaxText's MoE token exchange): XLA:CPU cannot compile it,
so its meaning is JAX's documented contract, checked against the example in its docstring
(computed by hand) and against `all_to_all` when every slice has the same size."""

from __future__ import annotations

from functools import partial

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import tv_ir
from tv_ir.semantics.interpreters.interp import evaluate

MESH = Mesh(np.array(jax.devices()[:2]), ("x",))
SPECS = (P("x"),) * 6


def ragged_program(input_offsets, send_sizes, output_offsets, recv_sizes) -> str:
    """A shard_map over 2 devices exchanging ragged slices of its operand; per-device
    offsets and sizes given as (device 0's, device 1's) lists, closed over as constants."""

    @jax.jit
    @partial(jax.shard_map, mesh=MESH, in_specs=SPECS[:2], out_specs=P("x"))
    def step(operand, output):
        me = jax.lax.axis_index("x")
        pick = [
            jax.numpy.asarray(v, np.int32)[me]
            for v in (input_offsets, send_sizes, output_offsets, recv_sizes)
        ]
        return jax.lax.ragged_all_to_all(operand, output, *pick, axis_name="x")

    return step.lower(np.zeros(6, np.float32), np.zeros(8, np.float32)).as_text()


def test_the_docstring_example() -> None:
    # jax.lax.ragged_all_to_all's example: device 0 sends [1] and [2, 2], device 1 [3], [4]
    text = ragged_program(
        input_offsets=[[0, 1], [0, 1]],
        send_sizes=[[1, 2], [1, 1]],
        output_offsets=[[0, 0], [1, 2]],
        recv_sizes=[[1, 1], [2, 1]],
    )
    operand = np.array([1, 2, 2, 3, 4, 0], np.float64)
    (result,) = evaluate(tv_ir.load(text), [operand, np.zeros(8)])
    np.testing.assert_array_equal(result, [1, 3, 0, 0, 2, 2, 4, 0])


def all_to_all_program() -> str:
    @jax.jit
    @partial(jax.shard_map, mesh=MESH, in_specs=SPECS[:2], out_specs=P("x"))
    def step(operand, output):
        # each device's 3 rows as [first 2 | last 1 padded]: all_to_all of 2-row blocks
        blocks = jax.numpy.concatenate([operand[:2], operand[1:3]])
        return output.at[:4].set(jax.lax.all_to_all(blocks, "x", 0, 0, tiled=True))

    return step.lower(np.zeros(6, np.float32), np.zeros(8, np.float32)).as_text()


@pytest.mark.parametrize(
    ("offsets", "verdict"), [([0, 1], "equivalent"), ([1, 0], "not_equivalent")]
)
def test_uniform_slices_are_an_all_to_all(offsets: list, verdict: str) -> None:
    # every slice 2 rows: sender s's slice i (rows i, i + 1) goes to member i, at rows 2 * s
    ragged = ragged_program(
        input_offsets=[offsets, offsets],
        send_sizes=[[2, 2], [2, 2]],
        output_offsets=[[0, 0], [2, 2]],
        recv_sizes=[[2, 2], [2, 2]],
    )
    r = tv_ir.check(all_to_all_program(), ragged, time_limit=120)
    assert r.verdict == verdict, r


def test_sizes_that_disagree_are_unknown() -> None:
    text = ragged_program(
        input_offsets=[[0, 1], [0, 1]],
        send_sizes=[[1, 2], [1, 1]],
        output_offsets=[[0, 0], [1, 2]],
        recv_sizes=[[1, 1], [1, 1]],  # device 1 expects 1 row from device 0, which sends 2
    )
    r = tv_ir.check(text, text, time_limit=60)
    assert r.verdict == "unknown", r
    assert "mhlo.ragged_all_to_all" in str(r.unsupported)


def test_a_single_device_reading_needs_spmd_execution() -> None:
    from tv_ir.errors import Unsupported

    text = ragged_program([[0, 1], [0, 1]], [[1, 1], [1, 1]], [[0, 0], [1, 1]], [[1, 1], [1, 1]])
    module = tv_ir.load(text)
    (body,) = [op for op in module.main.body.ops if op.name == "sdy.manual_computation"]
    ragged = next(op for op in body.regions[0].block.ops if op.name == "mhlo.ragged_all_to_all")
    with pytest.raises(Unsupported, match="needs SPMD execution"):
        tv_ir.semantics.ops.lookup(ragged.name)


def test_xla_partitions_a_step_the_cpu_backend_cannot_compile() -> None:
    # XLA:CPU partitions a jit holding a ragged_all_to_all, then fails to emit code for it:
    # tv proves the partitioned program from the partitioner's output (was BadInput)
    from jax.sharding import NamedSharding
    from tv_ir.frontends.jax import verify

    sharded = NamedSharding(MESH, P("x"))

    @partial(jax.shard_map, mesh=MESH, in_specs=SPECS[:2], out_specs=P("x"))
    def exchange(operand, output):
        me = jax.lax.axis_index("x")
        pick = [
            jax.numpy.asarray(v, np.int32)[me]
            for v in ([[0, 1], [0, 1]], [[1, 2], [1, 1]], [[0, 0], [1, 2]], [[1, 1], [2, 1]])
        ]
        return jax.lax.ragged_all_to_all(operand, output, *pick, axis_name="x")

    step = jax.jit(
        lambda a, b: exchange(a * 2, b) + 1,
        in_shardings=(sharded, sharded),
        out_shardings=sharded,
    )
    r = verify(step, np.zeros(6, np.float32), np.zeros(8, np.float32), time_limit=120)
    assert r.verdict == "equivalent", r
