"""The bug corpus (test_bug_corpus.py) planted at real sizes: hidden 4096, sequence 2048,
FFN 16384 (issue #10). The programs are the same functions, lowered from
`jax.ShapeDtypeStruct`s (nothing is materialised); tv proves them at reduced shapes. Every
correct version must still be proved, and every planted bug refuted at the line the toy
corpus names, with the same op.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import test_bug_corpus as corpus

import tv_ir

HIDDEN, SEQ, FFN = 4096, 2048, 16384
TP = corpus.TP

REAL_SHAPES = {
    "megatron_mlp": ((SEQ, HIDDEN), (HIDDEN, FFN), (FFN, HIDDEN)),
    "tp_attention": ((SEQ, HIDDEN),) + ((HIDDEN, HIDDEN),) * 4,
    "sequence_parallel_mlp": ((SEQ, HIDDEN), (HIDDEN, FFN), (FFN, HIDDEN)),
    "sequence_norm": ((SEQ, HIDDEN),),
    "data_parallel_grad": ((HIDDEN, HIDDEN), (SEQ, HIDDEN), (SEQ, HIDDEN)),
    "fsdp_grad": ((HIDDEN, HIDDEN), (SEQ, HIDDEN), (SEQ, HIDDEN)),
    "pipeline": ((TP, HIDDEN, HIDDEN), (corpus.MICRO, SEQ // corpus.MICRO, HIDDEN)),
    "expert_parallel": ((SEQ, HIDDEN), (TP, HIDDEN, HIDDEN)),
    "ring_allgather_matmul": ((SEQ, HIDDEN), (HIDDEN, FFN)),
    "context_parallel_loss": ((SEQ, HIDDEN), (SEQ, HIDDEN)),
    "context_parallel_scalar_loss": ((SEQ, HIDDEN), (SEQ, HIDDEN)),
}


def run(family: str, bug):
    fam = corpus.FAMILIES[family]
    args = [jax.ShapeDtypeStruct(s, np.float32) for s in REAL_SHAPES[family]]
    return tv_ir.check(corpus.lower(fam.spec, *args), corpus.lower(fam.impl(bug), *args))


def test_every_family_has_real_shapes():
    assert set(REAL_SHAPES) == set(corpus.FAMILIES)


@pytest.mark.parametrize("family", list(corpus.FAMILIES))
def test_correct_version_proved_at_real_size(family):
    report = run(family, None)
    assert report.verdict == "equivalent", report.reason
    assert report.reduction and report.reduction["reduced"], report.reduction


@pytest.mark.parametrize("bug", list(corpus.BUGS))
def test_bug_refuted_at_its_line_at_real_size(bug):
    family = next(name for name, fam in corpus.FAMILIES.items() if bug in fam.bugs)
    report = run(family, bug)
    assert report.verdict == "not_equivalent", report.reason
    assert report.counterexample is not None
    site = report.location.impl
    assert site is not None
    if bug in corpus.ELSEWHERE:
        op, marker = corpus.ELSEWHERE[bug]
        assert site.op == op, str(site)
        if marker is not None:
            assert site.line == corpus.bug_line(marker, "SITE")
        return
    assert site.file.endswith("test_bug_corpus.py"), str(site)
    if bug in corpus.VIA_RELATED:
        assert corpus.bug_line(bug) in [r.line for r in report.location.related], str(report)
        return
    assert site.line == corpus.bug_line(bug), str(site)


def test_refutation_that_does_not_carry_over_is_unknown(monkeypatch):
    """A refutation at reduced shapes that the real programs are too large to replay is
    replayed with each shrunk class a prime times larger: where the programs agree there, the
    verdict is unknown, not not_equivalent. Planted by undoing one shape rule (shard_map
    shard boundaries as offsets): heads split over devices then shrink past their shards,
    and the correct attention differs at the reduced shapes only."""
    from tv_ir.passes.shape_reduction.rules import ShapeRules

    monkeypatch.setattr(ShapeRules, "_shard_boundaries", lambda self, whole, local: None)
    report = run("tp_attention", None)
    assert report.verdict == "unknown", str(report)
    assert "agree on the same counterexample" in report.reason
