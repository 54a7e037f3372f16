"""docs/ops.md's table of the StableHLO spec's ops matches the op table
(regenerate with `python bench/op_census.py --spec`; the census itself is not run here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _census():
    # loaded by path: bench/ stays off sys.path
    spec = importlib.util.spec_from_file_location("op_census", ROOT / "bench" / "op_census.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_spec_table_in_docs_is_current() -> None:
    c = _census()
    doc = c.DOC.read_text()
    a, b = doc.index(c.SPEC_BEGIN) + len(c.SPEC_BEGIN), doc.index(c.SPEC_END)
    assert doc[a:b].strip() == c.spec_table().strip(), (
        "docs/ops.md's spec table is stale: run `python bench/op_census.py --spec`"
    )


def test_every_unsupported_spec_op_has_a_reason() -> None:
    c = _census()
    ops = c.registered()
    missing = [n for n in c.SPEC_OPS if f"stablehlo.{n}" not in ops and n not in c.UNSUPPORTED_WHY]
    assert not missing, f"unsupported spec ops without a reason in bench/op_census.py: {missing}"
    stale = [n for n in c.UNSUPPORTED_WHY if f"stablehlo.{n}" in ops]
    assert not stale, f"supported ops still listed as unsupported: {stale}"


def test_registered_stablehlo_ops_are_spec_ops() -> None:
    c = _census()
    extra = sorted(
        n for n in c.registered() if n.startswith("stablehlo.") and n[10:] not in c.SPEC_OPS
    )
    assert not extra, f"registered ops missing from the spec list: {extra}"
