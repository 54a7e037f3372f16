"""MaxText's shard_map collective matmul (its `examples/shmap_collective_matmul.py`: a
bidirectional ring of ppermutes in a `fori_loop`, each step's block written into an
accumulator with `dynamic_update_slice`), verified against its own dense `matmul`; with
`--bug`, a planted bug in a copy of MaxText's file is refuted and the report names the
planted line.

Runs in MaxText's environment (docs/jax.md, "MaxText"):

    /work/envs/maxtext/bin/python examples/maxtext_collective_matmul.py \
        [--bug scale|direction|backward] \
        [--batch 2] [--seq 64] [--emb 32] [--heads 8] [--head-dim 4]

The module builds its mesh of 4 devices (tensor axis 4) at import; `matmul` and
`collective_matmul` are MaxText's functions, used as they are. The bugs are one-line edits
of MaxText's source, written to a temporary copy:
- `scale`: the local block scaled (`update = update * 2` after the first einsum);
- `direction`: the forward ring's ppermute inside the loop sent backward;
- `backward`: the backward ring's ppermute before the loop sent forward.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import sys
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from tv_ir.frontends.jax import verify  # noqa: E402

MODULE = "maxtext.examples.shmap_collective_matmul"

# (line to find, the line it becomes, which occurrence): one-line edits of MaxText's file
BUGS = {
    "scale": (
        '  update = jnp.einsum("bsE,Ehd->bshd", activations, weights)',
        '  update = jnp.einsum("bsE,Ehd->bshd", activations, weights) * 2',
        0,
    ),
    "direction": (
        "        perm=[(j, (j + 1) % axis_size) for j in range(axis_size)],",
        "        perm=[(j, (j - 1) % axis_size) for j in range(axis_size)],",
        0,  # the forward ppermute inside the loop (deeper indented than the first)
    ),
    "backward": (
        "      perm=[(j, (j - 1) % axis_size) for j in range(axis_size)],",
        "      perm=[(j, (j + 1) % axis_size) for j in range(axis_size)],",
        0,  # the first backward ppermute: before the loop
    ),
}


def load(bug: str | None):
    """MaxText's module, or a copy of it with `bug` planted: (module, its file, the lines of
    the statement holding the planted edit, empty without a bug)."""
    path = importlib.util.find_spec(MODULE).origin
    planted: range = range(0)
    if bug is not None:
        find, becomes, which = BUGS[bug]
        lines = open(path).read().split("\n")
        hits = [i for i, text in enumerate(lines) if text == find]
        lines[hits[which]] = becomes
        planted = statement_lines("\n".join(lines), hits[which] + 1)
        path = os.path.join(tempfile.mkdtemp(), f"shmap_collective_matmul_{bug}.py")
        with open(path, "w") as f:
            f.write("\n".join(lines))
    spec = importlib.util.spec_from_file_location(f"collective_matmul_{bug}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path, planted


def statement_lines(source: str, line: int) -> range:
    """The lines of the innermost statement holding `line` (a call over several lines is
    located at its first)."""
    best = None
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt) and node.lineno <= line <= node.end_lineno:
            if best is None or node.end_lineno - node.lineno < best.end_lineno - best.lineno:
                best = node
    return range(best.lineno, best.end_lineno + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bug", choices=sorted(BUGS))
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--emb", type=int, default=32)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=4)
    args = parser.parse_args()

    module, path, planted = load(args.bug)
    activations = jax.ShapeDtypeStruct((args.batch, args.seq, args.emb), jnp.bfloat16)
    weights = jax.ShapeDtypeStruct((args.emb, args.heads, args.head_dim), jnp.bfloat16)
    t0 = time.perf_counter()
    report = verify(
        module.collective_matmul,
        activations,
        weights,
        spec=module.matmul,
        time_limit=600,
        memory_limit=3000,
    )
    print(report)
    print(f"verdict {report.verdict}: verify {time.perf_counter() - t0:.1f} s")
    if args.bug is not None:
        loc = report.location
        named = [] if loc is None else [loc.impl, *loc.related]
        hit = any(s is not None and s.file == path and s.line in planted for s in named)
        where = f"{path}:{planted.start}-{planted.stop - 1}"
        print(f"planted statement {where} {'named' if hit else 'NOT named'} in the report")
        sys.exit(0 if hit and report.verdict == "not_equivalent" else 1)
    sys.exit(0 if report.verdict == "equivalent" else 1)


if __name__ == "__main__":
    main()
