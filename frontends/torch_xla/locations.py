"""Source locations for torch_xla ops: the user's Python line when the op metadata has one.

With XLA_HLO_DEBUG=1 torch_xla records, for each op, its aten name and the Python stack
(innermost frame first) as `NameLoc("aten__mm", CallSiteLoc(...))`. tv reports an op at the
innermost frame that is the user's code (not torch, torch_xla, the standard library or
this front end) and names it `function/aten::mm`, a name stack like JAX's. Ops whose stack
holds no user frame (optimizer internals, autograd) keep only the name.
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass

_HERE = os.path.dirname(os.path.abspath(__file__))
_LIBRARY_DIRS = tuple(
    {os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "purelib", "platlib")}
)


@dataclass(frozen=True)
class Site:
    op: str | None  # torch op, e.g. "aten::mm"
    function: str | None
    file: str | None
    line: int | None

    @property
    def name(self) -> str | None:
        if self.op is None:
            return None
        return f"{self.function or 'torch'}/{self.op}"


def is_user_file(path: str) -> bool:
    if not path or path.startswith("<frozen") or path == "-":
        return False
    real = os.path.realpath(path)
    return not (real.startswith(_HERE) or real.startswith(_LIBRARY_DIRS))


def site_of(loc) -> Site:
    """The op name and the user frame of one torch_xla location (jaxlib `ir.Location`)."""
    op, frames = None, []

    def visit(l, fn=None):
        nonlocal op
        cls = type(l).__name__
        if cls == "NameLoc":
            n = l.name_str
            if op is None and n.startswith(("aten__", "xla__")):
                op = _op_name(n)
                visit(l.child_loc, fn)
            else:
                visit(l.child_loc, n)
        elif cls == "CallSiteLoc":
            visit(l.callee, fn)
            visit(l.caller, fn)
        elif cls == "FileLineColLoc":
            frames.append((fn, l.filename, l.start_line))
        elif cls == "FusedLoc":
            for x in l.locations:
                visit(x, fn)

    try:
        visit(loc)
    except Exception:
        return Site(None, None, None, None)
    for fn, f, line in frames:  # innermost first
        if _in_frontend(f):
            break  # reached the front end's own driver: no user frame inside the model
        if is_user_file(f):
            return Site(op, fn, f, line)
    inner = frames[0][0] if frames else None
    return Site(op, inner, None, None)


def _in_frontend(path: str) -> bool:
    return bool(path) and os.path.realpath(path).startswith(_HERE)


def _op_name(n: str) -> str:
    """`aten__mm` -> `aten::mm`; `xla__cross_replica_sum` -> `xla::cross_replica_sum`."""
    for prefix in ("aten__", "xla__"):
        if n.startswith(prefix):
            return prefix[:-2] + "::" + n[len(prefix) :]
    return n
