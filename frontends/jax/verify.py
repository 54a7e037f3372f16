"""`verify(fn, *args, spec=...)`: lower a JAX program (and its spec) and prove them equal."""

from __future__ import annotations

import time
from typing import Any

from tv_ir.errors import BadInput
from tv_ir.report.result import Report

from .lowering import Lowered, lower
from .mesh import named, resolve_mesh


def verify(
    fn: Any,
    *args: Any,
    spec: Any = None,
    mesh: Any = None,
    in_shardings: Any = None,
    out_shardings: Any = None,
    **options: Any,
) -> Report:
    """Prove `fn` at the example `args` (arrays or `jax.ShapeDtypeStruct`s, pytrees allowed)
    equal to `spec`, or refute it with a replayed counterexample and source locations.

    - `spec` given: `fn` may be plain, a `jax.jit` with shardings, or hold `shard_map`s; a
      sharded `fn` is partitioned by XLA and its per-device program is what is proved.
    - no `spec`: `fn` must be sharded (a `jax.jit` with shardings, or `in_shardings` /
      `out_shardings` given); XLA's SPMD partitioning of `fn` is proved equal to `fn` itself.

    `mesh` is a `jax.sharding.Mesh` or a `{axis: size}` dict; PartitionSpecs in the shardings
    are placed on it. `options`: `timeout` (seconds per solver query), `time_limit` (seconds
    for the whole run), `memory_limit` (MB the run may add to the process's resident
    memory; default 85% of what is available when it starts), `seed`,
    `progress`, `reduce_mesh` (default True: prove a shard_map program, or XLA's partitioning
    of a jit, on a smaller mesh where its structure allows; False simulates every device),
    `reduce_shapes` (default True: prove at reduced shapes where every op allows
    it; False checks at the real sizes), `workers` (processes for the check's independent
    obligations; default: the idle cores once they have taken a second, or $TV_WORKERS).
    """
    from tv_ir.pipeline import CHECK_OPTIONS, check, partition_and_check, prepare

    unknown = sorted(set(options) - set(CHECK_OPTIONS))
    if unknown:
        raise BadInput(f"verify: unknown option(s) {', '.join(unknown)}")
    mesh = resolve_mesh(mesh)
    t0 = time.perf_counter()
    impl = lower(
        fn,
        args,
        role="fn",
        mesh=mesh,
        in_shardings=named(in_shardings, mesh),
        out_shardings=named(out_shardings, mesh),
    )
    lowering = time.perf_counter() - t0
    if spec is None:
        if impl.num_partitions <= 1:
            raise BadInput(
                f"fn {impl.name} is not sharded: without spec=, pass a jax.jit with shardings "
                "(or in_shardings/out_shardings and mesh)"
            )
        report = partition_and_check(impl.text, **options)
        report.stats.seconds["jax lowering"] = lowering
        _name(report, impl, impl, partitioned=True)
        return report
    t0 = time.perf_counter()
    # a jax.jit given as fn may have dropped arguments it does not use: the spec is lowered
    # the same way, and must take the same ones
    ref = lower(spec, args, role="spec", mesh=mesh, keep_unused=impl.kept is None)
    lowering += time.perf_counter() - t0
    if ref.kept != impl.kept:
        role, who = ("fn", impl) if impl.kept is not None else ("spec", ref)
        raise BadInput(
            f"{role} {who.name} is a jax.jit that drops the arguments it does not use, and "
            "the other function does not drop the same ones: jit it with keep_unused=True so "
            "that its program takes every argument"
        )
    if ref.out_tree != impl.out_tree:
        raise BadInput(
            f"fn and spec return different structures: {impl.out_tree} vs {ref.out_tree}"
        )
    impl_program = impl.text
    if impl.manual:
        impl_program = prepare(impl.text, "impl", unroll=False)  # check() reads the loops
    report = check(ref.text, impl_program, **options)
    # JAX's tracing and lowering of both functions, before tv's check (as `xla partition`
    # is XLA's part of it): what the report's other phases do not count
    report.stats.seconds["jax lowering"] = lowering
    _name(report, ref, impl, partitioned=impl.num_partitions > 1 and not impl.manual)
    return report


def _name(report: Report, spec: Lowered, impl: Lowered, partitioned: bool) -> None:
    """Name the programs by their Python functions and the differing output by its path."""
    if partitioned:
        report.impl_name = f"XLA's SPMD partitioning of {impl.name} ({impl.num_partitions} devices)"
    else:
        report.impl_name = impl.name
    report.spec_name = spec.name
    ce = report.counterexample
    if ce is not None and ce.output is not None and 0 <= ce.output < len(impl.outputs):
        report.notes.append(f"output {ce.output} is result{impl.outputs[ce.output]}")
