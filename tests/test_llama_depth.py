"""bench/llama3.py's TrainVerify-shaped step with its layers as a scan, at toy sizes and 126
layers (63 per pipeline stage): a bug planted in one layer (`bug="one_layer"`: the scanned
layer carries its index, `jnp.where(hit, y + (y - x), y)`) is refuted with the layer counts
reduced (126 -> 6, 63 -> 3), replayed at the real layer count, and located at its line
(issue #12)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import llama3 as M  # noqa: E402
from tv_ir.frontends.jax import verify  # noqa: E402

# generous: the localisation gets a share of the time left, and CI machines are shared
LIMITS = dict(time_limit=1800, memory_limit=3500)


@pytest.mark.parametrize("layer", [100])
def test_a_bug_in_one_layer_of_126_is_refuted_at_its_line(layer):
    """Layer 100 of 126: stage 1's local layer 37, reduced layer 37 // 21 = 1 of 3."""
    cfg = M.with_(M.TOY, layers=126, stack="scan", bug_layer=layer)
    report = verify(
        M.parallel_step(cfg, "one_layer"), *M.example_args(cfg), spec=M.train_step(cfg), **LIMITS
    )
    assert report.verdict == "not_equivalent", report.reason
    notes = str(report.notes)
    assert "refuted with the layer loops at fewer layers" in notes, report.notes
    assert "126 -> 6" in notes and "63 -> 3" in notes, report.notes
    lines = (BENCH / "llama3.py").read_text().splitlines()
    bug_line = next(n for n, t in enumerate(lines, 1) if "# BUG: one_layer" in t)
    assert (Path(report.location.file).name, report.location.line) == (
        "llama3.py",
        bug_line,
    ), report.location
