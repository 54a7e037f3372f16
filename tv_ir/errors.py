"""The few error kinds tv reports to users; each maps to a CLI exit code."""

from __future__ import annotations


class TvError(Exception):
    """Base class: a user-facing error with a one-line message."""

    exit_code = 2


class BadInput(TvError):
    """Unreadable file, malformed IR, mismatched signatures (exit 3)."""

    exit_code = 3


class Unsupported(TvError):
    """A construct tv has no semantics for; the verdict becomes `unknown` (exit 2)."""

    exit_code = 2

    def __init__(self, message: str, op: str | None = None, loc=None):
        super().__init__(message)
        self.op = op
        self.loc = loc

    def __reduce__(self):  # op and loc cross from a worker process (tv_ir.prover.workers)
        return (type(self), (str(self), self.op, self.loc))


def one_line(e: BaseException, limit: int = 500) -> str:
    """An error's message on one line (a user-facing error is one line), cut to `limit`."""
    msg = " ".join(str(e).split())
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."
