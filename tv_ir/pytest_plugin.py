"""pytest plugin: suite manifests collected as tests, one test per pair.

Installed with tv (entry point `pytest11`). A manifest named `tv_suite*.json(l)` or
`*.tvsuite.json(l)` (the format of `tv check SUITE`, docs/regression.md) is collected by
pytest; each pair is a test that passes when tv's verdict is the pair's expected one
(default `equivalent`) and fails with tv's report otherwise. The `tv_check` fixture checks a
pair from a test function: `tv_check(spec, impl)` returns the report, failing the test
unless it is `equivalent` (`expect=` for another verdict). `--tv-workers N` makes every
check of the session use N worker processes for its independent obligations (it sets
$TV_WORKERS; README, "Use"): `pytest --tv-workers 2` runs a test suite with two workers per
check.
"""

from __future__ import annotations

import os

import pytest

from tv_ir.report.result import EQUIVALENT


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--tv-workers",
        metavar="N",
        default=None,
        help="tv: worker processes for each check's independent obligations (sets TV_WORKERS)",
    )


def pytest_configure(config) -> None:
    n = config.getoption("--tv-workers", default=None)
    if n is None:
        return
    from .errors import BadInput
    from .prover.workers import WORKERS_ENV, validate

    try:
        os.environ[WORKERS_ENV] = str(validate(n, "--tv-workers"))
    except BadInput as e:
        raise pytest.UsageError(str(e)) from None


def _is_manifest(name: str) -> bool:
    base = name.rsplit(".", 1)
    return (
        len(base) == 2
        and base[1] in ("json", "jsonl")
        and (base[0].startswith("tv_suite") or base[0].endswith(".tvsuite"))
    )


def pytest_collect_file(file_path, parent):
    if _is_manifest(file_path.name):
        return SuiteFile.from_parent(parent, path=file_path)
    return None


class SuiteFile(pytest.File):
    """A suite manifest: its pairs are the tests."""

    def collect(self):
        from .suite import read_suite

        for pair in read_suite(self.path):
            yield PairItem.from_parent(self, name=pair.name, pair=pair)


class PairItem(pytest.Item):
    """One pair of a suite manifest."""

    def __init__(self, *, pair, **kwargs):
        super().__init__(**kwargs)
        self.pair = pair

    def runtest(self):
        from .suite import SuiteOptions, check_pair

        result = check_pair(self.pair, SuiteOptions())
        if not result.passed:
            raise PairFailed(result)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, PairFailed):
            r = excinfo.value.result
            return f"tv: {r.verdict} (expected {r.expect}): {r.detail}"
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"tv pair {self.name}"


class PairFailed(Exception):
    def __init__(self, result):
        super().__init__(result.detail)
        self.result = result


@pytest.fixture
def tv_check():
    """`tv_check(spec, impl, expect="equivalent", **check_options)`: the report of
    `tv_ir.check`, failing the test unless its verdict is `expect`."""
    from .pipeline import check

    def run(spec, impl, expect: str = EQUIVALENT, **options):
        report = check(spec, impl, **options)
        if report.verdict != expect:
            pytest.fail(f"tv: {report.verdict} (expected {expect})\n{report}", pytrace=False)
        return report

    return run
