"""Stage proofs reused for obligations equal up to a renaming of symbols (repeated layers)."""

from __future__ import annotations

import inspect
import json

import jax
import jax.numpy as jnp
import numpy as np

import tv_ir
from tv_ir.pipeline import prepare
from tv_ir.prover.engine import Options, StageProver
from tv_ir.prover.obligation_cache import ObligationCache
from tv_ir.semantics import terms as T

DEPTH, SEQ, D = 4, 3, 4


def norm_layer(x, w, g, bug=False):
    """Spec layer: LayerNorm with the variance as the mean of squared deviations."""
    m = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - m) * (x - m), axis=-1, keepdims=True)
    if bug:
        return x - jnp.tanh(((x - m) * jax.lax.rsqrt(var + 1e-5) * g) @ w)  # BUG: sign
    return x + jnp.tanh(((x - m) * jax.lax.rsqrt(var + 1e-5) * g) @ w)


def moments_layer(x, w, g):
    """The same layer with the variance as E[x^2] - m^2 (proved by expanding cut-points)."""
    m = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(x * x, axis=-1, keepdims=True) - m * m
    return x + jnp.tanh(((x - m) * jax.lax.rsqrt(var + 1e-5) * g) @ w)


def spec(x, *params):
    for i in range(DEPTH):
        x = norm_layer(x, params[2 * i], params[2 * i + 1])
    return x


def impl(x, *params):
    for i in range(DEPTH):
        x = moments_layer(x, params[2 * i], params[2 * i + 1])
    return x


def impl_bug_in_last_layer(x, *params):
    for i in range(DEPTH):
        x = norm_layer(x, params[2 * i], params[2 * i + 1], bug=i == DEPTH - 1)
    return x


def lowered(fn) -> str:
    args = [jax.ShapeDtypeStruct((SEQ, D), jnp.float32)]
    args += [jax.ShapeDtypeStruct(s, jnp.float32) for _ in range(DEPTH) for s in ((D, D), (D,))]
    return jax.jit(fn).lower(*args).as_text(debug_info=True)


def bug_line() -> int:
    lines, start = inspect.getsourcelines(norm_layer)
    return start + next(i for i, line in enumerate(lines) if "# BUG: sign" in line)


def test_repeated_layers_reuse_stage_proofs(monkeypatch):
    # identical layers are rolled into a loop and proved once by induction first
    # (passes/reroll.py); the cache serves the stages induction does not cover: off here
    monkeypatch.setattr("tv_ir.passes.reroll.run", lambda module, *args, **kwargs: module)
    report = tv_ir.check(lowered(spec), lowered(impl))
    assert report.verdict == "equivalent"
    assert report.stats.cache_hits > 0
    assert json.loads(report.to_json())["stats"]["cache_hits"] == report.stats.cache_hits
    assert "by reusing the proof of an identical stage" in str(report)


def test_bug_in_the_last_of_identical_layers_is_refuted_at_its_line():
    report = tv_ir.check(lowered(spec), lowered(impl_bug_in_last_layer))
    assert report.verdict == "not_equivalent"
    assert report.location.line == bug_line()


def test_verdicts_agree_with_and_without_the_cache():
    s = prepare(lowered(spec), "spec")
    for fn in (impl, impl_bug_in_last_layer):
        reports = [
            StageProver(s, prepare(lowered(fn), "impl"), Options(reuse_proofs=reuse)).run()
            for reuse in (True, False)
        ]
        with_cache, without = reports
        assert with_cache.verdict == without.verdict
        assert with_cache.stats.stages == without.stats.stages
        assert without.stats.cache_hits == 0
    assert reports[0].verdict == "not_equivalent"


# -- the key: canonical forms up to a bijective renaming ---------------------------------


def cut(number: int, index: int = 0, dtype: str = "f32") -> T.Poly:
    return T.symbol(T.Key("cut", number, dtype, f"c{number}"), (index,))


def residue(x: T.Poly, y: T.Poly) -> T.Poly:
    return T.sub(T.fn("exp", x), T.fn("tanh", y))


