"""Read openxla/shardy's executable tests (../shared/corpus/shardy) as tv checks, in place.

Each bundle's `part1.mlir` holds sharded functions; the reference for each is, as in the
upstream run scripts: its `@sequential_*` twin (in part1 or part2), else its own global
meaning (shardings dropped; `tv` reads Shardy's global-view ops as such), and for the
gather/scatter batching rewrite the untransformed function. A `@sequential_*` function that
takes more arguments than its sharded twin (e.g. the pad value) is called with the constants
part2 passes for them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("TV_SHARDY_CORPUS", ROOT.parent / "shared" / "corpus" / "shardy"))

PIPELINE_OF_FOLDER = {
    "executable_partitioner_pipeline": "partitioner",
    "executable_convert_global_to_local": "global-to-local",
    "executable_explicit_gather_scatter_batching": "gather-scatter-batching",
}


@dataclass(frozen=True)
class Case:
    path: Path
    function: str  # the sharded function in part1
    pipeline: str
    halo_exchange: bool
    part1: str
    spec: str | None  # module text holding the reference; None: the function's own meaning
    spec_function: str | None

    @property
    def id(self) -> str:
        halo = "" if self.pipeline != "partitioner" else ("-halo" if self.halo_exchange else "")
        return f"{self.path.stem}@{self.function}{halo}"


def split_bundle(text: str) -> tuple[str, str]:
    """(part1, part2) of a split-file bundle."""
    p1 = text.split("//--- part1.mlir", 1)[1]
    p1, _, p2 = p1.partition("//--- part2.mlir")
    return p1, p2


def _functions(text: str) -> list[str]:
    return re.findall(r"^\s*func\.func @(\w+)\(", text, re.M)


def _function_text(text: str, name: str) -> str:
    m = re.search(rf"^func\.func @{name}\(.*?^\}}", text, re.M | re.S)
    if m is None:
        raise ValueError(f"no function @{name}")
    return m.group(0)


def _halo_options(text: str) -> list[bool]:
    runs = [ln for ln in text.splitlines() if ln.startswith("// RUN: %S/run_sdy")]
    out = []
    for ln in runs:
        halo = not ("halo_exchange=false" in ln or ln.rstrip().endswith('"false"'))
        if halo not in out:
            out.append(halo)
    return out or [True]


def _spec(part1: str, part2: str, fn: str) -> tuple[str | None, str | None]:
    if fn.startswith("transformed_"):
        return None, None
    if not fn.startswith("parallel_"):
        return None, None
    seq = "sequential_" + fn[len("parallel_") :]
    if seq in _functions(part1):
        text = _function_text(part1, seq)
    elif seq in _functions(part2):
        text = _function_text(part2, seq)
    else:
        return None, None
    return _bind_extra_arguments(text, part1, part2, fn, seq)


def _bind_extra_arguments(seq_text: str, part1: str, part2: str, fn: str, seq: str):
    """Wrap `seq` so it takes `fn`'s arguments, passing part2's constants for the rest."""
    n_par = _arity(_function_text(part1, fn))
    if _arity(seq_text) == n_par:
        return seq_text, seq
    call = re.search(rf"func\.call @{seq}\(([^)]*)\)\s*:\s*\((.*?)\)\s*->\s*(.+)$", part2, re.M)
    if call is None:
        raise ValueError(f"{seq} takes extra arguments and part2 never calls it")
    operands = [x.strip() for x in call.group(1).split(",")]
    types = re.findall(r"tensor<[^>]*>", call.group(2))
    result = call.group(3).strip()
    consts = []
    for name in operands[n_par:]:
        line = re.search(rf"^\s*{re.escape(name)} = stablehlo\.constant .*$", part2, re.M)
        if line is None:
            raise ValueError(f"{seq}: extra argument {name} is not a constant in part2")
        consts.append(line.group(0).strip())
    params = ", ".join(f"{operands[i]}: {types[i]}" for i in range(n_par))
    body = "\n  ".join(consts)
    wrapper = (
        f"func.func @reference({params}) -> {result} {{\n  {body}\n"
        f"  %r = func.call @{seq}({', '.join(operands)}) : ({', '.join(types)}) -> {result}\n"
        f"  return %r : {result}\n}}"
    )
    return seq_text + "\n" + wrapper, "reference"


def _arity(fn_text: str) -> int:
    """Number of arguments: `%name:` before the function's `->`."""
    return len(re.findall(r"%\w+\s*:", fn_text.split("->", 1)[0]))


def cases() -> list[Case]:
    """Every sharded function of every bundle, once per halo-exchange setting upstream runs."""
    out = []
    if not CORPUS.is_dir():
        return out
    for folder, pipeline in PIPELINE_OF_FOLDER.items():
        for path in sorted((CORPUS / folder).glob("*.mlir")):
            text = path.read_text()
            part1, part2 = split_bundle(text)
            for fn in _functions(part1):
                if fn.startswith("sequential_"):
                    continue
                spec, spec_fn = _spec(part1, part2, fn)
                halos = _halo_options(text) if pipeline == "partitioner" else [True]
                for halo in halos:
                    out.append(Case(path, fn, pipeline, halo, part1, spec, spec_fn))
    return out
