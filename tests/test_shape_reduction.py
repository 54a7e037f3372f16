"""Shape reduction (issue #10) against the real-size check, on JAX programs written as users
write them: `jax.jit`, `jax.shard_map` on a (2, 4) mesh ("data", "model"), jit with
NamedShardings, `jax.ShapeDtypeStruct` arguments.

Every pair is verified twice, at reduced shapes (the default) and at its real sizes
(`reduce_shapes=False`): the verdicts must agree, the pair must actually have been reduced
along the classes named, and a planted bug must be refuted both ways at the line marked
`# BUG`. Programs that some class must not be reduced along (a gather by token ids, an
offset read from the inputs, a window, a count of constants, a position compared with a
constant the factor does not divide) report that class kept, or not shrunk, with the same
verdict as at the real size. The reduction bugs found are strict xfails whose reasons say
what happens and what should (a false proof, a false refutation, or a crash). Last, the
`tv check` command (`--no-reduce`, `--json`).
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tv_ir.frontends.jax import verify

S = jax.ShapeDtypeStruct
F32 = jnp.float32
I32 = jnp.int32
B, T, D, F = 8, 16, 32, 64  # batch, sequence, model width, hidden width
H, DH = 8, 4  # heads, head width (H * DH == D)
TILE = T // 4  # a sequence shard over "model"


@functools.cache
def mesh() -> Mesh:
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))


def smap(body, in_specs, out_specs, check_vma=True):
    return jax.shard_map(
        body, mesh=mesh(), in_specs=in_specs, out_specs=out_specs, check_vma=check_vma
    )


class ReductionCrashed(Exception):
    """Verifying at reduced shapes raised (the real-size check did not)."""


class ReducedVerdictDiffers(Exception):
    """The verdict at reduced shapes is not the verdict at the real sizes."""


def both(fn, *args, spec=None, expect: str, **options):
    """The reports at reduced shapes and at the real sizes, after checking that the real
    verdict is `expect` and that the reduced one is the same (the two failures of shape
    reduction raise their own exceptions, for the strict xfails below)."""
    real = verify(fn, *args, spec=spec, reduce_shapes=False, **options)
    assert real.verdict == expect, str(real)
    try:
        reduced = verify(fn, *args, spec=spec, **options)
    except Exception as e:
        raise ReductionCrashed(f"{type(e).__name__}: {e}") from e
    if reduced.verdict != real.verdict:
        raise ReducedVerdictDiffers(
            f"reduced: {reduced.verdict}, real: {real.verdict}\n{reduced}\n-- real --\n{real}"
        )
    return reduced, real


def shrunk(report) -> dict[str, tuple[int, int]]:
    return {
        c["name"]: (c["real"], c["reduced"])
        for c in report.reduction["classes"]
        if c["reduced"] < c["real"]
    }


def kept(report) -> dict[str, str]:
    return {c["name"]: c["kept"] for c in report.reduction["classes"] if c["kept"]}


def bug_line(fn, marker: str = "# BUG") -> int:
    """The line of `fn`'s source marked `marker`."""
    lines, first = inspect.getsourcelines(fn)
    marked = [first + i for i, text in enumerate(lines) if marker in text]
    assert len(marked) == 1, f"{fn.__name__} has {len(marked)} lines marked {marker}"
    return marked[0]


# -- the op families ---------------------------------------------------------------------------
#
# Each family: a spec (plain JAX, one device), a correct implementation and one with a planted
# bug (its line marked `# BUG`), example arguments, and the classes (named by the spec
# argument dimension they start from) that must shrink.


# elementwise: a gated residual, every operand split over both mesh axes
def ew_spec(x, y):
    return jnp.tanh(x) * y + jnp.exp(-x)


def ew_ok(x, y):
    return smap(ew_spec, (P("data", "model"), P("data", "model")), P("data", "model"))(x, y)


def ew_bug(x, y):
    def body(x, y):
        return jnp.tanh(x) * y - jnp.exp(-x)  # BUG: sign of the second term

    return smap(body, (P("data", "model"), P("data", "model")), P("data", "model"))(x, y)


# broadcast: scale and bias along the width, the width split over "model"
def bc_spec(x, g, b):
    return x * g[None, :] + b[None, :]


def bc_ok(x, g, b):
    return smap(bc_spec, (P("data", "model"), P("model"), P("model")), P("data", "model"))(x, g, b)


def bc_bug(x, g, b):
    def body(x, g, b):
        return (x + b[None, :]) * g[None, :]  # BUG: the bias is scaled too

    return smap(body, (P("data", "model"), P("model"), P("model")), P("data", "model"))(x, g, b)


# reshape: split the width into heads, per-head squared norm, heads over "model"
def rs_spec(x, w):
    q = (x @ w).reshape(B, T, H, DH)
    return jnp.sum(q * q, axis=-1)


