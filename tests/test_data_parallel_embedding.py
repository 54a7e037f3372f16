"""The embedding gradient under data parallelism (issue #13, MaxText's train step): each
device scatter-adds its tokens' cotangents into a zero table and the tables are psum'd; the
spec scatter-adds the whole batch once. Written as a user would, with shard_map and with
XLA's partitioner (a jit with the batch sharded)."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tv_ir.frontends.jax import verify

from tv_ir.report.result import EQUIVALENT, NOT_EQUIVALENT

F32 = jnp.float32
VOCAB, WIDTH, BATCH, SEQ = 8, 4, 8, 2
ARGS = (
    jax.ShapeDtypeStruct((VOCAB, WIDTH), F32),  # embedding table
    jax.ShapeDtypeStruct((WIDTH, VOCAB), F32),  # output head
    jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32),  # tokens
    jax.ShapeDtypeStruct((BATCH, SEQ, VOCAB), F32),  # one-hot targets
)


def loss_fn(emb, head, tokens, targets):
    logp = jax.nn.log_softmax(jnp.tanh(emb[tokens]) @ head, axis=-1)
    return -jnp.mean(jnp.sum(targets * logp, axis=-1))


def sgd_step(emb, head, tokens, targets):
    """The specification: one SGD step over the whole batch on one device."""
    loss, (g_emb, g_head) = jax.value_and_grad(loss_fn, argnums=(0, 1))(emb, head, tokens, targets)
    return emb - 0.1 * g_emb, head - 0.1 * g_head, loss


def mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    return Mesh(np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape), names)


def dp_step(bug: bool = False):
    """Data parallel over 4 devices: each device's share of the loss, gradients psum'd."""

    def body(emb, head, tokens, targets):
        def local_loss(emb, head):
            return loss_fn(emb, head, tokens, targets) / 4

        loss, (g_emb, g_head) = jax.value_and_grad(local_loss, argnums=(0, 1))(emb, head)
        g_head = jax.lax.psum(g_head, "data")
        if not bug:  # with the bug, the embedding gradient is not psum'd
            g_emb = jax.lax.psum(g_emb, "data")
        return emb - 0.1 * g_emb, head - 0.1 * g_head, jax.lax.psum(loss, "data")  # UPDATE

    return jax.shard_map(
        body,
        mesh=mesh((4,), ("data",)),
        in_specs=(P(), P(), P("data"), P("data")),
        out_specs=(P(), P(), P()),
        check_vma=False,
    )


def dp_tp_step(bug: bool = False):
    """Data parallel over `data` (2) beside a `model` axis (2) the batch is not split over:
    the embedding gradient must be psum'd over `data`."""

    def body(emb, head, tokens, targets):
        def local_loss(emb, head):
            return loss_fn(emb, head, tokens, targets) / 2

        loss, (g_emb, g_head) = jax.value_and_grad(local_loss, argnums=(0, 1))(emb, head)
        g_head = jax.lax.psum(g_head, "data")
        g_emb = jax.lax.psum(g_emb, "model" if bug else "data")  # BUG wrong axis
        return emb - 0.1 * g_emb, head - 0.1 * g_head, jax.lax.psum(loss, "data")

    return jax.shard_map(
        body,
        mesh=mesh((2, 2), ("data", "model")),
        in_specs=(P(), P(), P("data"), P("data")),
        out_specs=(P(), P(), P()),
        check_vma=False,
    )


