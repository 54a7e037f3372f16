"""A pre-norm transformer block: rewrites are proved, seeded bugs refuted at their line.

The programs are in tests/programs/transformer.py; each bug's line carries a `# BUG:` marker.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import tv_ir  # noqa: E402
from tests.programs import transformer as T  # noqa: E402
from tv_ir.semantics.interpreters.interp import evaluate  # noqa: E402

TV = Path(sys.executable).with_name("tv")
GRAD = pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])


@functools.cache
def text(variant: str, grad: bool) -> str:
    return T.lower(variant, grad)


@functools.cache
def run_jax(variant: str, grad: bool, seed: int = 0) -> list[np.ndarray]:
    out = jax.jit(T.stacked(1, grad, variant))(*T.example_args(seed=seed))
    return [np.asarray(o, np.float64) for o in jax.tree.leaves(out)]


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


# --- the programs themselves (no prover needed) ---


@GRAD
@pytest.mark.parametrize("variant", T.VARIANTS)
def test_program_numbers(variant, grad):
    """Rewrites agree with the spec numerically, bugs do not; tv's interpreter agrees with XLA."""
    spec, impl = run_jax("spec", grad), run_jax(variant, grad)
    d = max_diff(spec, impl)
    if variant in T.BUGS:
        assert d > 1e-5, f"{variant} does not change the numbers (max diff {d})"
    else:
        assert d < 1e-4, f"{variant} differs from the spec by {d}"
    got = evaluate(tv_ir.load(text(variant, grad)), T.example_args())
    assert max_diff([np.asarray(g, np.float64) for g in got], impl) < 1e-4


@pytest.mark.parametrize("variant", T.BUGS)
def test_bug_markers(variant):
    line = Path(T.__file__).read_text().splitlines()[T.bug_line(variant) - 1]
    assert line.rstrip().endswith(f"# BUG: {variant}")


# --- the verifier ---


# A prover that blows up should fail its test, not take the shared machine down with it.
MEMORY_CAP = 2 << 30
CHILD = f"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_CAP}, {MEMORY_CAP}))
import tv_ir
print(tv_ir.check(sys.argv[1], sys.argv[2]).to_json())
"""


def check_in_child(spec: str, impl: str, tmp_path: Path) -> dict:
    """`tv_ir.check` in a subprocess capped at MEMORY_CAP bytes; the report as a dict."""
    (tmp_path / "spec.mlir").write_text(spec)
    (tmp_path / "impl.mlir").write_text(impl)
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "spec.mlir"), str(tmp_path / "impl.mlir")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, "tv_ir.check failed:\n" + "\n".join(r.stderr.splitlines()[-5:])
    return json.loads(r.stdout)


@GRAD
@pytest.mark.parametrize("variant", T.EQUIVALENT)
def test_equivalent(variant, grad, tmp_path):
    report = check_in_child(text("spec", grad), text(variant, grad), tmp_path)
    assert report["verdict"] == "equivalent", report.get("reason")


@GRAD
@pytest.mark.parametrize("variant", T.BUGS)
def test_bug(variant, grad):
    report = tv_ir.check(text("spec", grad), text(variant, grad))
    assert report.verdict == "not_equivalent", str(report)
    ce = report.counterexample
    assert ce is not None
    assert ce.expected != ce.actual
    # The counterexample replays: the two programs differ on its inputs, as reported.
    inputs = [np.asarray(v) for v in ce.inputs.values()]
    spec_out = evaluate(tv_ir.load(text("spec", grad)), inputs)[ce.output]
    impl_out = evaluate(tv_ir.load(text(variant, grad)), inputs)[ce.output]
    assert np.asarray(spec_out)[ce.index] != np.asarray(impl_out)[ce.index]
    # The first diverging op is on the marked line. JAX gives the ops that the backward pass
    # derives from a forward op (its JVP and transpose) the forward op's source location, and
    # the forward ops of a gradient program come first, so this holds for grad programs too.
    assert report.location.file.endswith("transformer.py"), str(report.location)
    assert report.location.line == T.bug_line(variant), str(report.location)


def _tv(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(TV), *args], capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_cli(tmp_path):
    spec, good, bad = (tmp_path / f"{n}.mlir" for n in ("spec", "good", "bad"))
    spec.write_text(text("spec", False))
    good.write_text(text("fused_qkv", False))
    bad.write_text(text("mask_off_by_one", False))

    r = _tv("check", str(spec), str(good), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["verdict"] == "equivalent"

    r = _tv("check", str(spec), str(bad), "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["verdict"] == "not_equivalent"
    assert out["location"]["impl"]["line"] == T.bug_line("mask_off_by_one")


def test_bundled_examples():
    """tv_ir/examples/*.mlir match tests/programs/make_examples.py (same ops, same lines)."""
    from tests.programs.make_examples import EXAMPLES

    def ops(source):
        return [(o.name, o.loc.line) for o in tv_ir.load(source).main.body.ops]

    for name, variant in EXAMPLES.items():
        assert ops(ROOT / "tv_ir" / "examples" / name) == ops(T.lower(variant)), (
            f"{name} is stale: run python tests/programs/make_examples.py"
        )
