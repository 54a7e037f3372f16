"""An embedding lookup in a table whose vocabulary is split over devices (FSDP: HF GPT-2's
`--fsdp` under torch_xla, issue #13). Each device looks its shard up at `id - offset`,
zeroes the ids outside it and the pieces are summed over the devices. Every element of the
result is the same identity over other symbols (a row of the table picked by one token
id): a select over the whole vocabulary on the spec side, two over half of it on the
other. Decided as one solver query over the whole tile, it times out; decided one renaming
class at a time (`tv_ir/prover/obligation_cache.renaming_classes`), one element proves the
tile. Real sizes (`reduce_shapes=False`), so that the tile has many elements."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tv_ir.frontends.jax import verify

from tv_ir.pipeline import partition_and_check
from tv_ir.report.result import EQUIVALENT, NOT_EQUIVALENT

VOCAB, WIDTH, BATCH, SEQ = 36, 4, 2, 6
ARGS = (
    jax.ShapeDtypeStruct((VOCAB, WIDTH), jnp.float32),  # token embedding
    jax.ShapeDtypeStruct((SEQ, WIDTH), jnp.float32),  # position embedding
    jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32),  # token ids
)


def embed(table, pos, ids):
    return jnp.tanh(table[ids] + pos[None])


def mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    return Mesh(np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape), names)


def test_vocabulary_sharded_lookup_partitioned_by_xla_is_proved() -> None:
    m = mesh((2, 4), ("data", "model"))

    def on(*spec):
        return NamedSharding(m, P(*spec))

    jitted = jax.jit(embed, in_shardings=(on("data", None), on(), on("data", None)))
    text = jitted.lower(*ARGS).as_text(debug_info=True)
    report = partition_and_check(text, time_limit=600, reduce_shapes=False)
    assert report.verdict == EQUIVALENT, report


def sharded_lookup(offset_bug: int = 0):
    """The same by hand: each of 2 devices holds half of the vocabulary; `offset_bug`
    shifts where a device looks its ids up."""
    half = VOCAB // 2

    def body(table, pos, ids):
        ids = jnp.clip(ids, 0, VOCAB - 1)
        first = jax.lax.axis_index("data") * half
        local = ids - first + offset_bug  # BUG when offset_bug != 0
        mine = (ids >= first) & (ids < first + half)
        rows = jnp.where(mine[..., None], table[jnp.clip(local, 0, half - 1)], 0.0)
        return jnp.tanh(jax.lax.psum(rows, "data") + pos[None])

    return jax.shard_map(
        body,
        mesh=mesh((2,), ("data",)),
        in_specs=(P("data"), P(), P()),
        out_specs=P(),
        check_vma=False,
    )


def test_vocabulary_sharded_lookup_by_hand_is_proved() -> None:
    ok = verify(sharded_lookup(), *ARGS, spec=embed_clamped, reduce_shapes=False)
    assert ok.verdict == EQUIVALENT, ok


def test_vocabulary_sharded_lookup_at_the_wrong_offset_is_refuted() -> None:
    bad = verify(sharded_lookup(offset_bug=1), *ARGS, spec=embed_clamped, reduce_shapes=False)
    assert bad.verdict == NOT_EQUIVALENT, bad
    assert bad.counterexample is not None


def embed_clamped(table, pos, ids):
    """`embed` with the ids clamped into the vocabulary first, as the sharded lookups do
    (an id outside it matches no shard; the spec's gather would clamp it)."""
    return embed(table, pos, jnp.clip(ids, 0, VOCAB - 1))


# -- a tied embedding: the lookup's rows meet the table again in the logits ------------------

TIED = (
    jax.ShapeDtypeStruct((16, 8), jnp.float32),  # the table: vocabulary x width
    jax.ShapeDtypeStruct((2, 4), jnp.int32),  # token ids
)


def tied_logits(table, ids):
    """Flax's `nn.Embed`: `jnp.take` (mode "fill"), then `attend` with the same table."""
    return jnp.take(table, ids, axis=0) @ table.T


def tied_logits_shifted(table, ids):
    return jnp.take(table, ids, axis=0) @ jnp.roll(table, 1, axis=0).T  # BUG: rows shifted


def _vocab_sharded(fn):
    m = mesh((2, 2), ("data", "model"))
    return jax.jit(
        fn, in_shardings=(NamedSharding(m, P("model", None)), NamedSharding(m, P("data", None)))
    )


def test_a_tied_embedding_with_its_vocabulary_sharded_is_proved() -> None:
    """XLA sums each device's masked lookup in its half of the table over "model"; the
    logits multiply that sum by the same table. Looked up, the rows are selects among the
    table's elements; the spec's lookup is now a cut-point the summed pieces are proved
    equal to, and the logits meet its symbols. Before, the selects went into the logits'
    products and the solver gave up (unknown at any time limit tried, 30 to 60 s)."""
    report = verify(_vocab_sharded(tied_logits), *TIED, spec=tied_logits, time_limit=30)
    assert report.verdict == EQUIVALENT, report


def test_a_tied_embedding_against_a_shifted_table_is_refuted() -> None:
    report = verify(_vocab_sharded(tied_logits_shifted), *TIED, spec=tied_logits, time_limit=30)
    assert report.verdict == NOT_EQUIVALENT, report
    assert report.counterexample is not None
