"""Whose code a source file is: tv's own, a library's, or the user's.

Reports name the user's lines. JAX writes, for each op, the innermost frame it takes for
user code (and, with a callsite stack, its callers); it counts any file outside JAX and the
standard library as user code, so tv's own front end (which calls `jax.jit(...).lower`)
and library shims (optax, flax) can be the frame it picks. `register_with_jax` tells JAX
that tv's files are not user code; `pick_frame` chooses, among a location's frames, the
innermost that is the user's.
"""

from __future__ import annotations

import functools
import os
import sysconfig

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tv_ir/ (this is tv_ir/ir/)
_ROOT = os.path.dirname(_PACKAGE)


def _tv_dirs() -> tuple[str, ...]:
    """tv's package directories (tv_ir/, and passes/, frontends/ beside it in a source
    checkout; installed, they are inside tv_ir/), as imported and as real paths, each ending
    in a separator (so `.../passes` does not match `.../passes_extra`)."""
    dirs = {_PACKAGE}
    if os.path.exists(os.path.join(_ROOT, "pyproject.toml")):  # a source checkout
        dirs |= {os.path.join(_ROOT, "passes"), os.path.join(_ROOT, "frontends")}
    out = set()
    for d in dirs:
        out.add(d.rstrip(os.sep) + os.sep)
        out.add(os.path.realpath(d).rstrip(os.sep) + os.sep)
    return tuple(sorted(out))


TV_DIRS = _tv_dirs()
_LIBRARY_DIRS = tuple(
    sorted(
        {
            os.path.realpath(p).rstrip(os.sep) + os.sep
            for k in ("stdlib", "platstdlib", "purelib", "platlib")
            if (p := sysconfig.get_paths().get(k))
        }
    )
)
_LIBRARY_MARKERS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


@functools.cache
def is_tv_file(path: str | None) -> bool:
    """A file of tv itself (tv_ir/, passes/, frontends/)."""
    if not path:
        return False
    return path.startswith(TV_DIRS) or os.path.realpath(path).startswith(TV_DIRS)


@functools.cache
def is_library_file(path: str | None) -> bool:
    """A file of an installed library or the standard library (optax, flax, jax, ...)."""
    if not path:
        return False
    if path.startswith("<frozen") or any(m in path for m in _LIBRARY_MARKERS):
        return True
    return os.path.realpath(path).startswith(_LIBRARY_DIRS)


def pick_frame(frames: list):
    """The frame to report among `frames` ((file, ...) tuples, innermost first): the
    innermost user frame; else the innermost frame outside tv (a library's line is better
    than none); else None (tv's own lines are never the user's)."""
    outside = [f for f in frames if not is_tv_file(f[0])]
    for f in outside:
        if not is_library_file(f[0]):
            return f
    return outside[0] if outside else None


_registered = False


def register_with_jax() -> None:
    """Tell JAX's source-info machinery that tv's files are not user code, so the frame it
    records for an op traced through tv's front end is the user's (once per process)."""
    global _registered
    if _registered:
        return
    try:
        from jax._src import source_info_util
    except ImportError:  # pragma: no cover - another JAX layout: locations fall back
        return
    register = getattr(source_info_util, "register_exclusion", None)
    if register is None:  # pragma: no cover
        return
    for d in TV_DIRS:
        register(d)
    _registered = True
