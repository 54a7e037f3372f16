"""tv: prove a distributed or rewritten StableHLO program equal to its specification."""

from .errors import BadInput, TvError, Unsupported

__all__ = ["BadInput", "TvError", "Unsupported", "check", "load"]


def load(source):
    """Import a module (path, text, bytecode, HLO text, or ir.Module) into tv_ir."""
    from tv_ir.ir.importer import load as _load

    return _load(source)


def check(spec, impl, **options):
    """Prove `impl` equal to `spec`, or refute it. Returns a `tv_ir.report.result.Report`."""
    from .pipeline import check as _check

    return _check(spec, impl, **options)
