"""Mesh reduction of FSDP x tensor parallelism in one shard_map (issue #12's data x fsdp x
tensor x pipeline meshes): weights stored split along their input dimension over "fsdp" and
all-gathered in the body, Megatron splits over "model", grouped-query attention.

An FSDP shard of a row-split weight (`wo`, `w_down`: P(("model", "fsdp"), None)) is a slice
of one "model" rank's heads or FFN units. All-gathered over "fsdp", it is multiplied with the
activations that rank computed from its column-split weights, so a rank's heads (and FFN
units) are "fsdp" devices parts: with fewer "fsdp" devices a rank holds fewer heads, as JAX
lowers it there. Both axes used to keep their sizes ("a dimension gathered two ways", "the
body's devices parts disagree with the shard_map's shardings")."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from tv_ir.passes.mesh_reduction import reduce_mesh

import tv_ir
from tv_ir.ir.program import walk
from tv_ir.pipeline import _boundary_placement, prepare

D, HD, F, B, S = 8, 2, 16, 8, 2  # hidden, head_dim, FFN units, batch, sequence
COLUMNS = ("wq", "wk", "wv", "w_up")  # input dimension over "fsdp", output over "model"
ROWS = ("wo", "w_down")  # input dimension over ("model", "fsdp")
# the ops compared with JAX's own lowering on the smaller mesh
KEPT_OPS = {"manual_computation", "all_gather", "all_reduce", "dot_general", "reshape", "reduce"}


def shapes(heads: int, kv: int, d: int, f: int) -> dict:
    return {
        "wq": (d, heads * HD),
        "wk": (d, kv * HD),
        "wv": (d, kv * HD),
        "wo": (heads * HD, d),
        "w_up": (d, f),
        "w_down": (f, d),
    }


def params(heads: int = 8, kv: int = 4, d: int = D, f: int = F) -> dict:
    rng = np.random.default_rng(0)
    return {
        k: rng.standard_normal(s).astype(np.float32) for k, s in shapes(heads, kv, d, f).items()
    }


X = np.random.default_rng(1).standard_normal((B, S, D)).astype(np.float32)


def block(x, p, group: int, psum=lambda y: y, bug: str | None = None):
    """Grouped-query attention (query head h reads K/V head h // group) and a tanh FFN, each
    added to the residual; `psum` sums a tensor-parallel rank's partial outputs."""
    b, s, _ = x.shape
    q = (x @ p["wq"]).reshape(b, s, -1, HD)
    k = (x @ p["wk"]).reshape(b, s, -1, HD)
    v = (x @ p["wv"]).reshape(b, s, -1, HD)
    if bug == "kv_group":  # BUG: query head h reads K/V head h % kv
        k, v = jnp.tile(k, (1, 1, group, 1)), jnp.tile(v, (1, 1, group, 1))
    else:
        k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    probs = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k), axis=-1)
    attn = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, -1) @ p["wo"]
    x = x + psum(attn)
    ffn = jnp.tanh(x @ p["w_up"]) @ p["w_down"]
    return x + (ffn if bug == "ffn_psum" else psum(ffn))  # BUG: ffn_psum: not summed


FFN_LINE = next(
    block.__code__.co_firstlineno + k
    for k, line in enumerate(inspect.getsource(block).splitlines())
    if line.strip().startswith("ffn = ")
)


def spec(p, x):
    return block(x, p, group=2)


def sharded(fsdp: int, model: int, bug: str | None = None):
    mesh = Mesh(np.array(jax.devices()[: fsdp * model]).reshape(fsdp, model), ("fsdp", "model"))

    def body(p, x):
        whole = {k: jax.lax.all_gather(w, "fsdp", axis=0, tiled=True) for k, w in p.items()}
        return block(x, whole, 2, lambda y: jax.lax.psum(y, "model"), bug)

    specs = {
        **{k: P("fsdp", "model") for k in COLUMNS},
        **{k: P(("model", "fsdp"), None) for k in ROWS},
    }
    return jax.shard_map(
        body, mesh=mesh, in_specs=(specs, P("fsdp")), out_specs=P("fsdp"), check_vma=False
    )


