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
    producer; `waiting`: the devices that wait; `group`: the collective's group they are of
    (`devices_clause` words both)."""

    def __init__(self, message: str, op=None, loc=None, sites=(), waiting=(), group=()):
        super().__init__(message, op, loc)
        self.sites = list(sites)
        self.waiting = list(waiting)
        self.group = list(group)

    def __reduce__(self):
        return (
            type(self),
            (str(self), self.op, self.loc, self.sites, self.waiting, self.group),
        )


def devices_clause(group, waiting, name=None) -> str:
    """ "whose group [0-511]: devices [0-299, 301-511] take and device 300 (data=300) does
    not": the part of a hang's message that names devices. `name` (a device id -> "device
    300 (data=300)") names each device of a side of at most 3."""

    def side(ids: list[int], verb: str, verbs: str) -> str:
        if name is not None and len(ids) == 1:
            return f"{name(ids[0])} {verbs}"
        if name is not None and 0 < len(ids) <= 3:
            return f"{', '.join(name(d) for d in ids)} {verb}"
        return f"devices [{id_ranges(ids)}] {verb}"

    taking = sorted(waiting)
    rest = sorted(set(group) - set(taking))
    return (
        f"whose group [{id_ranges(group)}]: {side(taking, 'take', 'takes')} and "
        f"{side(rest, 'do not', 'does not')}"
    )


def renamed_devices(message: str, group, waiting, name=None) -> str:
    """A hang's `message` with its devices clause (`devices_clause`) written for `group` and
    `waiting` instead: the devices of a reduced mesh named by the real ones they stand for."""
    import re

    clause = devices_clause(group, waiting, name)
    return re.sub(r"whose group \[.*? not(?=: those)", lambda _: clause, message, count=1)


def id_ranges(ids, limit: int = 200) -> str:
    """Sorted ids with their runs joined ("0-299, 301-511"; "3, 7, ..., 511" for a run of
    one step), cut at about `limit` characters with the count of ids."""
    ids = sorted(ids)
    out: list[str] = []
    k = 0
    while k < len(ids):
        j = k + 1
        if j < len(ids):
            step = ids[j] - ids[k]
            while j + 1 < len(ids) and ids[j + 1] - ids[j] == step:
                j += 1
        if j - k >= 2:  # a run of 3 or more
            out.append(
                f"{ids[k]}-{ids[j]}" if step == 1 else f"{ids[k]}, {ids[k] + step}, ..., {ids[j]}"
            )
            k = j + 1
        else:
            out.append(str(ids[k]))
            k += 1
    text = ", ".join(out)
    if len(text) > limit:
        text = text[: text.rfind(", ", 0, limit)] + f", ... ({len(ids)} devices)"
    return text


def one_line(e: BaseException, limit: int = 500) -> str:
    """An error's message on one line (a user-facing error is one line), cut to `limit`."""
    msg = " ".join(str(e).split())
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."
