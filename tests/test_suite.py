"""Regression suites: `tv check SUITE` over a directory or manifest, workers, the result cache,
JUnit XML and JSON Lines, and the pytest plugin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from xml.etree import ElementTree

import pytest
from tv_command import tv

from tv_ir import suite

TWICE = """func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""
SCALED = """func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %c = stablehlo.constant dense<2.0> : tensor<4xf32>
  %0 = stablehlo.multiply %c, %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""
THRICE = SCALED.replace("dense<2.0>", "dense<3.0>")
# a per-device program on 2 devices: its layouts come from the manifest
PER_DEVICE = SCALED.replace("4xf32", "2xf32")
SHARDED = ["{devices=[2]0,1}"]


@pytest.fixture
def pairs(tmp_path: Path) -> Path:
    """A suite directory: one equivalent pair, one with a planted bug in a subdirectory."""
    d = tmp_path / "suite"
    (d / "bugs").mkdir(parents=True)
    (d / "scale.spec.mlir").write_text(TWICE)
    (d / "scale.impl.mlir").write_text(SCALED)
    (d / "bugs" / "thrice.spec.mlir").write_text(TWICE)
    (d / "bugs" / "thrice.impl.mlir").write_text(THRICE)
    return d


def test_directory_suite_lines_summary_and_exit_code(pairs: Path, tmp_path: Path) -> None:
    r = tv("check", str(pairs), "--cache", str(tmp_path / "cache"), "--workers", "1")
    assert r.returncode == 1, r.stderr  # a refutation fails the suite
    lines = r.stdout.splitlines()
    assert any(line.startswith("ok   equivalent") and line.endswith(" scale") for line in lines)
    bug = next(line for line in lines if "bugs/thrice" in line)
    assert bug.startswith("FAIL not_equivalent") and "stablehlo.multiply" in bug
    assert "2 pairs, 1 as expected, 0 from the cache" in r.stdout


def test_rerun_comes_from_the_cache_until_a_file_changes(pairs: Path, tmp_path: Path) -> None:
    cache = suite.ResultCache(tmp_path / "cache")
    first = suite.run_suite(suite.read_suite(pairs), workers=1, cache=cache)
    again = suite.run_suite(suite.read_suite(pairs), workers=1, cache=cache)
    assert [r.verdict for r in again] == [r.verdict for r in first]
    assert all(r.cached for r in again) and not any(r.cached for r in first)
    assert again[0].detail == first[0].detail

    (pairs / "bugs" / "thrice.impl.mlir").write_text(TWICE)  # the bug is fixed
    third = {r.name: r for r in suite.run_suite(suite.read_suite(pairs), workers=1, cache=cache)}
    assert third["scale"].cached
    assert not third["bugs/thrice"].cached and third["bugs/thrice"].verdict == "equivalent"


def test_options_are_part_of_the_cache_key(pairs: Path, tmp_path: Path) -> None:
    cache = suite.ResultCache(tmp_path / "cache")
    pair = suite.read_suite(pairs)[0]
    assert cache.key(pair, suite.SuiteOptions()) != cache.key(pair, suite.SuiteOptions(seed=1))
    moved = suite.Pair("elsewhere", pair.spec, pair.impl)
    # content-addressed: the same files under another name are the same check
    assert cache.key(pair, suite.SuiteOptions()) == cache.key(moved, suite.SuiteOptions())


def test_workers_give_the_same_verdicts_as_one(pairs: Path) -> None:
    listed = suite.read_suite(pairs)
    one = suite.run_suite(listed, workers=1)
    two = suite.run_suite(listed, workers=2)
    assert [(r.name, r.verdict, r.detail) for r in one] == [
        (r.name, r.verdict, r.detail) for r in two
    ]
    assert [r.verdict for r in one] == ["not_equivalent", "equivalent"]


def test_manifest_with_expectations_layouts_and_partition(tmp_path: Path) -> None:
    for name, text in [("twice", TWICE), ("scaled", SCALED), ("thrice", THRICE)]:
        (tmp_path / f"{name}.mlir").write_text(text)
    (tmp_path / "local.mlir").write_text(PER_DEVICE)
    manifest = tmp_path / "suite.jsonl"
    entries = [
        {"name": "rewrite", "spec": "twice.mlir", "impl": "scaled.mlir"},
        {"name": "mutant", "spec": "twice.mlir", "impl": "thrice.mlir", "expect": "not_equivalent"},
        {
            "name": "sharded",
            "spec": "twice.mlir",
            "impl": "local.mlir",
            "num_partitions": 2,
            "in_shardings": SHARDED,
            "out_shardings": SHARDED,
        },
    ]
    manifest.write_text("".join(json.dumps(e) + "\n" for e in entries))
    junit, jsonl = tmp_path / "out.xml", tmp_path / "out.jsonl"
    r = tv("check", str(manifest), "--no-cache", "--junit", str(junit), "--jsonl", str(jsonl))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(expected not_equivalent)" in r.stdout

    root = ElementTree.parse(junit).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("3", "0", "0")
    assert [c.get("name") for c in root.iter("testcase")] == ["rewrite", "mutant", "sharded"]
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [(x["verdict"], x["passed"]) for x in records] == [
        ("equivalent", True),
        ("not_equivalent", True),
        ("equivalent", True),
    ]
    assert records[1]["report"]["counterexample"] is not None


def test_junit_marks_unknown_as_error_not_pass(tmp_path: Path) -> None:
    results = [
        suite.PairResult("a", "unknown", detail="unsupported op"),
        suite.PairResult("b", "not_equivalent", detail="differs"),
        suite.PairResult("c", "equivalent"),
    ]
    out = tmp_path / "j.xml"
    suite.write_junit(results, out)
    root = ElementTree.parse(out).getroot()
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert cases["a"].find("error") is not None and cases["b"].find("failure") is not None
    assert cases["c"].find("error") is None and cases["c"].find("failure") is None
    assert suite.exit_code(results) == 1
    assert suite.exit_code(results[:1] + results[2:]) == 2
    assert suite.exit_code(results[2:]) == 0


@pytest.mark.parametrize(
    "content, message",
    [
        ('[{"spec": "x.mlir"}]', "'spec' and 'impl' go together"),
        ('[{"spec": "a", "impl": "b", "colour": 1}]', "unknown key 'colour'"),
        ('[{"spec": "missing.mlir", "impl": "missing.mlir"}]', "does not exist"),
        ("[1, 2", "not JSON"),
        ("[]", "no pairs found"),
    ],
)
def test_bad_manifest_is_one_line_exit_3(tmp_path: Path, content: str, message: str) -> None:
    m = tmp_path / "m.json"
    m.write_text(content)
    r = tv("check", str(m), "--no-cache")
    assert r.returncode == 3 and message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_suite_options_on_a_single_pair_are_bad_input(pairs: Path) -> None:
    spec, impl = pairs / "scale.spec.mlir", pairs / "scale.impl.mlir"
    r = tv("check", str(spec), str(impl), "--junit", "x.xml")
    assert r.returncode == 3 and "for suites" in r.stderr


def test_pytest_collects_a_suite_manifest(tmp_path: Path) -> None:
    for name, text in [("twice", TWICE), ("scaled", SCALED), ("thrice", THRICE)]:
        (tmp_path / f"{name}.mlir").write_text(text)
    (tmp_path / "tv_suite.json").write_text(
        json.dumps(
            [
                {"name": "rewrite", "spec": "twice.mlir", "impl": "scaled.mlir"},
                {"name": "bug", "spec": "twice.mlir", "impl": "thrice.mlir"},
            ]
        )
    )
    env = os.environ | {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tv_ir.pytest_plugin",
            "-q",
            "-rf",
            "-p",
            "no:cacheprovider",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 failed, 1 passed" in r.stdout
    assert "tv: not_equivalent (expected equivalent)" in r.stdout


def test_pytest_plugin_is_registered() -> None:
    plugins = {e.value for e in entry_points(group="pytest11")}
    assert "tv_ir.pytest_plugin" in plugins


def test_tv_check_fixture(tmp_path: Path, tv_check) -> None:
    report = tv_check(TWICE, SCALED)
    assert report.verdict == "equivalent"
    assert tv_check(TWICE, THRICE, expect="not_equivalent").counterexample is not None
