"""pytest helpers: `assert_equivalent` fails a test with tv's report as the message."""

from __future__ import annotations

from typing import Any

from tv_ir.report.result import Report

from .verify import verify


class NotEquivalentError(AssertionError):
    """`assert_equivalent` failed; `.report` holds the full report."""

    def __init__(self, report: Report):
        super().__init__(str(report))
        self.report = report


def assert_equivalent(fn: Any, *args: Any, **kwargs: Any) -> Report:
    """`verify(fn, *args, **kwargs)` and raise `NotEquivalentError` (an AssertionError) with
    the readable report unless the verdict is `equivalent`. Returns the report."""
    __tracebackhide__ = True
    report = verify(fn, *args, **kwargs)
    if report.verdict != "equivalent":
        raise NotEquivalentError(report)
    return report
