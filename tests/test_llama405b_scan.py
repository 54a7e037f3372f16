"""bench/llama405b.py's step with its layers as a scan (`stack="scan"`), at toy sizes: the
layer count goes through the layer-stack reduction (docs/equivalence.md, "Layer stacks"),
and a bug in one layer of the stack is refuted at its line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import llama405b as M  # noqa: E402
from tv_ir.frontends.jax import verify  # noqa: E402

# generous: the localisation gets a share of the time left, and CI machines are shared
LIMITS = dict(time_limit=1800, memory_limit=3500)
# 8 devices (data 1 x fsdp 2 x stage 2 x model 2), 8 layers: 4 per stage, reduced to 2
TINY = M.Config(
    batch=4, seq=4, hidden=8, heads=4, kv_heads=2, ffn=8, layers=8, vocab=4, dp=1,
    optimizer="sgd", stack="scan",
)  # fmt: skip


def run(cfg: M.Config, bug: str | None = None):
    return verify(M.parallel_step(cfg, bug), *M.example_args(cfg), spec=M.train_step(cfg), **LIMITS)


def test_scanned_step_is_proved_at_fewer_layers():
    report = run(M.with_(TINY))
    assert report.verdict == "equivalent", report.reason
    assert "layer loops proved at fewer layers" in str(report.notes), report.notes
    trips = {(d["real"], d["reduced"]) for d in report.reduction["layer_loops"]}
    assert trips == {(8, 4), (4, 2)}  # the spec's loops and each stage's


@pytest.mark.parametrize("layer", [5])
def test_a_bug_in_one_layer_is_refuted_at_its_line(layer):
    """Layer 5 of 8 (stage 1's local layer 1) adds its update twice."""
    report = run(M.with_(TINY, bug_layer=layer), "one_layer")
    assert report.verdict == "not_equivalent", report.reason
    assert "refuted with the layer loops at fewer layers" in str(report.notes), report.notes
    lines = (BENCH / "llama405b.py").read_text().splitlines()
    bug_line = next(n for n, t in enumerate(lines, 1) if "# BUG: one_layer" in t)
    assert (Path(report.location.file).name, report.location.line) == (
        "llama405b.py",
        bug_line,
    ), report.location
