"""The result of a check: a closed set of verdicts, a replayed counterexample, a location."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tv_ir.report.text import render
from tv_ir.report.verdicts import EQUIVALENT, EXIT_CODES, NOT_EQUIVALENT, SEMANTICS_NOTE, UNKNOWN

__all__ = ["EQUIVALENT", "EXIT_CODES", "NOT_EQUIVALENT", "SEMANTICS_NOTE", "UNKNOWN"]


@dataclass
class OpSite:
    """An op in one of the programs, with its source location when known."""

    op: str
    file: str | None = None
    line: int | None = None
    name: str | None = None  # JAX name stack, e.g. "jit(block)/dot_general"
    function: str | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.file else "unknown source line"
        extra = f" ({self.name})" if self.name else ""
        return f"{self.op} at {where}{extra}"


@dataclass
class Location:
    """Where the programs part ways: the first diverging op of the implementation and the spec."""

    impl: OpSite | None = None
    spec: OpSite | None = None
    # where the diverging impl op's inputs come from (nearest collective / slice on each data
    # path, index computations): the candidates when the op itself is not the mistake
    related: list[OpSite] = field(default_factory=list)
    # when `impl` made a value that is only a partial sum or off by a factor, the first op
    # that uses it as a whole: the missing collective or scale belongs between the two
    used_at: OpSite | None = None
    # why no op is named (the search for it ran out of time or memory)
    note: str = ""

    # the implementation side, flattened for convenience (`report.location.file`)
    @property
    def op(self) -> str | None:
        return self.impl.op if self.impl else None

    @property
    def file(self) -> str | None:
        return self.impl.file if self.impl else None

    @property
    def line(self) -> int | None:
        return self.impl.line if self.impl else None


@dataclass
class Counterexample:
    inputs: dict[str, np.ndarray]
    output: int | None  # which output differs (None: `hang`)
    index: tuple[int, ...]  # first differing element (logical index)
    expected: float | None  # spec value at that element
    actual: float | None  # implementation value at that element
    device: int | None = None  # the device holding that element (distributed programs)
    max_abs_diff: float = 0.0
    # that device's coordinates on the implementation's mesh (axis name -> index), when the
    # program names a mesh (shard_map, Shardy modules)
    mesh_coords: dict[str, int] | None = None
    # on these inputs the implementation never returns (devices of a collective's group part
    # ways at a branch: `device` waits for the others): what happens instead, in one line.
    # `output`, `index`, `expected` and `actual` then say nothing (no output is produced)
    hang: str | None = None
    # a hang's collective group and the devices of it that wait (`hang` names them)
    hang_group: list[int] | None = None
    hang_waiting: list[int] | None = None

    def what(self) -> str:
        """ "output 3 at [1, 2]", or "the implementation hangs (device 0 waits)" """
        if self.hang is not None:
            return f"the implementation hangs (device {self.device} waits)"
        return f"output {self.output} at {list(self.index)}"


@dataclass
class OutputResult:
    index: int
    verdict: str
    layout: str = "replicated"


@dataclass
class Stats:
    stages: int = 0  # proved cut-points (spec/impl value pairs)
    proved_by_normal_form: int = 0
    proved_by_z3: int = 0
    expansions: int = 0  # proofs that needed cut-points expanded
    # stage obligations proved by reusing the proof of one they are a renaming of
    # (tv_ir.prover.obligation_cache: repeated layers, devices doing the same work)
    cache_hits: int = 0
    # stages proved against the spec value a stage of the same form was, renamed
    # (tv_ir.prover.repeated_stages: repeated layers and micro-batches), not looked for
    repeated_stages: int = 0
    # element-wise and dot stages cut as the spec op they mirror, on the same terms at one
    # box, without computing their terms (tv_ir.prover.mirrored_ops)
    mirrored_stages: int = 0
    # loops proved by induction: each body proved once (tv_ir.prover.loop_induction)
    loops_by_induction: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class Report:
    verdict: str
    outputs: list[OutputResult] = field(default_factory=list)
    counterexample: Counterexample | None = None
    location: Location | None = None
    stats: Stats = field(default_factory=Stats)
    unsupported: list[str] = field(default_factory=list)
    reason: str = ""  # why the verdict is unknown, in one line
    notes: list[str] = field(default_factory=list)
    spec_name: str = "spec"
    impl_name: str = "impl"
    # shape reduction: which dimension classes shrank, from what to what, and which were
    # kept at their real sizes and why (None when the pair was checked as given)
    reduction: dict | None = None
    # mesh reduction: the mesh axes that shrank (real -> reduced sizes), those kept and why
    # (None when the program was checked on its own mesh)
    mesh_reduction: dict | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def ok(self) -> bool:
        return self.verdict == EQUIVALENT

    def raise_if_failed(self) -> Report:
        if self.verdict != EQUIVALENT:
            raise AssertionError(str(self))
        return self

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.counterexample is not None:
            ce = d["counterexample"]
            ce["inputs"] = {k: _jsonable(v) for k, v in self.counterexample.inputs.items()}
            ce["index"] = list(self.counterexample.index)
        d["semantics"] = SEMANTICS_NOTE
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=_jsonable)

    def __str__(self) -> str:
        return render(self)


def _jsonable(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (np.floating, np.integer, np.bool_)):
        return v.item()
    return str(v)
