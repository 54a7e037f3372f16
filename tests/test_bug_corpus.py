"""A corpus of planted parallelization bugs, each next to its correct version.

Every family is a plain single-device spec and one `jax.shard_map` body with explicit
collectives; `bug=None` builds the correct program and `bug="<name>"` plants one bug. A bug
that is a line of its own carries a trailing `# BUG: <name>` marker (the ops that change are
all created on that line, since JAX records the innermost user frame of each op), so the line
of tv's refutation can be checked against `bug_line(name)`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import tv_ir

TP = 4  # size of the 'model' / 'stage' / 'expert' / 'context' axes below


def mesh_2x4() -> Mesh:
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))


def mesh_1d(name: str) -> Mesh:
    return Mesh(np.array(jax.devices()[:TP]), (name,))


def smap(body, mesh, in_specs, out_specs):
    # check_vma=False: several buggy bodies (a missing psum, a psum over the wrong axis)
    # do not lower with it, and local gradients must stay local (see test_shard_map.py)
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


# ---------------------------------------------------------------- Megatron MLP (TP)


def mlp_spec(x, w1, w2):
    return jax.nn.relu(x @ w1) @ w2


def mlp_impl(bug=None):
    def body(x, w1, w2):
        y = jax.nn.relu(x @ w1) @ w2
        if bug == "mlp_missing_psum":
            return y  # BUG: mlp_missing_psum
        if bug == "mlp_psum_wrong_axis":
            return jax.lax.psum(y, "data")  # BUG: mlp_psum_wrong_axis
        y = jax.lax.psum(y, "model")
        if bug == "mlp_extra_psum":
            y = jax.lax.psum(y, "model")  # BUG: mlp_extra_psum
        return y

    specs = (P("data", None), P(None, "model"), P("model", None))
    return smap(body, mesh_2x4(), specs, P("data", None))


# ------------------------------------------------- tensor-parallel attention (heads)

HEADS = 4


def attn_spec(x, wq, wk, wv, wo):
    s = x.shape[0]
    q, k, v = ((x @ w).reshape(s, HEADS, -1).transpose(1, 0, 2) for w in (wq, wk, wv))
    a = jax.nn.softmax(q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1]), axis=-1)
    return (a @ v).transpose(1, 0, 2).reshape(s, -1) @ wo


def attn_impl(bug=None):
    def body(x, wq, wk, wv, wo):
        s = x.shape[0]
        if bug == "attn_heads_not_divided":
            q, k, v = ((x @ w).reshape(s, HEADS, -1).transpose(1, 0, 2) for w in (wq, wk, wv))  # BUG: attn_heads_not_divided  # fmt: skip  # noqa: E501
        else:
            q, k, v = ((x @ w).reshape(s, HEADS // TP, -1).transpose(1, 0, 2) for w in (wq, wk, wv))  # fmt: skip  # noqa: E501
        if bug == "attn_wrong_scale":
            sc = q @ k.transpose(0, 2, 1) / np.sqrt(x.shape[1])  # BUG: attn_wrong_scale
        else:
            sc = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
        a = jax.nn.softmax(sc, axis=-1)
        y = (a @ v).transpose(1, 0, 2).reshape(s, -1) @ wo
        if bug == "attn_missing_psum":
            return y  # BUG: attn_missing_psum
        return jax.lax.psum(y, "model")

    # attention mixes the whole sequence: x is replicated, heads are split over 'model'
    col = P(None, "model")
    specs = (P(), col, col, col, P("model", None))
    return smap(body, mesh_1d("model"), specs, P())


# ------------------------------------ sequence-parallel MLP (all_gather / psum_scatter)

SEQ, DIM = 16, 16


def sp_impl(bug=None):
    def body(x, w1, w2):
        seq, dim = x.shape[0] * TP, x.shape[1]
        if bug == "sp_all_gather_wrong_dim":
            xg = jax.lax.all_gather(x, "model", axis=1).reshape(seq, dim)  # BUG: sp_all_gather_wrong_dim  # fmt: skip  # noqa: E501
        else:
            xg = jax.lax.all_gather(x, "model", axis=0).reshape(seq, dim)
        y = jax.nn.relu(xg @ w1) @ w2
        if bug == "sp_psum_scatter_wrong_dim":
            return jax.lax.psum_scatter(y.reshape(seq // TP, TP, dim), "model", scatter_dimension=1)  # BUG: sp_psum_scatter_wrong_dim  # fmt: skip  # noqa: E501
        return jax.lax.psum_scatter(y.reshape(TP, seq // TP, dim), "model", scatter_dimension=0)  # fmt: skip  # noqa: E501

    specs = (P("model", None), P(None, "model"), P("model", None))
    return smap(body, mesh_1d("model"), specs, P("model", None))


# -------------------------------- normalisation over a sequence sharded over 'model'


def seqnorm_spec(x):
    mu = jnp.mean(x, axis=0)
    var = jnp.mean((x - mu) ** 2, axis=0)
    return (x - mu) * jax.lax.rsqrt(var + 1e-5)


def seqnorm_impl(bug=None):
    def body(x):
        seq = x.shape[0] * TP
        if bug == "seqnorm_mean_not_reduced":
            mu = jnp.mean(x, axis=0)  # BUG: seqnorm_mean_not_reduced
        else:
            mu = jax.lax.psum(jnp.sum(x, axis=0), "model") / seq
        if bug == "seqnorm_var_not_reduced":
            var = jnp.mean((x - mu) ** 2, axis=0)  # BUG: seqnorm_var_not_reduced
        else:
            var = jax.lax.psum(jnp.sum((x - mu) ** 2, axis=0), "model") / seq
        return (x - mu) * jax.lax.rsqrt(var + 1e-5)

    return smap(body, mesh_1d("model"), (P("model", None),), P("model", None))


# ---------------------------------------------------------- data-parallel gradients


def mse(w, x, y):
    return jnp.mean((jnp.tanh(x @ w) - y) ** 2)


dp_spec = jax.grad(mse)


def dp_impl(bug=None):
    def body(w, x, y):
        g = jax.grad(mse)(w, x, y)
        if bug == "dp_grad_summed":
            return jax.lax.psum(g, ("data", "model"))  # BUG: dp_grad_summed
        if bug == "dp_grad_not_synced":
            return g  # BUG: dp_grad_not_synced
        return jax.lax.pmean(g, ("data", "model"))

    batch = P(("data", "model"))
    return smap(body, mesh_2x4(), (P(), batch, batch), P())


# ------------------------------------- FSDP: gather weights, reduce-scatter gradients


def fsdp_impl(bug=None):
    def body(w, x, y):
        whole = (w.shape[0] * TP, w.shape[1])
        if bug == "fsdp_gather_wrong_dim":
            wf = jax.lax.all_gather(w, "data", axis=1).reshape(whole)  # BUG: fsdp_gather_wrong_dim
        else:
            wf = jax.lax.all_gather(w, "data", axis=0).reshape(whole)
        g = jax.grad(mse)(wf, x, y)
        if bug == "fsdp_grad_unscaled":
            return jax.lax.psum_scatter(g, "data", tiled=True)  # BUG: fsdp_grad_unscaled
        if bug == "fsdp_grad_not_reduced":
            return g.reshape(TP, -1, g.shape[1])[jax.lax.axis_index("data")]  # BUG: fsdp_grad_not_reduced  # fmt: skip  # noqa: E501
        return jax.lax.psum_scatter(g, "data", tiled=True) / TP

    rows = P("data", None)
    return smap(body, mesh_1d("data"), (rows, rows, rows), rows)


# ---------------------------------------------- pipeline stages over ppermute (GPipe)

MICRO = 2


def pipe_spec(ws, xs):
    h = xs
    for i in range(TP):
        h = jnp.tanh(h @ ws[i])
    return h


def pipe_impl(bug=None):
    def body(ws, xs):
        stage = jax.lax.axis_index("stage")
        state = jnp.zeros_like(xs[0])
        outs = jnp.zeros_like(xs)
        for t in range(MICRO + TP - 1):
            if bug == "pipe_microbatches_swapped":
                inp = jnp.where(stage == 0, xs[MICRO - 1 - min(t, MICRO - 1)], state)  # BUG: pipe_microbatches_swapped  # fmt: skip  # noqa: E501
            else:
                inp = jnp.where(stage == 0, xs[min(t, MICRO - 1)], state)
            out = jnp.tanh(inp @ ws[0])
            if t >= TP - 1:  # the last stage finishes micro-batch t - (TP - 1)
                outs = outs.at[t - TP + 1].set(jnp.where(stage == TP - 1, out, 0.0))
            if bug == "pipe_wrong_direction":
                state = jax.lax.ppermute(out, "stage", [(j + 1, j) for j in range(TP - 1)])  # BUG: pipe_wrong_direction  # fmt: skip  # noqa: E501
            else:
                state = jax.lax.ppermute(out, "stage", [(j, j + 1) for j in range(TP - 1)])
        return jax.lax.psum(outs, "stage")  # only the last stage holds results

    return smap(body, mesh_1d("stage"), (P("stage"), P()), P())


# ------------------------------------------------- expert parallelism over all_to_all

CAP = 2  # tokens per (group, expert)


def ep_spec(x, ws):
    xr = x.reshape(TP, TP, -1, x.shape[-1])  # (group, expert, capacity, dim)
    y = jax.nn.relu(jnp.einsum("gecd,edf->gecf", xr, ws))
    return y.reshape(x.shape)


def ep_impl(bug=None):
    def body(x, ws):
        # x: this group's tokens, sorted by expert; ws: this device's expert
        if bug == "ep_dispatch_wrong_dims":
            xe = jax.lax.all_to_all(x, "expert", 1, 1, tiled=True)  # BUG: ep_dispatch_wrong_dims
        else:
            xe = jax.lax.all_to_all(x, "expert", 0, 0, tiled=True)  # SITE: ep_dispatch
        ye = jax.nn.relu(xe @ ws[0])
        if bug == "ep_missing_combine":
            return ye  # BUG: ep_missing_combine
        return jax.lax.all_to_all(ye, "expert", 0, 0, tiled=True)

    return smap(body, mesh_1d("expert"), (P("expert"), P("expert")), P("expert"))


# ------------------------------------------------ ring all-gather matmul over ppermute


def matmul_spec(x, w):
    return x @ w


def ring_impl(bug=None):
    def body(x, w):
        me = jax.lax.axis_index("model")
        rows = x.shape[0]
        out = jnp.zeros((rows * TP, w.shape[1]), x.dtype)
        chunk = x
        for k in range(TP):
            if bug == "ring_wrong_offset":
                src = (me + k) % TP  # BUG: ring_wrong_offset
            else:
                src = (me - k) % TP  # the chunk held at step k came from device me - k
            out = jax.lax.dynamic_update_slice(out, chunk @ w, (src * rows, 0))
            if bug == "ring_wrong_direction":
                chunk = jax.lax.ppermute(chunk, "model", [(j, (j - 1) % TP) for j in range(TP)])  # BUG: ring_wrong_direction  # fmt: skip  # noqa: E501
            else:
                chunk = jax.lax.ppermute(chunk, "model", [(j, (j + 1) % TP) for j in range(TP)])
        return out

    return smap(body, mesh_1d("model"), (P("model", None), P(None, "model")), P(None, "model"))


# ------------------------------------------------------- context-parallel loss scaling
# The loss per feature (a vector), and the usual scalar loss.


def cp_spec(pred, target):
    return jnp.mean((pred - target) ** 2, axis=0)


def cp_impl(bug=None):
    def body(pred, target):
        d = pred - target
        if bug == "cp_loss_overscaled":
            return jax.lax.psum(jnp.mean(d * d, axis=0), "context")  # BUG: cp_loss_overscaled
        if bug == "cp_loss_not_reduced":
            return jnp.mean(d * d, axis=0)  # BUG: cp_loss_not_reduced
        return jax.lax.psum(jnp.sum(d * d, axis=0), "context") / (d.shape[0] * TP)

    return smap(body, mesh_1d("context"), (P("context", None),) * 2, P())


def cp_scalar_spec(pred, target):
    return jnp.mean((pred - target) ** 2)


def cp_scalar_impl(bug=None):
    def body(pred, target):
        d = pred - target
        if bug == "cp_scalar_loss_overscaled":
            return jax.lax.psum(jnp.mean(d * d), "context")  # BUG: cp_scalar_loss_overscaled
        return jax.lax.psum(jnp.sum(d * d), "context") / d.size / TP

    return smap(body, mesh_1d("context"), (P("context", None),) * 2, P())


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Family:
    spec: Callable
    impl: Callable  # bug name or None -> shard_map program
    shapes: tuple
    bugs: tuple


FAMILIES = {
    "megatron_mlp": Family(
        mlp_spec,
        mlp_impl,
        ((8, 16), (16, 16), (16, 8)),
        ("mlp_missing_psum", "mlp_extra_psum", "mlp_psum_wrong_axis"),
    ),
    "tp_attention": Family(
        attn_spec,
        attn_impl,
        ((8, 16),) + ((16, 16),) * 4,
        ("attn_heads_not_divided", "attn_wrong_scale", "attn_missing_psum"),
    ),
    "sequence_parallel_mlp": Family(
        mlp_spec,
        sp_impl,
        ((SEQ, DIM),) * 3,
        ("sp_all_gather_wrong_dim", "sp_psum_scatter_wrong_dim"),
    ),
    "sequence_norm": Family(
        seqnorm_spec,
        seqnorm_impl,
        ((SEQ, 8),),
        ("seqnorm_mean_not_reduced", "seqnorm_var_not_reduced"),
    ),
    "data_parallel_grad": Family(
        dp_spec,
        dp_impl,
        ((8, 8), (16, 8), (16, 8)),
        ("dp_grad_summed", "dp_grad_not_synced"),
    ),
    "fsdp_grad": Family(
        dp_spec,
        fsdp_impl,
        ((8, 8), (16, 8), (16, 8)),
        ("fsdp_gather_wrong_dim", "fsdp_grad_unscaled", "fsdp_grad_not_reduced"),
    ),
    "pipeline": Family(
        pipe_spec,
        pipe_impl,
        ((TP, 8, 8), (MICRO, 4, 8)),
        ("pipe_wrong_direction", "pipe_microbatches_swapped"),
    ),
    "expert_parallel": Family(
        ep_spec,
        ep_impl,
        ((TP * TP * CAP, 8), (TP, 8, 8)),
        ("ep_dispatch_wrong_dims", "ep_missing_combine"),
    ),
    "ring_allgather_matmul": Family(
        matmul_spec,
        ring_impl,
        ((16, 8), (8, 16)),
        ("ring_wrong_offset", "ring_wrong_direction"),
    ),
    "context_parallel_loss": Family(
        cp_spec,
        cp_impl,
        ((SEQ, 8), (SEQ, 8)),
        ("cp_loss_overscaled", "cp_loss_not_reduced"),
    ),
    "context_parallel_scalar_loss": Family(
        cp_scalar_spec, cp_scalar_impl, ((SEQ, 8), (SEQ, 8)), ("cp_scalar_loss_overscaled",)
    ),
}

BUGS = {bug: fam for fam in FAMILIES.values() for bug in fam.bugs}


def bug_line(name: str, kind: str = "BUG") -> int:
    """1-based line number of the `# BUG: <name>` (or `# SITE: <name>`) marker in this file."""
    pattern = f"# {kind}: {name}"
    hits = [
        i
        for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
        if re.search(re.escape(pattern) + r"(\s|$)", line)
    ]
    if len(hits) != 1:
        raise ValueError(f"expected one {pattern!r} marker, found {len(hits)}")
    return hits[0]


def args_for(fam: Family):
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype(np.float32) for s in fam.shapes]


def lower(f, *args) -> str:
    return jax.jit(f).lower(*args).as_text(debug_info=True)


def run(fam: Family, bug):
    args = args_for(fam)
    return tv_ir.check(lower(fam.spec, *args), lower(fam.impl(bug), *args))


# ------------------------------------------------------------------------------- tests

# Where tv's refutation legitimately names another op than the marked line: (op, site).
ELSEWHERE = {
    # the body lacks the collective, so no op inside it is wrong: tv names the shard_map,
    # which returns the body's partial result (a partial sum; a local mean or gradient, a
    # partial sum up to the shard count) as whole (Shardy refutations name the
    # `sdy.manual_computation`, docs/distributed.md)
    "mlp_missing_psum": ("sdy.manual_computation", None),
    "attn_missing_psum": ("sdy.manual_computation", None),
    "dp_grad_not_synced": ("sdy.manual_computation", None),
    "cp_loss_not_reduced": ("sdy.manual_computation", None),
    # without the combine the dispatched tokens never return to their group: tv names the
    # dispatch, whose result (tokens grouped by expert) no spec value holds
    "ep_missing_combine": ("stablehlo.all_to_all", "ep_dispatch"),
}

# In these schedules the values cannot tell which of two consistent choices is wrong: the
# ring's wrong offset and its wrong direction are the same result for 4 devices (each
# writes block me + k with the chunk of device me - k), and swapping the micro-batches that
# enter the pipeline is the same as swapping the output slots. tv names the last write of
# the assembled output, and the planted line is among the sites its inputs come from
# (`location.related`: the offset computation, the ppermute the chunk came through, the
# slice that picked the micro-batch).
MISLOCATED: dict[str, str] = {}
VIA_RELATED = {"ring_wrong_offset", "ring_wrong_direction", "pipe_microbatches_swapped"}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_correct_version_proved(family):
    report = run(FAMILIES[family], None)
    assert report.verdict == "equivalent", report.reason


@pytest.mark.parametrize("bug", list(BUGS))
def test_bug_refuted(bug):
    fam = BUGS[bug]
    report = run(fam, bug)
    assert report.verdict == "not_equivalent", report.reason
    cex = report.counterexample
    assert cex is not None
    # replay the counterexample with JAX: spec and implementation differ where tv says
    inputs = list(cex.inputs.values())
    expected = np.asarray(jax.jit(fam.spec)(*inputs))
    actual = np.asarray(jax.jit(fam.impl(bug))(*inputs))
    assert np.isclose(expected[cex.index], cex.expected, rtol=1e-4, atol=1e-5)
    assert np.isclose(actual[cex.index], cex.actual, rtol=1e-4, atol=1e-5)
    assert not np.isclose(cex.expected, cex.actual, rtol=1e-4, atol=1e-5)


LOCATED = [
    pytest.param(b, marks=pytest.mark.xfail(strict=True, reason=f"tv {MISLOCATED[b]}"))
    if b in MISLOCATED
    else b
    for b in BUGS
]


@pytest.mark.parametrize("bug", LOCATED)
def test_bug_located(bug):
    report = run(BUGS[bug], bug)
    site = report.location.impl
    assert site is not None
    if bug in ELSEWHERE:
        op, marker = ELSEWHERE[bug]
        assert site.op == op
        if marker is not None:
            assert site.line == bug_line(marker, "SITE")
        return
    assert site.file.endswith("test_bug_corpus.py")
    if bug in VIA_RELATED:
        assert bug_line(bug) in [r.line for r in report.location.related], str(report)
        return
    assert site.line == bug_line(bug), str(site)
