"""`verify(model_or_fn, *args, mesh=, shardings=, input_shardings=, spec=)` for torch_xla."""

from __future__ import annotations

from typing import Any

from tv_ir.errors import BadInput
from tv_ir.report.result import Report

from . import runtime
from .export import Exported, export


def verify(
    model_or_fn: Any,
    *example_args: Any,
    mesh: Any = None,
    shardings: dict[str, tuple] | None = None,
    input_shardings: Any = None,
    spec: Any = None,
    **options: Any,
) -> Report:
    """Prove a torch_xla SPMD program equal to its unsharded meaning, or refute it.

    `model_or_fn`: an `nn.Module` (its forward), a `TrainStep` (loss, backward, optimizer
    step as one program) or a function of tensors. `shardings` maps parameter names
    (`named_parameters()`) to partition specs, `input_shardings` gives one spec (or None)
    per example argument, on `mesh` (a `torch_xla.distributed.spmd.Mesh`): the arguments
    of `mark_sharding`. The program is captured as StableHLO, partitioned by XLA and the
    per-device program proved equal to `spec` (a reference model or function, traced
    unsharded), by default to the program's own unsharded meaning.
    `options`: `timeout` (seconds per solver query), `time_limit` (seconds for the whole
    run), `memory_limit` (MB; default 85% of
    the memory available when the run starts), `seed`, `progress`, `reduce_shapes` (default True),
    `workers` (processes for the check's independent obligations; tv_ir.prover.workers).
    """
    from tv_ir.pipeline import PARTITION_OPTIONS  # lazily: the runtime is set up first

    unknown = sorted(set(options) - set(PARTITION_OPTIONS))
    if unknown:
        raise BadInput(f"verify: unknown option(s) {', '.join(unknown)}")
    exp = export(
        model_or_fn,
        *example_args,
        mesh=mesh,
        shardings=shardings,
        input_shardings=input_shardings,
        spec=spec,
    )
    return check_exported(exp, **options)


def check_exported(exp: Exported, **options: Any) -> Report:
    """Verify an exported pair: XLA partitions the implementation, tv proves it."""
    from tv_ir.pipeline import check, partition_and_check

    impl = exp.impl
    if exp.spec is None:
        if impl.num_devices <= 1:
            raise BadInput(f"{impl.name} is not sharded: pass mesh= and shardings=, or spec=")
        report = partition_and_check(impl.text, **options)
    else:
        report = check(exp.spec.text, impl.text, **options)
    _describe(report, exp)
    return report


def _describe(report: Report, exp: Exported) -> None:
    impl = exp.impl
    if impl.num_devices > 1:
        report.impl_name = (
            f"XLA's SPMD partitioning of torch_xla's {impl.name} ({impl.num_devices} devices)"
        )
    else:
        report.impl_name = f"torch_xla's {impl.name}"
    report.spec_name = (
        f"torch_xla's {exp.spec.name} (unsharded)" if exp.spec else f"{impl.name} (unsharded)"
    )
    ce = report.counterexample
    if ce is not None and ce.output is not None and 0 <= ce.output < len(impl.outputs):
        report.notes.append(f"output {ce.output} is {impl.outputs[ce.output]}")
    report.notes.append(_location_note(impl))


def _location_note(prog) -> str:
    if not runtime.sources_enabled():
        return (
            "locations: torch op names only (XLA_HLO_DEBUG=0: torch_xla recorded no source lines)"
        )
    return (
        f"locations: {prog.located_ops} of {prog.named_ops} torch ops at user source lines "
        "(torch_xla metadata), the rest by torch op name"
    )
