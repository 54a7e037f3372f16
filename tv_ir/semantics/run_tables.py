"""The tables a run fills, put back as they were when it ends.

Terms are interned (one object per distinct node, `terms.py`) and memoised by node in
module-level tables that live as long as the process. A check at real sizes interns
millions: a data-parallel mean over 4,096 x 4,096 stopped at its time limit left 4 million
atoms (16 million objects, 4.6 GB) behind. The next check in the same process (a test
session, a notebook, a suite with one worker) carried them along, and the interpreter took
15 s to free them at exit, after the verdict was printed. The outermost run (`run_scope`,
entered by every pipeline entry point) restores each registered table when it ends, which
frees them in about a second: terms made outside any run stay valid; a run's own terms do
not outlive it (its report holds numbers and text, no terms).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_TABLES: list[dict] = []
_saved: list[dict] = []
_active = 0  # runs under way in this process (threads may run checks side by side)
_lock = threading.Lock()


def run_table(table: dict) -> dict:
    """Register a module-level table of interned terms, or of memos keyed by them (or by
    keys that name them), to be restored when the outermost run ends."""
    _TABLES.append(table)
    return table


@contextlib.contextmanager
def run_scope() -> Iterator[None]:
    """One run of tv: the tables are restored when the last run under way ends (nested and
    concurrent runs share the tables until then)."""
    global _active, _saved
    with _lock:
        if _active == 0:
            _saved = [dict(t) for t in _TABLES]
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                for table, before in zip(_TABLES, _saved, strict=True):
                    table.clear()
                    table.update(before)
                _saved = []
