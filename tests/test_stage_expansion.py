"""A stage obligation (an implementation value against a tile of a spec value) most often
closes once that spec value's one-op definition is put in for its symbols: the prover
tries that expansion first (`StageProver._closed_by_latest`), before perturbing every value
the residues name to find which to expand (`_culprits`). Same stages, same verdicts."""

from __future__ import annotations

import sys
from pathlib import Path

from tv_ir.frontends.jax import verify

from tv_ir.prover import engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import llama3 as M  # noqa: E402


def _run(monkeypatch, bug, first: bool):
    calls = {"culprits": 0}
    culprits = engine.StageProver._culprits

    def counted(self, work):
        calls["culprits"] += 1
        return culprits(self, work)

    monkeypatch.setattr(engine.StageProver, "_culprits", counted)
    if not first:
        monkeypatch.setattr(engine.StageProver, "_closed_by_latest", lambda *a: False)
    cfg = M.with_(M.TOY, layers=2)
    impl = M.parallel_step(cfg, bug)
    report = verify(impl, *M.example_args(cfg), spec=M.train_step(cfg))
    monkeypatch.undo()
    return report, calls["culprits"]


def test_stages_close_by_the_latest_value_first(monkeypatch) -> None:
    """bench/llama3.py's toy step (DP x PP x TP, forward and backward)."""
    report, culprits = _run(monkeypatch, None, first=True)
    before, culprits_before = _run(monkeypatch, None, first=False)
    assert report.verdict == before.verdict == "equivalent", (report.reason, before.reason)
    assert report.stats.stages == before.stats.stages
    assert culprits_before > 0 and culprits < culprits_before / 4, (culprits, culprits_before)