def no_definitions(_atom_id: int):
    return None


def proved(cache: ObligationCache, work: list, definition=no_definitions, expanded=()) -> None:
    probe = cache.probe(work, definition)
    assert probe.hit() is None
    probe.record([set(level) for level in expanded], "normal_form")


def hit(cache: ObligationCache, work: list, definition=no_definitions) -> bool:
    return cache.probe(work, definition).hit() is not None


def test_a_renamed_obligation_is_a_hit():
    cache = ObligationCache()
    proved(cache, [residue(cut(1), cut(2))])
    assert hit(cache, [residue(cut(7), cut(8))])
    assert hit(cache, [residue(cut(8), cut(7))])  # any bijection
    assert cache.hits == 2


def test_a_renaming_must_be_a_bijection():
    cache = ObligationCache()
    proved(cache, [residue(cut(1), cut(2))])
    assert not hit(cache, [residue(cut(7), cut(7))])  # two symbols cannot become one
    cache = ObligationCache()
    proved(cache, [residue(cut(1), cut(1))])
    assert not hit(cache, [residue(cut(7), cut(8))])  # nor one two


def test_the_renaming_is_one_over_every_residue():
    cache = ObligationCache()
    proved(cache, [residue(cut(1), cut(2)), residue(cut(2), cut(1))])
    assert hit(cache, [residue(cut(5), cut(6)), residue(cut(6), cut(5))])
    assert not hit(cache, [residue(cut(5), cut(6)), residue(cut(6), cut(7))])


def test_element_types_signs_and_definedness_are_part_of_the_key():
    cache = ObligationCache()
    proved(cache, [residue(cut(1), cut(2))])
    assert not hit(cache, [residue(cut(7, dtype="i32"), cut(8))])
    positive = cut(9)
    T.note_sign(positive, 2)
    assert not hit(cache, [residue(positive, cut(8))])
    guarded = T.with_dom(residue(cut(7), cut(8)), T.compare("GT", cut(7), T.ZERO))
    assert not hit(cache, [guarded])
    inputs = T.symbol(T.Key("input", 0, "f32", "x"), (0,))
    assert not hit(cache, [residue(inputs, cut(8))])


def test_a_proof_that_expanded_a_cut_point_needs_the_same_definition():
    def definitions(table: dict):
        by_atom = {T.as_atom(k).id: v for k, v in table.items()}
        return lambda atom_id: by_atom.get(atom_id)

    a, b = cut(1), cut(2)
    cache = ObligationCache()
    proved(
        cache,
        [residue(a, b)],
        definitions({a: T.mul(cut(3), cut(4))}),
        expanded=[{T.as_atom(a).id}],
    )
    x, y = cut(11), cut(12)
    assert hit(cache, [residue(x, y)], definitions({x: T.mul(cut(13), cut(14))}))
    assert not hit(cache, [residue(x, y)], definitions({x: T.add(cut(13), cut(14))}))
    assert not hit(cache, [residue(x, y)], definitions({x: T.mul(cut(13), cut(13))}))
    assert not hit(cache, [residue(x, y)], definitions({x: T.mul(cut(12), cut(14))}))
    assert not hit(cache, [residue(x, y)])  # no definition: not a cut-point


def test_numbers_are_compared_by_value():
    cache = ObligationCache()
    proved(cache, [T.sub(T.fn("exp", cut(1)), T.const(2))])
    assert not hit(cache, [T.sub(T.fn("exp", cut(5)), T.const(3))])
    assert hit(cache, [T.sub(T.fn("exp", cut(5)), T.const(np.float64(2.0)))])


def _spelled_out(form, cap: int) -> int:
    """Nodes of a canonical form written out as a tree (counting stops past `cap`)."""
    count, stack = 0, [form]
    while stack and count <= cap:
        x = stack.pop()
        count += 1
        if isinstance(x, tuple):
            stack.extend(x)
    return count


