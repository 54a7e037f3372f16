"""Lower a JAX function at example arguments to StableHLO text with source locations."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any

from tv_ir.errors import BadInput


@dataclass
class Lowered:
    """One lowered program: its text, its partition count and its output pytree paths."""

    text: str
    name: str  # the Python function, e.g. "train_step (model.py:42)"
    num_partitions: int
    manual: bool  # holds a shard_map (sdy.manual_computation / GSPMD manual custom calls)
    outputs: list[str]  # pytree path of each flattened output, e.g. "[0]['w1']"
    out_tree: Any
    # the flattened arguments the program takes, when a jax.jit dropped some it does not
    # use (None: all of them)
    kept: tuple[int, ...] | None = None


def describe(fn: Any) -> str:
    """`name (file:line)` of a Python function (through jit/partial wrappers)."""
    inner = fn
    for _ in range(8):
        nxt = getattr(inner, "__wrapped__", None) or getattr(inner, "func", None)
        if nxt is None:
            break
        inner = nxt
    name = getattr(inner, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    code = getattr(inner, "__code__", None)
    return f"{name} ({code.co_filename}:{code.co_firstlineno})" if code else name


def is_jitted(fn: Any) -> bool:
    return hasattr(fn, "lower") and hasattr(fn, "trace") and hasattr(fn, "__wrapped__")


def lower(
    fn: Any,
    args: tuple,
    *,
    role: str,
    mesh=None,
    in_shardings: Any = None,
    out_shardings: Any = None,
    keep_unused: bool = True,
) -> Lowered:
    """`jax.jit(fn, in_shardings, out_shardings, keep_unused).lower(*args)`, or
    `fn.lower(*args)` when fn is already a `jax.jit` (which keeps what it was given: the
    arguments it takes are `Lowered.kept`). Errors from tracing become one-line
    `BadInput`s."""
    import jax

    if not callable(fn):
        raise BadInput(f"{role}: {fn!r} is not callable")
    name = describe(fn)
    shard_kw = {}
    if in_shardings is not None:
        shard_kw["in_shardings"] = in_shardings
    if out_shardings is not None:
        shard_kw["out_shardings"] = out_shardings
    if is_jitted(fn):
        if shard_kw:
            raise BadInput(
                f"{role} {name} is already a jax.jit: give its shardings to jax.jit or to "
                "verify, not both"
            )
        jitted = fn
    else:
        # every argument kept (unless asked): jax.jit drops those a function does not use,
        # and a spec that ignores the dropout bits its implementation reads would take fewer
        jitted = jax.jit(fn, keep_unused=keep_unused, **shard_kw)
    ctx = jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext()
    try:
        with ctx:
            lowered = jitted.lower(*args)
        text = lowered.as_text(debug_info=True)
    except BadInput:
        raise
    except Exception as e:  # tracing errors: not jittable, wrong shapes, bad shardings
        raise BadInput(f"{role} {name} could not be lowered with jax.jit: {_one_line(e)}") from e
    kept = getattr(getattr(lowered, "_lowering", None), "compile_args", {}).get("kept_var_idx")
    if kept is not None and len(kept) == len(jax.tree_util.tree_leaves(args)):
        kept = None
    out_leaves, out_tree = jax.tree_util.tree_flatten_with_path(lowered.out_info)
    m = re.search(r"mhlo\.num_partitions\s*=\s*(\d+)", text)
    return Lowered(
        text=text,
        name=name,
        num_partitions=int(m.group(1)) if m else 1,
        manual="sdy.manual_computation" in text or "@SPMDFullToShardShape" in text,
        outputs=[jax.tree_util.keystr(path) for path, _ in out_leaves],
        out_tree=out_tree,
        kept=None if kept is None else tuple(sorted(kept)),
    )


def _one_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__