def rs_ok(x, w):
    def body(x, w):
        q = (x @ w).reshape(B, T, H // 4, DH)
        return jnp.sum(q * q, axis=-1)

    return smap(body, (P(), P(None, "model")), P(None, None, "model"))(x, w)


def rs_bug(x, w):
    def body(x, w):
        q = (x @ w).reshape(B, T, H // 4, DH)
        return jnp.sum(q * q * q, axis=-1)  # BUG: cubed

    return smap(body, (P(), P(None, "model")), P(None, None, "model"))(x, w)


# transpose: swap the two square dimensions of every batch element (each keeps two positions)
def tr_spec(x, y):
    return jnp.swapaxes(x, 1, 2) * y


def tr_ok(x, y):
    def body(x, y):
        return jnp.transpose(x, (0, 2, 1)) * y

    return smap(body, (P("data"), P("data")), P("data"))(x, y)


def tr_bug(x, y):
    def body(x, y):
        return x * y  # BUG: not transposed

    return smap(body, (P("data"), P("data")), P("data"))(x, y)


# dot_general: batch over "data", contraction over "model" (partial sums, psum)
def dot_spec(a, b):
    return jnp.einsum("bij,bjk->bik", a, b)


def dot_ok(a, b):
    def body(a, b):
        return jax.lax.psum(jnp.einsum("bij,bjk->bik", a, b), "model")

    return smap(body, (P("data", None, "model"), P("data", "model")), P("data"))(a, b)


def dot_bug(a, b):
    def body(a, b):
        part = jnp.einsum("bij,cjk->bik", a, b)  # BUG: sums over the batch of b too
        return jax.lax.psum(part, "model")

    return smap(body, (P("data", None, "model"), P("data", "model")), P("data"))(a, b)


# reduce: sum and max along the width (split over "model": psum, pmax)
def red_spec(x):
    return jnp.sum(x, axis=1), jnp.max(x, axis=1)


def red_ok(x):
    def body(x):
        return jax.lax.psum(jnp.sum(x, axis=1), "model"), jax.lax.pmax(jnp.max(x, axis=1), "model")

    return smap(body, P("data", "model"), (P("data"), P("data")))(x)


def red_bug(x):
    def body(x):
        total = jax.lax.psum(jnp.sum(x, axis=1), "model")
        top = jax.lax.psum(jnp.max(x, axis=1), "model")  # BUG: the local maxima summed
        return total, top

    return smap(body, P("data", "model"), (P("data"), P("data")))(x)


# mean: 1/N over the batch (split over "data")
def mean_spec(x):
    return jnp.mean(x, axis=0)


def mean_ok(x):
    def body(x):
        return jax.lax.psum(jnp.sum(x, axis=0), "data") / B

    return smap(body, P("data", "model"), P("model"))(x)


def mean_bug(x):
    def body(x):
        return jax.lax.psum(jnp.sum(x, axis=0), "data") / (B // 2)  # BUG: the local batch

    return smap(body, P("data", "model"), P("model"))(x)


# slice / concatenate / pad: rotate-half (RoPE's companion), written with pads on the impl
def rotate_half(x):
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return jnp.concatenate([-x2, x1], axis=-1)


def rot_ok(x):
    def body(x):
        x1, x2 = x[..., : D // 2], x[..., D // 2 :]
        return jnp.pad(-x2, ((0, 0), (0, D // 2))) + jnp.pad(x1, ((0, 0), (D // 2, 0)))

    return smap(body, P("data"), P("data"))(x)


def rot_bug(x):
    def body(x):
        x1, x2 = x[..., : D // 2], x[..., D // 2 :]
        return jnp.concatenate([x2, -x1], axis=-1)  # BUG: signs swapped

    return smap(body, P("data"), P("data"))(x)


# dynamic_slice with per-device offsets: each sequence shard adds its rows of a position table
def ds_spec(x, table):
    return x + table


def ds_ok(x, table):
    def body(x, table):
        start = jax.lax.axis_index("model") * TILE
        return x + jax.lax.dynamic_slice_in_dim(table, start, TILE, axis=0)

    return smap(body, (P("model"), P()), P("model"))(x, table)


def ds_bug(x, table):
    def body(x, table):
        start = jax.lax.axis_index("data") * TILE  # BUG: the other mesh axis
        return x + jax.lax.dynamic_slice_in_dim(table, start, TILE, axis=0)

    return smap(body, (P("model"), P()), P("model"), check_vma=False)(x, table)


# iota masks: causal scores, the mask from jnp.arange (spec) and broadcasted_iota (impl)
def mask_spec(q, k):
    s = jnp.einsum("bqd,bkd->bqk", q, k)
    row, col = jnp.arange(T)[:, None], jnp.arange(T)[None, :]
    return jnp.where(col <= row, s, 0.0)


def mask_ok(q, k):
    def body(q, k):
        s = jnp.einsum("bqd,bkd->bqk", q, k)
        row = jax.lax.broadcasted_iota(I32, (T, T), 0)
        col = jax.lax.broadcasted_iota(I32, (T, T), 1)
        return jnp.where(row >= col, s, 0.0)

    return smap(body, (P("data"), P("data")), P("data"))(q, k)


def mask_bug(q, k):
    def body(q, k):
        s = jnp.einsum("bqd,bkd->bqk", q, k)
        row = jax.lax.broadcasted_iota(I32, (T, T), 0)
        col = jax.lax.broadcasted_iota(I32, (T, T), 1)
        return jnp.where(row <= col, s, 0.0)  # BUG: anti-causal

    return smap(body, (P("data"), P("data")), P("data"))(q, k)


# RoPE: positions from iota, sequence parallel (each shard's positions start at its offset)
def inv_freq(theta: float) -> np.ndarray:
    return (1.0 / theta ** (np.arange(0, D, 2) / D)).astype(np.float32)


INV_FREQ = inv_freq(10000.0)


def rope(x, pos, theta: float = 10000.0):
    ang = pos.astype(F32)[:, None] * inv_freq(theta)[None, :]
    cos = jnp.concatenate([jnp.cos(ang)] * 2, axis=-1)
    sin = jnp.concatenate([jnp.sin(ang)] * 2, axis=-1)
    return x * cos + rotate_half(x) * sin  # BUG-SITE: wrong positions first meet x


def rope_spec(x):
    return rope(x, jnp.arange(T))


def rope_ok(x):
    def body(x):
        return rope(x, jax.lax.axis_index("model") * TILE + jnp.arange(TILE))

    return smap(body, P("model"), P("model"))(x)


def rope_bug(x):
    def body(x):
        return rope(x, jnp.arange(TILE))  # BUG: every shard starts at position 0

    return smap(body, P("model"), P("model"))(x)


# RoPE under data parallelism (positions from broadcasted_iota, no offsets), Llama 3's theta
def rope_dp_spec(x):
    return rope(x, jnp.arange(T), theta=500000.0)


def rope_dp_ok(x):
    def body(x):
        return rope(x, jax.lax.broadcasted_iota(I32, (T,), 0), theta=500000.0)

    return smap(body, P("data"), P("data"))(x)


def rope_dp_bug(x):
    def body(x):
        ang = jax.lax.broadcasted_iota(F32, (T, D // 2), 0) * inv_freq(500000.0)
        cos = jnp.concatenate([jnp.cos(ang)] * 2, axis=-1)
        sin = jnp.concatenate([jnp.sin(ang)] * 2, axis=-1)
        return x * sin + rotate_half(x) * cos  # BUG: cos and sin swapped

    return smap(body, P("data"), P("data"))(x)


def rope_dp_sign(x):
    def body(x):
        ang = jnp.arange(T).astype(F32)[:, None] * inv_freq(500000.0)
        cos = jnp.concatenate([jnp.cos(ang)] * 2, axis=-1)
        sin = jnp.concatenate([jnp.sin(ang)] * 2, axis=-1)
        return x * cos - rotate_half(x) * sin  # BUG: rotates the other way

    return smap(body, P("data"), P("data"))(x)


def rope_dp_theta(x):
    def body(x):
        return rope(x, jnp.arange(T), theta=10000.0)  # BUG: Llama 2's theta

    return smap(body, P("data"), P("data"))(x)


# collectives
def mlp_spec(x, w1, w2):
    return jnp.tanh(x @ w1) @ w2


MEGATRON = (P("data", None), P(None, "model"), P("model", None))


def psum_ok(x, w1, w2):
    def body(x, w1, w2):
        return jax.lax.psum(jnp.tanh(x @ w1) @ w2, "model")

    return smap(body, MEGATRON, P("data", None))(x, w1, w2)


def psum_bug(x, w1, w2):
    def body(x, w1, w2):
        return jnp.tanh(x @ w1) @ w2

    return jax.shard_map(  # BUG: the partial products are never summed
        body, mesh=mesh(), in_specs=MEGATRON, out_specs=P("data", None), check_vma=False
    )(x, w1, w2)


def fsdp_spec(x, w):
    return jnp.tanh(x @ w)


def gather_ok(x, w):
    def body(x, w):
        return jnp.tanh(x @ jax.lax.all_gather(w, "model", axis=1, tiled=True))

    return smap(body, (P("data"), P(None, "model")), P("data"), check_vma=False)(x, w)


def gather_bug(x, w):
    def body(x, w):
        stacked = jax.lax.all_gather(w, "model", axis=2)  # BUG: shards on a new last axis
        return jnp.tanh(x @ stacked.reshape(w.shape[0], -1))

    return smap(body, (P("data"), P(None, "model")), P("data"), check_vma=False)(x, w)


def sp_mlp_spec(x, w1, w2, b):
    return jnp.tanh(x @ w1) @ w2 + b


SP_IN = (P(), P(None, "model"), P("model", None), P())


def scatter_ok(x, w1, w2, b):
    def body(x, w1, w2, b):
        y = jnp.tanh(x @ w1) @ w2
        return jax.lax.psum_scatter(y, "model", scatter_dimension=0, tiled=True) + b

    return smap(body, SP_IN, P("model"))(x, w1, w2, b)


def scatter_bug(x, w1, w2, b):
    def body(x, w1, w2, b):
        y = jnp.tanh(x @ w1) @ w2 + b  # BUG: the bias is added on every shard, then summed
        return jax.lax.psum_scatter(y, "model", scatter_dimension=0, tiled=True)

    return smap(body, SP_IN, P("model"))(x, w1, w2, b)


def heads_center_spec(x):
    return x - jnp.mean(x, axis=0)  # x: (T, H, DH), centred over the sequence per head


def a2a_ok(x):
    def body(x):  # sequence shards -> head shards (Ulysses), centre, and back
        h = jax.lax.all_to_all(x, "model", split_axis=1, concat_axis=0, tiled=True)
        h = h - jnp.mean(h, axis=0)
        return jax.lax.all_to_all(h, "model", split_axis=0, concat_axis=1, tiled=True)

    return smap(body, P("model"), P("model"))(x)


def a2a_bug(x):
    def body(x):
        x = x - jnp.mean(x, axis=0)  # BUG: centred over the local shard, before all_to_all
        h = jax.lax.all_to_all(x, "model", split_axis=1, concat_axis=0, tiled=True)
        return jax.lax.all_to_all(h, "model", split_axis=0, concat_axis=1, tiled=True)

    return smap(body, P("model"), P("model"))(x)


def roll_spec(x):
    return jnp.roll(x, TILE, axis=0)


def ppermute_ok(x):
    def body(x):
        return jax.lax.ppermute(x, "model", [(i, (i + 1) % 4) for i in range(4)])

    return smap(body, P("model"), P("model"))(x)


def ppermute_bug(x):
    def body(x):
        return jax.lax.ppermute(x, "model", [(i, (i - 1) % 4) for i in range(4)])  # BUG

    return smap(body, P("model"), P("model"))(x)


# jit with NamedShardings: XLA partitions an MSE loss (batch over "data", hidden over "model")
def mse_spec(x, w1, w2, y):
    return jnp.mean((jnp.tanh(x @ w1) @ w2 - y) ** 2)


def mse_bug_fn(x, w1, w2, y):
    return jnp.sum((jnp.tanh(x @ w1) @ w2 - y) ** 2) / B  # BUG: a mean over the rows only


def jit_sharded(f):
    def s(*spec):
        return NamedSharding(mesh(), P(*spec))

    return jax.jit(
        f,
        in_shardings=(s("data", None), s(None, "model"), s("model", None), s("data", None)),
        out_shardings=s(),
    )


def jit_ok(x, w1, w2, y):
    return jit_sharded(mse_spec)(x, w1, w2, y)


def jit_bug(x, w1, w2, y):
    return jit_sharded(mse_bug_fn)(x, w1, w2, y)


jit_bug.marked = mse_bug_fn  # the line marked # BUG is in the function XLA partitions


def rs_order_bug(x, w):
    def body(x, w):
        q = (x @ w).reshape(B, T, DH, H // 4).swapaxes(2, 3)  # BUG: head-major order
        return jnp.sum(q * q, axis=-1)

    return smap(body, (P(), P(None, "model")), P(None, None, "model"))(x, w)


@dataclass
class Bug:
    fn: Callable
    name: str = "bug"
    site: tuple[Callable, str] | None = None  # where the refutation lands, if not at # BUG
    marks: list[Any] = field(default_factory=list)


@dataclass
class Family:
    name: str
    spec: Callable
    ok: Callable
    bugs: list[Bug]
    args: tuple
    shrinks: tuple[str, ...]  # spec argument dimensions whose classes must shrink
    bug_op: str | None = None  # the op the refutation names (when the shard_map itself)
    marks: list[Any] = field(default_factory=list)  # of the equivalent pair


def arg(k: int, *dims: int) -> tuple[str, ...]:
    return tuple(f"spec argument {k} dim {a}" for a in dims)


def f32(*shape: int) -> S:
    return S(shape, F32)


FAMILIES = [
    Family("elementwise", ew_spec, ew_ok, [Bug(ew_bug)], (f32(B, D), f32(B, D)), arg(0, 0, 1)),
    Family(
        "broadcast",
        bc_spec,
        bc_ok,
        [Bug(bc_bug)],
        (f32(B, D), f32(D), f32(D)),
        arg(0, 0, 1),
    ),
    Family(
        "reshape_heads",
        rs_spec,
        rs_ok,
        [Bug(rs_bug), Bug(rs_order_bug, "head_order")],
        (f32(B, T, D), f32(D, D)),
        arg(0, 0, 1) + arg(1, 1),
    ),
    Family("transpose", tr_spec, tr_ok, [Bug(tr_bug)], (f32(B, T, T), f32(B, T, T)), arg(0, 0, 1)),
    Family(
        "dot_general",
        dot_spec,
        dot_ok,
        [Bug(dot_bug)],
        (f32(B, 4, D), f32(B, D, 8)),
        arg(0, 0, 1, 2) + arg(1, 2),
    ),
    Family("reduce", red_spec, red_ok, [Bug(red_bug)], (f32(B, D),), arg(0, 0, 1)),
    Family("mean", mean_spec, mean_ok, [Bug(mean_bug)], (f32(B, D),), arg(0, 0, 1)),
    Family("rotate_half", rotate_half, rot_ok, [Bug(rot_bug)], (f32(B, D),), arg(0, 0, 1)),
    Family(
        "dynamic_slice_offsets",
        ds_spec,
        ds_ok,
        [Bug(ds_bug)],
        (f32(T, D), f32(T, D)),
        arg(0, 0, 1),
    ),
    Family(
        "causal_mask",
        mask_spec,
        mask_ok,
        [Bug(mask_bug)],
        (f32(2, T, 8), f32(2, T, 8)),
        arg(0, 1, 2),
    ),
    Family(
        "rope",
        rope_spec,
        rope_ok,
        [Bug(rope_bug, site=(rope, "# BUG-SITE"))],
        (f32(T, D),),
        arg(0, 0),
    ),
    Family(
        "rope_data_parallel",
        rope_dp_spec,
        rope_dp_ok,
        [
            Bug(rope_dp_bug),
            Bug(rope_dp_sign, "sign"),
            # the wrong frequencies first meet x in rope()
            Bug(rope_dp_theta, "theta", site=(rope, "# BUG-SITE")),
        ],
        (f32(B, T, D),),
        arg(0, 0, 1, 2),  # the frequency table (numpy) shrinks, standing for any values
    ),
    Family(
        "psum",
        mlp_spec,
        psum_ok,
        [Bug(psum_bug)],
        (f32(B, D), f32(D, F), f32(F, D)),
        arg(0, 0, 1) + arg(1, 1),
        bug_op="sdy.manual_computation",
    ),
    Family(
        "all_gather",
        fsdp_spec,
        gather_ok,
        [Bug(gather_bug)],
        (f32(B, D), f32(D, F)),
        arg(0, 0, 1),
    ),
    Family(
        "psum_scatter",
        sp_mlp_spec,
        scatter_ok,
        [Bug(scatter_bug)],
        (f32(T, D), f32(D, F), f32(F, D), f32(D)),
        arg(0, 0, 1) + arg(1, 1),
    ),
    Family(
        "all_to_all", heads_center_spec, a2a_ok, [Bug(a2a_bug)], (f32(T, H, DH),), arg(0, 0, 1, 2)
    ),
    Family(
        "ppermute",
        roll_spec,
        ppermute_ok,
        [Bug(ppermute_bug)],
        (f32(T, D),),
        arg(0, 0, 1),
        bug_op="sdy.manual_computation",
    ),
    Family(
        "jit_named_shardings",
        mse_spec,
        jit_ok,
        [Bug(jit_bug)],
        (f32(B, D), f32(D, F), f32(F, D), f32(B, D)),
        arg(0, 0, 1) + arg(1, 1),
    ),
]


@pytest.mark.parametrize("family", [pytest.param(f, id=f.name, marks=f.marks) for f in FAMILIES])
def test_family_equivalent(family: Family) -> None:
    reduced, _ = both(family.ok, *family.args, spec=family.spec, expect="equivalent")
    assert reduced.reduction["reduced"], reduced.reduction["summary"]
    missing = set(family.shrinks) - set(shrunk(reduced))
    assert not missing, reduced.reduction["summary"]


@pytest.mark.parametrize(
    ("family", "bug"),
    [pytest.param(f, b, id=f"{f.name}-{b.name}", marks=b.marks) for f in FAMILIES for b in f.bugs],
)
def test_family_bug_refuted(family: Family, bug: Bug) -> None:
    reduced, real = both(bug.fn, *family.args, spec=family.spec, expect="not_equivalent")
    assert reduced.reduction["reduced"], reduced.reduction["summary"]
    assert set(family.shrinks) & set(shrunk(reduced)), reduced.reduction["summary"]
    # the counterexample is of the user's program: replayed at the real sizes
    shapes = [np.shape(x) for x in reduced.counterexample.inputs.values()]
    assert shapes == [a.shape for a in family.args], str(reduced)
    line = bug_line(*(bug.site or (getattr(bug.fn, "marked", bug.fn),)))
    for report in (reduced, real):
        site = report.location.impl
        assert site.file == __file__, str(report)
        related = [s.line for s in report.location.related if s.file == __file__]
        assert line in [site.line, *related], str(report)
        if family.bug_op:
            assert site.op == family.bug_op, str(report)


# -- programs that must not be reduced along some class ------------------------------------
#
# Each keeps (or leaves unshrunk) the classes named, and gets the verdict of the real sizes.

V = 8  # vocabulary


def emb_spec(emb, tokens, w):
    return jnp.tanh(emb[tokens]) @ w


def emb_dp(emb, tokens, w):
    return smap(emb_spec, (P(), P("data"), P()), P("data"))(emb, tokens, w)


def dyn_spec(x, i):
    return jax.lax.dynamic_slice_in_dim(x, i, TILE, axis=0)


def dyn_impl(x, i):
    return smap(dyn_spec, (P(None, "model"), P()), P(None, "model"))(x, i)


def pool_spec(x):
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (2, 1), (2, 1), "VALID")


def pool_impl(x):
    return jnp.max(x.reshape(T // 2, 2, D), axis=1)


def conv_spec(x, k):
    return jnp.convolve(x, k, mode="valid")


def conv_impl(x, k):
    return k[2] * x[: T - 2] + k[1] * x[1 : T - 1] + k[0] * x[2:]


def sort_rows_spec(x):
    return jax.lax.sort(x, dimension=1)


def sort_rows_sharded(x):  # each device sorts its rows (XLA's partitioning of a batch dim)
    rows = NamedSharding(mesh(), P("data", None))
    return jax.jit(sort_rows_spec, in_shardings=rows, out_shardings=rows)(x)


def count_spec(x):
    return jnp.sum(x, axis=0) / jnp.sum(jnp.ones(T))  # a count of constants as normaliser


def count_impl(x):
    return jnp.mean(x, axis=0)


def last_spec(x):
    return jnp.where(jnp.arange(T)[:, None] == T - 1, x, 0.0)  # T - 1: no factor divides it


def last_impl(x):
    return jnp.pad(x[T - 1 :], ((T - 1, 0), (0, 0)))


@dataclass
class Kept:
    name: str
    fn: Callable
    spec: Callable
    args: tuple
    verdict: str
    kept: dict[str, str]  # class -> a word of the reason it was kept
    whole: tuple[str, ...] = ()  # classes left at their real size (no reason needed)
    shrinks: tuple[str, ...] = ()  # classes that still shrink


KEPT = [
    Kept(
        "embedding_gather",
        emb_dp,
        emb_spec,
        (f32(V, D), S((2, 4), I32), f32(D, F)),
        "equivalent",
        # the vocabulary is indexed by data; the width and the token positions shrink
        {"spec argument 0 dim 0": "gather"},
        shrinks=arg(2, 1) + arg(1, 1) + arg(0, 1),
    ),
    Kept(
        "dynamic_slice_input_offset",
        dyn_impl,
        dyn_spec,
        (f32(T, D), S((), I32)),
        "equivalent",  # decided by cases over the starts, at the real size
        {"spec argument 0 dim 0": "offsets positions by input values"},
        shrinks=arg(0, 1),
    ),
    Kept(
        "reduce_window",
        pool_impl,
        pool_spec,
        (f32(T, D),),
        "equivalent",
        # the pooled dimension keeps its size; the other, a window of one position, shrinks
        {"spec argument 0 dim 0": "reduce_window"},
        shrinks=arg(0, 1),
    ),
    Kept(
        "convolution",
        conv_impl,
        conv_spec,
        (f32(T), f32(3)),
        "equivalent",
        {"spec argument 0 dim 0": "convolution", "spec argument 1 dim 0": "convolution"},
    ),
    Kept(
        "sort_lanes",
        sort_rows_sharded,
        sort_rows_spec,
        (f32(B, T),),
        "equivalent",
        # the rows are independent, and the sorted dimension shrinks too: lax.sort's
        # comparator is a strict weak order (passes/shape_reduction/sorts.py; a comparator
        # that is not one keeps it: tests/test_sort_reduction.py)
        {},
        shrinks=arg(0, 0, 1),
    ),
    Kept(
        "count_of_constants",
        count_impl,
        count_spec,
        (f32(T, D),),
        "equivalent",
        # the count (a sum of ones: a splat, not listed) is the size of x's rows
        {"spec argument 0 dim 0": "may be its size"},
        shrinks=arg(0, 1),
    ),
    Kept(
        "iota_eq_last",
        last_impl,
        last_spec,
        (f32(T, D),),
        "equivalent",
        {},
        whole=arg(0, 0),
        shrinks=arg(0, 1),
    ),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in KEPT])
def test_not_reduced_along(case: Kept) -> None:
    reduced, _ = both(case.fn, *case.args, spec=case.spec, expect=case.verdict)
    classes = {c["name"]: c for c in reduced.reduction["classes"]}
    for name, why in case.kept.items():
        found = [c for n, c in classes.items() if n.startswith(name) and c["kept"]]
        assert found, f"no kept class {name}: {reduced.reduction}"
        assert all(c["reduced"] == c["real"] for c in found), reduced.reduction
        assert any(why in c["kept"] for c in found), reduced.reduction
    for name in case.whole:
        assert classes[name]["reduced"] == classes[name]["real"], reduced.reduction
    missing = set(case.shrinks) - set(shrunk(reduced))
    assert not missing, reduced.reduction["summary"]
    assert reduced.reduction["reduced"] == bool(case.shrinks)


# -- regressions: pairs where shape reduction once gave another verdict than the real sizes,
# or crashed (false proofs through merged dimensions, constant tables, positions as numbers
# or against data; false refutations through normalisers and offsets on data)

L = 32  # a longer sequence for the masks below


def padded_sum_spec(x):
    return jnp.sum(x[: L // 2], axis=0)


def padded_sum_mask(x):  # a sequence-length mask: the first L/2 positions are valid
    return jnp.sum(jnp.where(jnp.arange(L)[:, None] < L // 2, x, 0.0), axis=0)


def upto_8(x):
    return jnp.sum(jnp.where(jnp.arange(L) <= 8, x, 0.0))


def below_16(x):
    return jnp.sum(jnp.where(jnp.arange(L) < 16, x, 0.0))


def window_mask(s, w=8):  # sliding-window causal mask (the last w keys)
    row, col = jnp.arange(L)[:, None], jnp.arange(L)[None, :]
    return jnp.where((col <= row) & (col > row - w), s, 0.0)


def window_mask_impl(s, w=8):
    row = jax.lax.broadcasted_iota(I32, (L, L), 0)
    col = jax.lax.broadcasted_iota(I32, (L, L), 1)
    return jnp.where((row >= col) & (col + w > row), s, 0.0)


def heads_spec(x):
    return x.reshape(T, H, DH)


def heads_wrong_order(x):
    return x.reshape(T, DH, H).swapaxes(1, 2)


def one_hot_spec(t, w):
    return jax.nn.one_hot(t, V * 4) @ w


def one_hot_clamped(t, w):  # out-of-range ids land on the last row instead of nowhere
    return jax.nn.one_hot(jnp.minimum(t, V * 4 - 1), V * 4) @ w


def rope_cache(max_len: int):
    """A RoPE cos/sin cache as models precompute it (numpy), for positions 0..T-1 of a cache
    built for `max_len` positions (past it, positions wrap)."""
    ang = (np.arange(T) % max_len)[:, None] * INV_FREQ[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    return (
        np.concatenate([cos, cos], -1).astype(np.float32),
        np.concatenate([sin, sin], -1).astype(np.float32),
    )


def rope_table_spec(x):
    cos, sin = rope_cache(T)
    return x * cos + rotate_half(x) * sin


def rope_table_short(x):
    cos, sin = rope_cache(T // 2)  # a cache built for half the sequence
    return x * cos + rotate_half(x) * sin


LN = 16  # layer-norm width


def layernorm_spec(x):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(jnp.var(x, axis=-1, keepdims=True) + 1e-5)


def layernorm_tp(x):  # width over "model": E[x^2] - E[x]^2 from two psums
    def body(x):
        mean = jax.lax.psum(jnp.sum(x, axis=-1, keepdims=True), "model") / LN
        sq = jax.lax.psum(jnp.sum(x * x, axis=-1, keepdims=True), "model") / LN
        return (x - mean) / jnp.sqrt(sq - mean * mean + 1e-5)

    return smap(body, P("data", "model"), P("data", "model"))(x)


def valid_count_spec(length):
    return jnp.sum(jnp.arange(L) < length)


def valid_count_impl(length):
    return jnp.clip(length, 0, L)


def float_positions(x):
    return jnp.sum(jnp.where(jnp.arange(L).astype(F32) < 8.0, x, 0.0))


def vocab_pick_spec(logits, labels):  # the target logit of a cross-entropy
    return jnp.sum(jax.nn.one_hot(labels, V * 2) * logits, axis=-1)


def vocab_parallel_pick(logits, labels):  # Megatron's vocabulary-parallel cross-entropy
    def body(logits, labels):
        first = jax.lax.axis_index("model") * (V * 2 // 4)  # this shard's first vocabulary id
        local = jax.nn.one_hot(labels - first, V * 2 // 4)
        return jax.lax.psum(jnp.sum(local * logits, axis=-1), "model")

    return smap(body, (P("data", "model"), P("data")), P("data"))(logits, labels)


def argmax_spec(x):  # is the largest element in the second half?
    return jnp.argmax(x, axis=-1) >= T // 2


def argmax_halves(x):
    return jnp.max(x[:, T // 2 :], axis=-1) > jnp.max(x[:, : T // 2], axis=-1)


@pytest.mark.parametrize(
    ("fn", "spec", "args", "verdict"),
    [
        pytest.param(
            heads_wrong_order,
            heads_spec,
            (f32(T, H * DH),),
            "not_equivalent",
            id="reshape_parts_to_1",
        ),
        pytest.param(
            padded_sum_mask,
            padded_sum_spec,
            (f32(L, D),),
            "equivalent",
            id="length_mask_crash",
        ),
        pytest.param(
            window_mask_impl,
            window_mask,
            (f32(L, L),),
            "equivalent",
            id="sliding_window_mask_crash",
        ),
        pytest.param(
            upto_8,
            below_16,
            (f32(L),),
            "not_equivalent",
            id="compare_le_multiple",
        ),
        pytest.param(
            one_hot_clamped,
            one_hot_spec,
            (S((4,), I32), f32(V * 4, D)),
            "not_equivalent",
            id="one_hot_positions_vs_data",
        ),
        pytest.param(
            rope_table_short,
            rope_table_spec,
            (f32(T, D),),
            "not_equivalent",
            id="constant_table_truncated",
        ),
        pytest.param(
            layernorm_tp,
            layernorm_spec,
            (f32(4, LN),),
            "equivalent",
            id="variance_normaliser",
        ),
        pytest.param(
            valid_count_impl,
            valid_count_spec,
            (S((), I32),),
            "equivalent",
            id="count_positions_below_data",
        ),
        pytest.param(
            float_positions,
            lambda x: jnp.sum(x),
            (f32(L),),
            "not_equivalent",
            id="float_positions_compared",
        ),
        pytest.param(
            vocab_parallel_pick,
            vocab_pick_spec,
            (f32(2, V * 2), S((2,), I32)),
            "equivalent",
            id="vocab_parallel_offset_on_data",
        ),
        pytest.param(
            argmax_halves,
            argmax_spec,
            (f32(4, T),),
            "equivalent",
            id="argmax_index_as_value",
        ),
    ],
)
def test_reduced_verdict_is_real_verdict(fn, spec, args, verdict) -> None:
    both(fn, *args, spec=spec, expect=verdict)  # reduced (or kept), never another verdict


# -- constant tables, normalisers of nested sums ----------------------------------------
#
# A float table computed with numpy (RoPE frequencies) stands for any values at reduced
# shapes: its elements are symbols, the same in both programs. Where the proof needs the
# table's own values, tv checks again with the table kept.


def test_constant_table_shrinks_as_symbols() -> None:
    reduced, _ = both(rope_dp_ok, f32(B, T, D), spec=rope_dp_spec, expect="equivalent")
    assert reduced.reduction["tables"] >= 2, reduced.reduction["summary"]
    assert "spec argument 0 dim 2" in shrunk(reduced), reduced.reduction["summary"]
    assert "constant tables shrank" in reduced.reduction["summary"]


ALTERNATING = np.tile(np.array([1.0, 2.0], np.float32), D // 2)


def alternating_spec(x):
    return x * ALTERNATING  # a (D,) table


def alternating_tiled(x):
    return x * jnp.tile(jnp.array([1.0, 2.0], F32), D // 2)  # the same values from a (2,) one


def test_table_whose_values_matter_is_checked_again_kept() -> None:
    reduced, _ = both(alternating_tiled, f32(B, D), spec=alternating_spec, expect="equivalent")
    assert reduced.reduction["tables"] == 0, reduced.reduction["summary"]
    assert any("checked again with the tables kept" in n for n in reduced.notes), str(reduced)


WIDTH_FREQ = (1.0 / 10000.0 ** (np.arange(D) / D)).astype(np.float32)


def scaled_by_freq(x):
    return x * WIDTH_FREQ  # a (D,) table


def scaled_by_freq_row(x):
    return x * WIDTH_FREQ.reshape(1, D)  # the same elements as a (1, D) table


def scaled_by_freq_reversed(x):
    return x * WIDTH_FREQ[::-1].reshape(1, D)  # other elements: a bug


def test_a_reshaped_table_is_the_same_table() -> None:
    """XLA folds `reshape(constant)` into a constant of the new shape (torch_xla's Llama:
    RoPE frequencies [4] become [1, 4, 1] in the partitioned program): tables with the same
    elements in the same order are one table, their elements the same symbols, so the
    proof holds for any values and needs no second check with the tables kept. Other
    elements are another table, and the pair is refuted."""
    reduced, _ = both(scaled_by_freq_row, f32(B, D), spec=scaled_by_freq, expect="equivalent")
    assert reduced.reduction["tables"] >= 2, reduced.reduction["summary"]
    assert not any("checked again" in n for n in reduced.notes), str(reduced)
    both(scaled_by_freq_reversed, f32(B, D), spec=scaled_by_freq, expect="not_equivalent")


HEAD_FREQ = (1.0 / 10000.0 ** (np.arange(0, 64, 2) / 64)).astype(np.float32)  # head width 64


def rope_heads(q):  # (T, heads * 64): RoPE on every head, frequencies from numpy
    t = q.shape[0]
    q = q.reshape(t, -1, 64)
    ang = jnp.arange(t).astype(F32)[:, None, None] * HEAD_FREQ
    cos = jnp.concatenate([jnp.cos(ang)] * 2, axis=-1)
    sin = jnp.concatenate([jnp.sin(ang)] * 2, axis=-1)
    return (q * cos + rotate_half(q) * sin).reshape(t, -1)


def rope_heads_tp(q):  # heads split over "model": each device reshapes its own heads
    return smap(rope_heads, P(None, "model"), P(None, "model"))(q)


def test_heads_split_alike_in_both_programs() -> None:
    # the spec splits 16 heads x 64, a device 4 heads x 64: the head width shrinks alike in
    # both (else the reduced programs split heads differently and differ, tables or not)
    reduced, _ = both(rope_heads_tp, f32(T, 16 * 64), spec=rope_heads, expect="equivalent")
    assert reduced.reduction["tables"] >= 2, reduced.reduction["summary"]
    assert not any("checked again" in n for n in reduced.notes), str(reduced)


N_TOK, N_VOC = D, 16  # as many tokens as the model is wide: a count that is also a size


def xent_spec(x, w, targets):
    logp = jax.nn.log_softmax(x @ w, axis=-1)
    return -jnp.mean(jnp.sum(targets * logp, axis=-1))  # mean over tokens of a vocab sum


def xent_dp(x, w, targets):
    def body(x, w, targets):
        logp = jax.nn.log_softmax(x @ w, axis=-1)
        return -jax.lax.psum(jnp.sum(targets * logp), "data") / N_TOK

    return smap(body, (P("data"), P(), P("data")), P(), check_vma=False)(x, w, targets)


def test_mean_of_sums_is_a_normaliser_of_the_last_sum() -> None:
    args = (f32(N_TOK, D), f32(D, N_VOC), f32(N_TOK, N_VOC))
    reduced, _ = both(xent_dp, *args, spec=xent_spec, expect="equivalent")
    # N_TOK normalises the tokens only; the model width of the same size shrinks
    assert "spec argument 0 dim 1" in shrunk(reduced), reduced.reduction["summary"]


# -- the tv command ------------------------------------------------------------------------


def lower(f, *args) -> str:
    return jax.jit(f).lower(*args).as_text(debug_info=True)


@pytest.fixture(scope="module")
def mlir(tmp_path_factory):
    """The Megatron MLP as StableHLO files: spec, correct and buggy shard_maps."""
    path = tmp_path_factory.mktemp("mlir")
    args = (f32(B, D), f32(D, F), f32(F, D))
    for name, f in (("spec", mlp_spec), ("ok", psum_ok), ("bug", psum_bug)):
        (path / f"{name}.mlir").write_text(lower(f, *args))
    return path


def tv(capsys, *argv: str) -> tuple[int, str]:
    from tv_ir.cli import main

    code = main(list(argv))
    return code, capsys.readouterr().out


def test_cli_reduces_by_default_and_not_with_no_reduce(mlir, capsys) -> None:
    spec, ok = str(mlir / "spec.mlir"), str(mlir / "ok.mlir")
    code, out = tv(capsys, "check", spec, ok)
    assert code == 0 and out.startswith("EQUIVALENT"), out
    assert "shape reduction:" in out
    code, out = tv(capsys, "check", "--no-reduce", spec, ok)
    assert code == 0 and out.startswith("EQUIVALENT"), out
    assert "shape reduction" not in out


def test_cli_json_reduction(mlir, capsys) -> None:
    spec, ok, bug = (str(mlir / f"{n}.mlir") for n in ("spec", "ok", "bug"))
    code, out = tv(capsys, "check", "--json", spec, ok)
    report = json.loads(out)
    assert code == 0 and report["verdict"] == "equivalent"
    red = report["reduction"]
    assert red["reduced"] and red["reduced_elements"] < red["real_elements"]
    assert {"name", "real", "reduced", "kept"} <= set(red["classes"][0])
    assert set(arg(0, 0, 1) + arg(1, 1)) <= {
        c["name"] for c in red["classes"] if c["reduced"] < c["real"]
    }
    code, out = tv(capsys, "check", "--json", "--no-reduce", spec, ok)
    assert code == 0 and json.loads(out)["reduction"] is None
    # the bug, both ways: exit 1, at the shard_map of psum_bug
    line = bug_line(psum_bug)
    for flags in ((), ("--no-reduce",)):
        code, out = tv(capsys, "check", "--json", *flags, spec, bug)
        report = json.loads(out)
        assert code == 1 and report["verdict"] == "not_equivalent", out
        site = report["location"]["impl"]
        assert site["line"] == line and site["file"].endswith("test_shape_reduction.py")


@jax.jit
def _inner_tanh(x):  # a nested jit: a private function, inlined into main
    return jnp.tanh(x)


def big_spec(x):
    return jnp.sum(_inner_tanh(x), axis=0)


def big_dp(x):
    return smap(lambda x: jax.lax.psum(jnp.sum(_inner_tanh(x), axis=0), "data"), P("data"), P())(x)


def test_uncalled_private_function_past_2_31_is_not_refused() -> None:
    # 2^32 elements: only a function main no longer calls (after inlining) holds them whole
    report = verify(big_dp, f32(1 << 16, 1 << 16), spec=big_spec)
    assert report.verdict == "equivalent", str(report)


# -- a batch split over every device, each device's rows split again into micro-batches ------

MICRO, ROWS, WIDTH = 2, 96, 24  # 12 rows per device: 2 micro-batches of 6


def micro_spec(x, w):
    return jnp.mean(jnp.sum(jnp.tanh(x @ w) ** 2, axis=-1))


def micro_dp(x, w, bug=False):
    def body(x, w):
        xs = x.reshape(MICRO, -1, x.shape[-1])
        total = sum(jnp.mean(jnp.sum(jnp.tanh(xs[m] @ w) ** 2, axis=-1)) for m in range(MICRO))
        return jax.lax.psum(total, ("data", "model")) / (8 if bug else MICRO * 8)  # BUG

    return smap(body, (P(("data", "model")), P()), P(), check_vma=False)(x, w)


def test_micro_batches_of_a_tile_shrink_with_the_batch() -> None:
    # the batch's shard boundaries (multiples of the 12-row tile) are every device's row 0:
    # they put no offset inside the tile's (micro-batch, row) split, so the batch shrinks
    # (it was kept: "the merged dimensions it is a part of allow no factor")
    args = (f32(ROWS, D), f32(D, WIDTH))
    reduced, _ = both(micro_dp, *args, spec=micro_spec, expect="equivalent")
    assert "spec argument 0 dim 0" in shrunk(reduced), reduced.reduction["summary"]
    assert not kept(reduced), reduced.reduction["summary"]
    bug = functools.partial(micro_dp, bug=True)
    reduced, real = both(bug, *args, spec=micro_spec, expect="not_equivalent")
    assert "spec argument 0 dim 0" in shrunk(reduced), reduced.reduction["summary"]
    # the loss off by 2 (the micro-batch means not averaged) is blamed where it was scaled,
    # not on the batch's reshape into micro-batches (restructured data the spec never
    # computes, healed by the next slice)
    for report in (reduced, real):
        assert report.location.impl.line == bug_line(micro_dp), str(report)


def dp_mean_spec(x, w):
    return jnp.mean(jnp.tanh(x @ w) ** 2)


def dp_mean_pair(body, devices: int, rows: int, width: int):
    """A data-parallel mean over `devices` on an abstract mesh (as large as users' meshes):
    `body` on each device's rows and the whole (width, width) weight, and its arguments."""
    from jax.sharding import AbstractMesh

    impl = jax.shard_map(
        body,
        mesh=AbstractMesh((devices,), ("data",)),
        in_specs=(P("data"), P()),
        out_specs=P(),
        check_vma=False,
    )
    x = jax.ShapeDtypeStruct((devices * rows, width), jnp.float32)
    w = jax.ShapeDtypeStruct((width, width), jnp.float32)
    return impl, x, w


def test_an_unknown_with_nothing_reduced_says_why_each_class_kept_its_size() -> None:
    """A data-parallel mean whose count is computed in the program (`sum(y) /
    sum(ones_like(y))`): a count computed from the sizes may be any class's size, so every
    class keeps its size and the check runs at the real sizes into its time limit; the
    report says which count kept which class."""
    devices, rows, h = 8, 8, 4096

    def body(x, w):
        y = jnp.tanh(x @ w) ** 2
        return jax.lax.psum(jnp.sum(y) / jnp.sum(jnp.ones_like(y)), "data") / devices

    impl, x, w = dp_mean_pair(body, devices, rows, h)
    report = verify(impl, x, w, spec=dp_mean_spec, time_limit=10)
    assert report.verdict == "unknown", str(report)
    text = str(report)
    assert "shape reduction: no dimension class reduced" in text, text
    assert f"{h} kept (the count {h} computed at " in text and "may be its size" in text, text
