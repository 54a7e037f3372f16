"""The pipeline behind `tv check` and `tv_ir.check`: import, normalise, compare, prove."""

from __future__ import annotations

import time

from .errors import BadInput, Unsupported
from .importer import load
from .ir import Module
from .prover.engine import Options, StageProver
from .report import UNKNOWN, Report


def prepare(source, role: str) -> Module:
    from tv_ir.passes import run_pipeline

    try:
        module = load(source)
    except BadInput as e:
        raise BadInput(f"{role}: {e}") from None
    return run_pipeline(module)


def check_signatures(spec: Module, impl: Module) -> None:
    s, i = spec.main, impl.main
    if len(s.arg_types) != len(i.arg_types):
        raise BadInput(
            f"signatures differ: spec takes {len(s.arg_types)} arguments, impl {len(i.arg_types)}"
        )
    for k, (a, b) in enumerate(zip(s.arg_types, i.arg_types, strict=True)):
        if a != b:
            raise BadInput(f"signatures differ: argument {k} is {a} in spec but {b} in impl")
    if len(s.result_types) != len(i.result_types):
        raise BadInput(
            f"signatures differ: spec returns {len(s.result_types)} results, "
            f"impl {len(i.result_types)}"
        )
    for k, (a, b) in enumerate(zip(s.result_types, i.result_types, strict=True)):
        if a != b:
            raise BadInput(f"signatures differ: result {k} is {a} in spec but {b} in impl")


def check(spec, impl, timeout: float = 10.0, seed: int = 0, progress=None) -> Report:
    """Prove `impl` equal to `spec` (modules as text, bytes, paths or ir.Module)."""
    t0 = time.perf_counter()
    spec_m = prepare(spec, "spec")
    impl_m = prepare(impl, "impl")
    check_signatures(spec_m, impl_m)
    t_import = time.perf_counter() - t0
    try:
        report = StageProver(spec_m, impl_m, Options(timeout, seed, progress)).run()
    except Unsupported as e:
        report = Report(UNKNOWN, unsupported=[e.op] if e.op else [], reason=str(e))
    report.stats.seconds["import"] = t_import
    report.stats.seconds["total"] = time.perf_counter() - t0
    report.spec_name = spec_m.source
    report.impl_name = impl_m.source
    return report
