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


class ProgramHangs(Unsupported):
    """On these (concrete) inputs the devices of one collective's group part ways at a
    branch: those that take it wait at the collective for the others, forever. The program
    returns nothing there, which is a difference from a spec that returns (a refutation,
    `tv_ir.prover.localise`); where the inputs are not concrete it stays `unknown`.
    `sites`: (op name, location) of the branch op, the collective and the predicate's
    producer; `waiting`: the devices that wait."""

    def __init__(self, message: str, op=None, loc=None, sites=(), waiting=()):
        super().__init__(message, op, loc)
        self.sites = list(sites)
        self.waiting = list(waiting)

    def __reduce__(self):
        return (type(self), (str(self), self.op, self.loc, self.sites, self.waiting))


def one_line(e: BaseException, limit: int = 500) -> str:
    """An error's message on one line (a user-facing error is one line), cut to `limit`."""
    msg = " ".join(str(e).split())
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."
