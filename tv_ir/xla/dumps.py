"""XLA's per-pass dumps (`--xla_dump_to=DIR --xla_dump_hlo_pass_re=.*`), read as the sequence
of module snapshots a compilation went through.

XLA writes `module_0000.NAME.before_optimizations.txt` (the input), then a snapshot each time
a pass changed the module: `module_0000.NAME.0007.PIPELINE.after_PASS.before_NEXT.txt` holds
the module after PASS ran in PIPELINE, and `module_0000.NAME.cpu_after_optimizations.txt` the
result. Consecutive snapshots are therefore one pass's input and output (`after_pipeline-start`
marks what changed between the previous dump and the start of PIPELINE).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tv_ir.errors import BadInput
from tv_ir.ir.importer import SPMD_ENTRY

FIRST, LAST = -1, 10**9
_NUMBERED = re.compile(r"^(module_\d+)\.(.+)\.(\d{4})\.([^.]+)\.(.+)\.txt$")
_INPUT = re.compile(r"^(module_\d+)\.(.+)\.before_optimizations\.txt$")
_OUTPUT = re.compile(r"^(module_\d+)\.(.+)\.(\w+)_after_optimizations\.txt$")


@dataclass(frozen=True)
class Snapshot:
    """One dumped state of a module: which pass produced it, and whether it is per-device
    (after XLA's SPMD partitioner: an entry computation named `*_spmd`)."""

    path: Path
    order: int  # FIRST for the input, the dump's number, LAST for the final module
    pipeline: str
    pass_name: str  # the pass whose output this is ("" for the input)
    per_device: bool

    @property
    def label(self) -> str:
        if self.order == FIRST:
            return "input (before optimizations)"
        if self.order == LAST:
            return "after optimizations (final)"
        if self.pass_name == "pipeline-start":
            return f"{self.order:04d} start of pipeline {self.pipeline}"
        return f"{self.order:04d} {self.pass_name} (pipeline {self.pipeline})"

    def text(self) -> str:
        return self.path.read_text()


def modules_in(directory: str | Path) -> list[str]:
    """The modules a dump directory holds (`module_0000.jit_f`, ...)."""
    d = _directory(directory)
    return sorted(
        {f"{m.group(1)}.{m.group(2)}" for f in d.iterdir() if (m := _INPUT.match(f.name))}
    )


def read_dump(directory: str | Path, module: str | None = None) -> list[Snapshot]:
    """The snapshots of one module, input first. `module` picks one when the directory holds
    several (its `module_0000.NAME` prefix, NAME, or the number)."""
    d = _directory(directory)
    names = modules_in(d)
    if not names:
        raise BadInput(
            f"{d}: no XLA pass dumps (module_*.before_optimizations.txt); dump them with "
            "XLA_FLAGS='--xla_dump_to=DIR --xla_dump_hlo_pass_re=.*'"
        )
    if module is not None:
        chosen = [n for n in names if module in (n, n.split(".", 1)[1], n.split(".", 1)[0])]
        if not chosen:
            raise BadInput(f"{d}: no module {module!r}; the dump holds {', '.join(names)}")
    else:
        chosen = names
    if len(chosen) > 1:
        raise BadInput(f"{d}: holds several modules ({', '.join(chosen)}); pick one with --module")
    prefix, name = chosen[0].split(".", 1)
    snaps = []
    for f in d.iterdir():
        if f.name.startswith(f"{prefix}.{name}."):
            snap = _snapshot(f, prefix, name)
            if snap is not None:
                snaps.append(snap)
    snaps.sort(key=lambda s: s.order)
    if len(snaps) < 2:
        raise BadInput(
            f"{d}: {chosen[0]} has no snapshots after its input; dump every pass with "
            "--xla_dump_hlo_pass_re=.*"
        )
    return snaps


def _directory(directory) -> Path:
    d = Path(directory)
    if not d.is_dir():
        raise BadInput(f"{d}: not a directory of XLA dumps")
    return d


def _snapshot(f: Path, prefix: str, name: str) -> Snapshot | None:
    if (m := _INPUT.match(f.name)) and (m.group(1), m.group(2)) == (prefix, name):
        return Snapshot(f, FIRST, "", "", _per_device(f))
    if (m := _OUTPUT.match(f.name)) and (m.group(1), m.group(2)) == (prefix, name):
        return Snapshot(f, LAST, f"{m.group(3)} backend", "", _per_device(f))
    m = _NUMBERED.match(f.name)
    if m is None or (m.group(1), m.group(2)) != (prefix, name):
        return None
    step = m.group(5)
    after = step.split(".before_", 1)[0].removeprefix("after_")
    return Snapshot(f, int(m.group(3)), m.group(4), after, _per_device(f))


def _per_device(f: Path) -> bool:
    return SPMD_ENTRY.search(f.read_text()) is not None