def test_shared_subterms_keep_canonical_forms_linear():
    """A term is a DAG: `select(x > 0, x, -x)` nested 60 deep names each level twice, so its
    tree has 2**60 leaves. Canonical forms refer to shared atoms by number: their size (and
    the time to hash one, which ran for minutes on a Llama attention stage) stays linear in
    the DAG, and renamings still fall into one class."""
    from tv_ir.prover.obligation_cache import CanonicalForm, renaming_classes

    def folded(x: T.Poly, depth: int = 60) -> T.Poly:
        for _ in range(depth):
            x = T.select(T.compare("GT", x, T.ZERO), x, T.neg(x))
        return x

    a, b, c = folded(cut(1)), folded(cut(2)), folded(T.add(cut(1), T.ONE))
    canon = CanonicalForm()
    key = (canon.of(a), tuple(canon.nodes))
    assert _spelled_out(key, 100_000) < 100_000
    assert renaming_classes([a, b, c]) == [[0, 1], [2]]


# -- devices holding the same terms: one proof ---------------------------------------------


def _stage_per_layer():
    """Each of 2 'stage' devices applies its own layer to the whole input, replicated over
    2 'model' devices: no spec value has its tiles on every device (per-device cuts), and
    the two 'model' copies on a stage are the same terms."""
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("stage", "model"))

    def body(x, w):
        return jnp.tanh(x @ w[0])[None]

    impl = jax.shard_map(
        body, mesh=mesh, in_specs=(P(), P("stage")), out_specs=P("stage"), check_vma=False
    )

    def spec(x, w):
        return jnp.stack([jnp.tanh(x @ w[0]), jnp.tanh(x @ w[1])])

    args = (jax.ShapeDtypeStruct((3, 4), jnp.float32), jax.ShapeDtypeStruct((2, 4, 4), jnp.float32))
    return lower_args(spec, args), lower_args(impl, args)


def lower_args(fn, args) -> str:
    return jax.jit(fn).lower(*args).as_text(debug_info=True)


def test_devices_holding_the_same_terms_are_proved_once(monkeypatch):
    from tv_ir.prover import engine

    # the stages' dot and tanh would be mirrored (tv_ir/prover/mirrored_ops.py), never cut
    # device by device: off here, as this tests the per-device cuts
    monkeypatch.setattr(engine, "mirrored_cut", lambda *args: None)
    spec_text, impl_text = _stage_per_layer()
    once = tv_ir.check(spec_text, impl_text)
    monkeypatch.setattr(engine, "_same_terms", lambda a, b: False)
    each = tv_ir.check(spec_text, impl_text)
    assert once.verdict == each.verdict == "equivalent"
    assert once.stats.stages == each.stats.stages
    assert once.stats.cache_hits > each.stats.cache_hits


def test_a_device_holding_the_spec_definition_is_cut_without_a_proof_search(monkeypatch):
    # each stage's `x @ w[s]` and `tanh` are the spec's own one-op definitions at that
    # stage's tile (the same op on the same cut operands): identical terms, no expansion
    # (mirroring, which would cut them before evaluating them, off: tested on its own)
    from tv_ir.prover import engine

    monkeypatch.setattr(engine, "mirrored_cut", lambda *args: None)

    spec_text, impl_text = _stage_per_layer()
    searched = []
    original = engine.StageProver._prove_pairs

    def counted(self, pairs, levels, final):
        if not final:
            searched.append(len(pairs))
        return original(self, pairs, levels, final)

    monkeypatch.setattr(engine.StageProver, "_prove_pairs", counted)
    direct = tv_ir.check(spec_text, impl_text)
    direct_searches = len(searched)
    searched.clear()
    monkeypatch.setattr(engine.StageProver, "_is_definition", lambda self, t, v, b: False)
    searching = tv_ir.check(spec_text, impl_text)
    assert direct.verdict == searching.verdict == "equivalent"
    assert direct.stats.stages == searching.stats.stages
    assert direct_searches < len(searched), (direct_searches, len(searched))
