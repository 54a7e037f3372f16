"""`tv passes`: XLA's compilation validated pass by pass, from its dumps or from a module tv
compiles; the first pass that changes the meaning is named (planted and real miscompiles)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from tv_command import tv

from tv_ir import check
from tv_ir.xla.dumps import read_dump

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "xla_spmd" / "cases"


def layer(a, b):
    return jnp.tanh(a @ b).sum(axis=0)


@pytest.fixture(scope="module")
def annotated(tmp_path_factory) -> Path:
    """A jit-with-shardings module, as `jax.jit(...).lower(...).as_text()` gives it."""
    mesh = jax.make_mesh((2, 2), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    shardings = (NamedSharding(mesh, P("x", "y")), NamedSharding(mesh, P("y", None)))
    args = (jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 8), jnp.float32))
    text = jax.jit(layer, in_shardings=shardings).lower(*args).as_text(debug_info=True)
    path = tmp_path_factory.mktemp("module") / "layer.mlir"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def dumps(annotated: Path, tmp_path_factory) -> Path:
    """XLA's per-pass dumps of compiling `annotated` (kept by `tv passes --dump-to`)."""
    d = tmp_path_factory.mktemp("dumps") / "xla"
    r = tv("passes", str(annotated), "--dump-to", str(d))
    assert r.returncode == 0, r.stdout + r.stderr
    return d


def test_every_pass_of_a_jit_compilation_is_proved(annotated: Path, dumps: Path) -> None:
    r = tv("passes", str(dumps))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1].startswith("EQUIVALENT: all ")
    lines = r.stdout.splitlines()
    # the partitioner's output and the fusion pass were checked, not skipped
    assert any("per-device" in x and "spmd-partitioning" in x and "ok" in x for x in lines)
    assert any(x.startswith("ok") and " fusion (pipeline" in x for x in lines)
    snaps = read_dump(dumps)
    assert snaps[0].label.startswith("input") and snaps[-1].label.endswith("(final)")
    assert any(s.per_device for s in snaps) and not snaps[0].per_device


def _plant(dumps: Path, tmp_path: Path, from_pass: str) -> Path:
    """A copy of the dumps where every snapshot from the first one `from_pass` produced on
    computes exp instead of tanh: a miscompile in that pass."""
    bad = tmp_path / "bad"
    shutil.copytree(dumps, bad)
    snaps = read_dump(bad)
    first = next(i for i, s in enumerate(snaps) if s.pass_name == from_pass)
    for s in snaps[first:]:
        s.path.write_text(s.text().replace(" tanh(", " exponential("))
    assert " exponential(" in snaps[first].text()
    return bad


def test_a_planted_miscompile_names_its_pass(dumps: Path, tmp_path: Path) -> None:
    bad = _plant(dumps, tmp_path, "fusion")
    r = tv("passes", str(bad))
    assert r.returncode == 1, r.stdout + r.stderr
    verdict = next(x for x in r.stdout.splitlines() if x.startswith("NOT EQUIVALENT: "))
    assert "fusion (pipeline HLO_passes_after_layout_assignment) changes the meaning" in verdict
    assert "stablehlo.exponential" in r.stdout and "test_pass_validation.py" in r.stdout
    # it stops at the first refuted pass; --keep-going checks the rest
    fails = [x for x in r.stdout.splitlines() if x.startswith("FAIL")]
    assert len(fails) == 1
    r = tv("passes", str(bad), "--keep-going", "--json")
    out = json.loads(r.stdout)
    assert out["verdict"] == "not_equivalent" and "fusion" in out["first_refuted"]
    refuted = [s for s in out["steps"] if s["verdict"] == "not_equivalent"]
    assert len(refuted) > 1 and refuted[0]["report"]["counterexample"] is not None


def test_a_miscompile_in_the_global_passes_is_found_before_partitioning(
    dumps: Path, tmp_path: Path
) -> None:
    snaps = read_dump(dumps)
    planted = next(
        s for s in snaps[1:] if not s.per_device and s.pass_name not in ("", "pipeline-start")
    )
    bad = _plant(dumps, tmp_path, planted.pass_name)
    r = tv("passes", str(bad))
    assert r.returncode == 1
    verdict = next(x for x in r.stdout.splitlines() if x.startswith("NOT "))
    assert f"NOT EQUIVALENT: {planted.label} changes" in verdict
    assert " global " in next(x for x in r.stdout.splitlines() if x.startswith("FAIL"))


@pytest.mark.skipif(not CORPUS.is_dir(), reason="XLA SPMD corpus not present")
def test_xlas_own_partitioner_miscompile_is_named() -> None:
    """GSPMD miscompiles this module of its own test suite (docs/distributed.md)."""
    module = CORPUS / "Dot2DPartitionedNoncontractingAndContracting3.hlo"
    r = tv("passes", str(module), "--num-partitions", "4", "--no-propagation")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "NOT EQUIVALENT: XLA's SPMD partitioner" in r.stdout


def test_fusions_mean_their_bodies() -> None:
    plain = """HloModule m
ENTRY e {
  a = f32[4] parameter(0)
  b = f32[4] parameter(1)
  m = f32[4] multiply(a, b)
  ROOT t = f32[4] tanh(m)
}
"""
    fused = """HloModule m
fused (p0: f32[4], p1: f32[4]) -> f32[4] {
  p0 = f32[4] parameter(0)
  p1 = f32[4] parameter(1)
  m = f32[4] multiply(p0, p1)
  ROOT t = f32[4] tanh(m)
}
ENTRY e {
  a = f32[4] parameter(0)
  b = f32[4] parameter(1)
  ROOT f = f32[4] fusion(a, b), kind=kLoop, calls=fused
}
"""
    assert check(plain, fused).verdict == "equivalent"
    assert check(plain, fused.replace("tanh(m)", "exponential(m)")).verdict == "not_equivalent"


def test_bad_dump_directories_are_one_line_exit_3(tmp_path: Path, dumps: Path) -> None:
    r = tv("passes", str(tmp_path))
    assert r.returncode == 3 and "no XLA pass dumps" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    two = tmp_path / "two"
    shutil.copytree(dumps, two)
    for f in [f for f in two.iterdir() if f.is_file()]:
        shutil.copy(f, two / f.name.replace("module_0000", "module_0001", 1))
    r = tv("passes", str(two))
    assert r.returncode == 3 and "--module" in r.stderr
    r = tv("passes", str(two), "--module", "module_0001")
    assert r.returncode == 0, r.stdout + r.stderr
    r = tv("passes", str(dumps), "--num-partitions", "2")
    assert r.returncode == 3 and "for a module" in r.stderr