def line_of(fn, marker: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return next(i for i, ln in enumerate(lines, first) if marker in ln)


def test_psum_of_per_device_scatter_adds_is_proved():
    report = verify(dp_step(), *ARGS, spec=sgd_step)
    assert report.verdict == EQUIVALENT, report


def test_partitioned_by_xla_with_the_batch_sharded_is_proved():
    m = mesh((4,), ("data",))
    rep, batch = NamedSharding(m, P()), NamedSharding(m, P("data"))
    step = jax.jit(sgd_step, in_shardings=(rep, rep, batch, batch), out_shardings=rep)
    report = verify(step, *ARGS, spec=sgd_step)
    assert report.verdict == EQUIVALENT, report


def test_vocab_sharded_table_with_fsdp_batch_is_proved():
    """MaxText's layout: the table's vocabulary split over `tensor`, its width over `fsdp`,
    the batch over `fsdp`; XLA scatters each device's tokens into its vocabulary shard
    (indices offset, the others dropped) and all-reduces over `fsdp`."""
    m = mesh((4, 2), ("fsdp", "tensor"))

    def on(*spec):
        return NamedSharding(m, P(*spec))

    table, head = on("tensor", "fsdp"), on("fsdp", "tensor")
    step = jax.jit(
        sgd_step,
        in_shardings=(table, head, on("fsdp"), on("fsdp")),
        out_shardings=(table, head, on()),
    )
    report = verify(step, *ARGS, spec=sgd_step)
    assert report.verdict == EQUIVALENT, report


def test_vocab_rows_per_device_with_fsdp_batch_is_proved():
    """What XLA makes of MaxText's embedding gradient: each device scatter-adds its tokens'
    cotangents into its own rows of the vocabulary (local index `token - offset` as an
    int32 that may wrap; tokens of other rows dropped), then all-reduces over `fsdp`. The
    local index compared to row j is the spec's `token == offset + j`: equal normal forms
    (before: a Z3 timeout)."""
    vocab = 20  # not a power of two: offsets of 10

    def step(emb, tokens, cotangent):
        _, pull_back = jax.vjp(lambda e: e[tokens], emb)
        return emb - 0.1 * pull_back(cotangent)[0]

    m = mesh((4, 2), ("fsdp", "tensor"))
    rows, batch = NamedSharding(m, P("tensor", None)), NamedSharding(m, P("fsdp"))
    sharded = jax.jit(step, in_shardings=(rows, batch, batch), out_shardings=rows)
    args = (
        jax.ShapeDtypeStruct((vocab, WIDTH), F32),
        jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32),
        jax.ShapeDtypeStruct((BATCH, SEQ, WIDTH), F32),
    )
    report = verify(sharded, *args, spec=step)
    assert report.verdict == EQUIVALENT, report
    assert report.stats.proved_by_z3 == 0, report.stats


def _replayed(report, step) -> None:
    """The counterexample's inputs, run through JAX, differ where the report says."""
    cx = report.counterexample
    emb, head, tokens, targets = (np.asarray(v) for v in cx.inputs.values())
    args = (emb.astype(np.float32), head.astype(np.float32), tokens.astype(np.int32))
    args += (targets.astype(np.float32),)
    want = np.asarray(sgd_step(*args)[cx.output])
    got = np.asarray(step(*args)[cx.output])
    assert not np.allclose(want, got, rtol=1e-4, atol=1e-5), (cx, want, got)


def test_unsynced_embedding_gradient_is_refuted_at_its_line():
    """A per-device scatter-add is a partial sum of the spec's gradient: tv names it (the
    lookup's line) and the line that uses it as if it were the whole gradient."""
    step = dp_step(bug=True)
    report = verify(step, *ARGS, spec=sgd_step)
    assert report.verdict == NOT_EQUIVALENT, report
    _replayed(report, step)
    where = report.location
    assert (where.impl.op, where.file, where.line) == (
        "stablehlo.scatter",
        __file__,
        line_of(loss_fn, "emb[tokens]"),
    ), where
    assert where.used_at.line == line_of(dp_step, "# UPDATE"), where


def test_psum_over_the_wrong_axis_is_refuted_with_its_line():
    """tv names the shard_map whose result differs, and among the sites feeding it the
    psum over the wrong axis. (Naming the psum itself would need its result, twice a
    partial sum over `data`, told apart from a layout of the spec's gradient: not done.)"""
    step = dp_tp_step(bug=True)
    report = verify(step, *ARGS, spec=sgd_step)
    assert report.verdict == NOT_EQUIVALENT, report
    _replayed(report, step)
    sites = [report.location.impl, *report.location.related]
    bug = (__file__, line_of(dp_tp_step, "# BUG wrong axis"))
    assert bug in [(s.file, s.line) for s in sites], report.location


def test_correct_axis_on_the_two_axis_mesh_is_proved():
    report = verify(dp_tp_step(), *ARGS, spec=sgd_step)
    assert report.verdict == EQUIVALENT, report
