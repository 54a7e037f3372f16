"""Locations are the user's: a refutation never names a file inside tv (tv_ir/, passes/,
frontends/), even for shard_map objects built in the user's module and handed to `verify`
(JAX records, for each op, the innermost frame it takes for user code, and tv's front end
calls `jax.jit(...).lower`); library shims (optax) are skipped when a caller is the user's.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from tv_ir.frontends.jax import verify

from tv_ir.ir.importer import convert_location
from tv_ir.ir.sources import TV_DIRS, is_library_file, is_tv_file

ROOT = Path(__file__).resolve().parents[1]
TV_PACKAGE_DIRS = [ROOT / "tv_ir", ROOT / "frontends", ROOT / "passes"]
MESH = Mesh(np.array(jax.devices()[:4]), ("model",))
F32 = jnp.float32
X = jax.ShapeDtypeStruct((8, 8), F32)
W1 = jax.ShapeDtypeStruct((8, 16), F32)
W2 = jax.ShapeDtypeStruct((16, 8), F32)


@pytest.fixture(autouse=True, scope="module")
def _shardy_shard_maps():
    """JAX's default shard_map form (sdy.manual_computation): importing torch_xla switches
    JAX to the GSPMD custom-call form for the rest of the process (its jax_workarounds),
    whose shard_map bodies are not yet named among the related sites."""
    before = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", True)
    yield
    jax.config.update("jax_use_shardy_partitioner", before)


def line_of(tag: str) -> int:
    hits = [
        i for i, ln in enumerate(Path(__file__).read_text().splitlines(), 1) if f"# {tag}" in ln
    ]
    assert len(hits) == 1, tag
    return hits[0]


# ----------------------------------------------- shard_maps built at module level, as users do


def mlp(x, w1, w2):
    return jnp.tanh(x @ w1) @ w2


def mlp_no_psum_body(x, w1, w2):
    return jnp.tanh(x @ w1) @ w2  # LOC: partial result


mlp_no_psum = jax.shard_map(  # LOC: the shard_map
    mlp_no_psum_body,
    mesh=MESH,
    in_specs=(P(), P(None, "model"), P("model", None)),
    out_specs=P(),
    check_vma=False,
)


def rows(x, w):
    return jnp.tanh(x @ w)


def rows_offset_body(x, w):
    i = jax.lax.axis_index("model")
    block = jax.lax.dynamic_slice_in_dim(x, ((i + 1) % 4) * 2, 2)  # LOC: wrong offset
    return jnp.tanh(block @ w)


rows_offset = jax.shard_map(
    rows_offset_body, mesh=MESH, in_specs=(P(), P()), out_specs=P("model", None), check_vma=False
)


def loss(w, x):
    # JAX records the innermost user frame: the gradient's ops are located on this line
    return jnp.sum(jnp.tanh(x @ w) ** 2)  # LOC: local gradient


def grad_spec(w, x):
    return jax.grad(loss)(w, x)


def grad_no_sync_body(w, x):
    return jax.grad(loss)(w, x)


grad_no_sync = jax.shard_map(
    grad_no_sync_body, mesh=MESH, in_specs=(P(), P("model")), out_specs=P(), check_vma=False
)


def a2a_spec(x):
    return jnp.tanh(x) * 2.0


def a2a_body(x):
    # to column blocks and back; the bug: the return trip is missing, and the column blocks
    # are read back as row blocks
    y = jax.lax.all_to_all(x, "model", 1, 0, tiled=True)  # LOC: a2a there
    return (jnp.tanh(y) * 2.0).reshape(2, 16)


a2a_no_return = jax.shard_map(
    a2a_body, mesh=MESH, in_specs=P("model", None), out_specs=P("model", None), check_vma=False
)

XS = jax.ShapeDtypeStruct((8, 16), F32)

SHARD_MAP_CASES = {
    "missing_psum": (mlp_no_psum, (X, W1, W2), mlp, "partial result"),
    "shard_offset": (rows_offset, (X, X), rows, "wrong offset"),
    "gradient_not_synced": (grad_no_sync, (X, X), grad_spec, "local gradient"),
    "missing_all_to_all": (a2a_no_return, (XS,), a2a_spec, "a2a there"),
}


def tv_files_named(report) -> list[str]:
    """Every file a report names (impl, spec, related sites) that lies inside tv."""
    loc = report.location
    if loc is None:
        return []
    sites = [loc.impl, loc.spec, *loc.related]
    out = []
    for s in sites:
        if s is None or not s.file:
            continue
        path = Path(s.file).resolve()
        if any(path.is_relative_to(d) for d in TV_PACKAGE_DIRS) or is_tv_file(s.file):
            out.append(f"{s.op} at {s.file}:{s.line}")
    return out


def sites_of(report) -> list[tuple[str, int]]:
    loc = report.location
    return [(s.file, s.line) for s in [loc.impl, *loc.related] if s is not None]


@pytest.mark.parametrize("case", list(SHARD_MAP_CASES))
def test_module_level_shard_map_refuted_at_user_lines(case):
    fn, args, spec, tag = SHARD_MAP_CASES[case]
    report = verify(fn, *args, spec=spec)
    assert report.verdict == "not_equivalent", report.reason
    assert not tv_files_named(report), str(report)
    assert report.location.impl.file == __file__, str(report)
    # the line at fault is the diverging op's or among the related sites
    assert (__file__, line_of(f"LOC: {tag}")) in sites_of(report), str(report)


def test_missing_psum_names_the_shard_map_and_its_body():
    report = verify(mlp_no_psum, X, W1, W2, spec=mlp)
    assert report.location.impl.op == "sdy.manual_computation"
    # the shard_map op is located where the user applies it (here: the verify call in this
    # test, since `mlp_no_psum` itself is the traced function), never in tv's lowering
    assert report.location.impl.file == __file__
    assert report.location.related[0].line == line_of("LOC: partial result")


# ------------------------------------------------------------- a representative suite


def _corpus_cases():
    sys.path.insert(0, str(Path(__file__).parent))
    corpus = importlib.import_module("test_bug_corpus")
    for bug, fam in corpus.BUGS.items():
        args = corpus.args_for(fam)
        yield bug, fam.impl(bug), args, fam.spec


def _example_cases():
    sys.path.insert(0, str(ROOT / "examples" / "jax"))
    llama = importlib.import_module("llama")
    for name, step in (("llama_dp", "dp_step"), ("llama_tp_sp", "tp_sp_step")):
        example = importlib.import_module(name)
        yield (
            name,
            getattr(example, step)(True),
            (llama.param_shapes(), llama.batch_shapes()),
            llama.train_step,
        )


def test_no_refutation_names_a_file_inside_tv():
    """Bug corpus (through `verify`), the JAX examples' planted bugs, and the shard_map cases
    above: every report's sites (impl, spec, related) are outside tv's packages."""
    t0 = time.perf_counter()
    cases = [(k, fn, args, spec) for k, (fn, args, spec, _) in SHARD_MAP_CASES.items()]
    cases += list(_corpus_cases()) + list(_example_cases())
    bad, refuted = {}, 0
    for name, fn, args, spec in cases:
        report = verify(fn, *args, spec=spec)
        refuted += report.verdict == "not_equivalent"
        named = tv_files_named(report)
        if named:
            bad[name] = named
        if report.verdict == "not_equivalent":
            assert report.location.impl is not None and report.location.impl.file, name
    assert not bad, bad
    assert refuted == len(cases)
    assert time.perf_counter() - t0 < 120


# ------------------------------------------------------------------- location conversion


def _callsite(frames: list[tuple[str, int, str]], name: str = "jit(step)/add"):
    """A JAX-style location: name stack over a callsite chain, innermost frame first."""
    from jaxlib.mlir import ir

    with ir.Context():
        locs = [ir.Location.name(fn, ir.Location.file(f, line, 1)) for f, line, fn in frames]
        loc = locs[-1]
        for inner in reversed(locs[:-1]):
            loc = ir.Location.callsite(inner, [loc])
        return convert_location(ir.Location.name(name, loc))


def test_library_shim_frames_skipped_for_a_deeper_user_frame():
    shim = "/x/lib/python3.11/site-packages/optax/_src/transform.py"
    assert is_library_file(shim) and not is_library_file("/home/me/train.py")
    loc = _callsite([(shim, 10, "update_fn"), ("/home/me/train.py", 42, "train_step")])
    assert (loc.file, loc.line, loc.function) == ("/home/me/train.py", 42, "train_step")


def test_tv_frames_never_named():
    tv_file = str(ROOT / "frontends" / "jax" / "lowering.py")
    assert is_tv_file(tv_file) and TV_DIRS
    loc = _callsite([(tv_file, 75, "lower"), ("/home/me/train.py", 7, "<module>")])
    assert (loc.file, loc.line) == ("/home/me/train.py", 7)
    only_tv = _callsite([(tv_file, 75, "lower")])
    assert only_tv.file is None and only_tv.name == "jit(step)/add"
    # no user frame at all: a library's line is better than none
    lib = _callsite([("/x/site-packages/optax/a.py", 3, "f"), (tv_file, 75, "lower")])
    assert (lib.file, lib.line) == ("/x/site-packages/optax/a.py", 3)


def test_jax_records_the_user_frame_through_tv():
    """Lowered through tv's front end, the ops of a module-level shard_map carry this file."""
    from tv_ir.frontends.jax.lowering import lower

    text = lower(mlp_no_psum, (X, W1, W2), role="fn").text
    assert "lowering.py" not in text
    assert Path(__file__).name in text


def test_optax_shim_skipped_for_the_users_line():
    """The ops of optax's AdamW update are recorded at optax's lines, with the user's call
    as a caller: the report names the user's line."""
    optax = pytest.importorskip("optax")

    def step(lr):
        def train_step(p, g):
            opt = optax.adamw(lr)
            updates, _ = opt.update(g, opt.init(p), p)  # LOC: optax update
            return optax.apply_updates(p, updates)

        return train_step

    v = jax.ShapeDtypeStruct((4,), F32)
    report = verify(step(2e-3), v, v, spec=step(1e-3))
    assert report.verdict == "not_equivalent", report.reason
    for site in (report.location.impl, report.location.spec):
        assert (site.file, site.line) == (__file__, line_of("LOC: optax update")), str(report)