def lower(f, *args) -> str:
    return jax.jit(f).lower(*args).as_text(debug_info=True)


def axes_of(report) -> dict:
    return {a["name"]: (a["real"], a["reduced"]) for a in report.mesh_reduction["axes"]}


@pytest.mark.parametrize("fsdp, model", [(4, 2), (2, 4)])
def test_fsdp_and_tensor_parallel_attention_shrink_to_two_each(fsdp, model):
    """Each axis of 4 shrinks to 2 with the other at 2; the verdict is the whole mesh's."""
    s, i = lower(spec, params(), X), lower(sharded(fsdp, model), params(), X)
    reduced = tv_ir.check(s, i)
    whole = tv_ir.check(s, i, reduce_mesh=False)
    assert reduced.verdict == whole.verdict == "equivalent"
    assert axes_of(reduced) == {"fsdp": (fsdp, 2), "model": (model, 2)}
    assert reduced.mesh_reduction["devices"] == [8, 4]


@pytest.mark.parametrize("fsdp, model", [(4, 2), (2, 4)])
def test_a_missing_psum_is_refuted_on_the_reduced_mesh(fsdp, model):
    s, i = lower(spec, params(), X), lower(sharded(fsdp, model, "ffn_psum"), params(), X)
    report = tv_ir.check(s, i)
    assert report.verdict == "not_equivalent"
    assert report.mesh_reduction["devices"] == [8, 4]
    assert report.location.impl.line == FFN_LINE  # the rank's partial FFN output


def test_kv_heads_read_in_the_wrong_order_are_refuted():
    """Two K/V heads per "model" rank, read as `h % kv` (the mesh is then simulated whole:
    the spec and the tiled program shrink differently). With one K/V head per rank (model
    4) the bug changes nothing, and tv says so."""
    s = lower(spec, params(), X)
    assert tv_ir.check(s, lower(sharded(4, 2, "kv_group"), params(), X)).verdict == "not_equivalent"
    assert tv_ir.check(s, lower(sharded(2, 4, "kv_group"), params(), X)).verdict == "equivalent"


def test_the_reduced_fsdp_program_is_what_jax_lowers_on_the_smaller_mesh():
    """fsdp 4 x model 2, rewritten for fsdp 2: its collectives, products, reshapes and
    reductions have the types of JAX's own lowering for fsdp 2 x model 2 of the model with
    the dimensions "fsdp" splits halved: the batch,
    the hidden size (FSDP's split of the weights' input dimension), the heads and the FFN
    units (a "model" rank holds 4 heads and 8 units, gathered from 4 FSDP shards; 2 and 4
    from 2)."""
    big = prepare(lower(sharded(4, 2), params(), X), "impl")
    small_x = X[: B // 2, :, : D // 2]
    small = prepare(lower(sharded(2, 2), params(4, 2, D // 2, F // 2), small_x), "impl")
    s = prepare(lower(spec, params(), X), "spec")
    found = reduce_mesh(s, big, _boundary_placement(s, big, None))
    assert found.reduced_mesh.sizes == (2, 2)

    def types(m):  # splats the rewrite copies per shape aside (CSE shared them)
        return [m.main.arg_types] + [
            (op.name, [str(r.type) for r in op.results])
            for op in walk(m.main.body)
            if op.name.split(".")[-1] in KEPT_OPS
        ]

    assert types(found.impl) == types(small)


def test_with_one_kv_head_per_rank_fsdp_keeps_its_size_and_model_still_shrinks():
    """On fsdp 4 x model 4 a rank holds one K/V head: fewer "fsdp" devices would mean a
    smaller GQA group, which the spec's heads do not shrink to. "fsdp" keeps its size with
    the reason; "model", which splits the same dimension, still shrinks (before, both kept)."""
    s, i = lower(spec, params(), X), lower(sharded(4, 4), params(), X)
    report = tv_ir.check(s, i)
    assert report.verdict == "equivalent"
    assert axes_of(report) == {"fsdp": (4, 4), "model": (4, 2)}
    kept = {a["name"]: a["kept"] for a in report.mesh_reduction["axes"]}
    assert "would shrink by 4, but its major part (heads: K/V heads) by 2" in kept["fsdp"]
