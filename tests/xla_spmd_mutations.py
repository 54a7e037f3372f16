"""Planted partitioning bugs in XLA's per-device HLO text, one kind at a time.

Each kind edits one instruction of a per-device program as XLA's partitioner could get it
wrong: a collective dropped, the wrong replica groups, collective-permute pairs reversed,
a slice or offset table shifted, the wrong reduction in a collective, the operands of a
non-commutative op swapped. Sites that would give the same program by construction are
skipped: dead instructions, all-reduces over groups of one, a pair set that is its own
reverse, an offset table whose entries are all equal, swapped operands that are one value,
a group order changed under a commutative reduction. A mutant can still compute the same
values for other reasons (bench/xla_spmd_mutants.py replays every proved one on XLA).
Used by bench/xla_spmd_mutants.py and tests/test_xla_spmd_corpus.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

KINDS = (
    "dropped collective",
    "wrong groups",
    "permuted pairs",
    "shifted slice",
    "shifted offsets",
    "wrong reduction",
    "swapped operands",
)

_INSTR = re.compile(
    r"^(?P<lead>\s*(?:ROOT\s+)?)(?P<name>%[\w.\-]+)\s*=\s*(?P<type>\([^=]*?\)|[\w\[\]{},:\d]+)\s+"
    r"(?P<op>[\w\-]+)\((?P<args>[^()]*(?:\([^()]*\)[^()]*)*)\)(?P<rest>.*)$"
)
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?(?P<name>%[\w.\-]+)\s*\(.*\{\s*$")
_DIMS = re.compile(r"^\w+\[(?P<dims>[\d,]*)\]")
_NAME = re.compile(r"%[\w.\-]+")


@dataclass
class Instr:
    line: int  # index into the text's lines
    lead: str
    name: str
    type: str
    op: str
    args: str
    rest: str
    computation: str

    @property
    def operands(self) -> list[str]:
        return _NAME.findall(self.args)

    def text(self, op: str | None = None, args: str | None = None, rest: str | None = None):
        return (
            f"{self.lead}{self.name} = {self.type} {op or self.op}"
            f"({self.args if args is None else args}){self.rest if rest is None else rest}"
        )


@dataclass
class Mutant:
    kind: str
    site: str  # the instruction changed and how
    text: str


class Program:
    """The instructions of an HLO text, by computation, with what the roots use."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.instrs: list[Instr] = []
        self.computations: dict[str, list[Instr]] = {}
        self.entry = None
        current = None
        for k, line in enumerate(self.lines):
            c = _COMPUTATION.match(line)
            if c and not line.startswith(" "):
                current = c.group("name")
                self.computations[current] = []
                if line.startswith("ENTRY"):
                    self.entry = current
                continue
            m = _INSTR.match(line)
            if m and current is not None:
                i = Instr(k, computation=current, **m.groupdict())
                self.instrs.append(i)
                self.computations[current].append(i)
        self.by_name = {(i.computation, i.name): i for i in self.instrs}
        self.live = self._live()

    def _live(self) -> set[tuple[str, str]]:
        """(computation, name) of every instruction some live root depends on."""
        live: set[tuple[str, str]] = set()
        todo = [self.entry]
        seen = set()
        while todo:
            comp = todo.pop()
            if comp in seen or comp not in self.computations:
                continue
            seen.add(comp)
            instrs = self.computations[comp]
            roots = [i for i in instrs if "ROOT" in i.lead] or instrs[-1:]
            stack = [r.name for r in roots]
            while stack:
                name = stack.pop()
                i = self.by_name.get((comp, name))
                if i is None or (comp, name) in live:
                    continue
                live.add((comp, name))
                stack += i.operands
                todo += [n for n in _NAME.findall(i.rest) if n in self.computations]
        return live

    def is_live(self, i: Instr) -> bool:
        return (i.computation, i.name) in self.live

    def dims(self, name: str, computation: str) -> list[int] | None:
        i = self.by_name.get((computation, name))
        m = _DIMS.match(i.type) if i else None
        if not m:
            return None
        return [int(d) for d in m.group("dims").split(",") if d]

    def with_line(self, i: Instr, new: str) -> str:
        lines = list(self.lines)
        lines[i.line] = new
        return "\n".join(lines) + "\n"


def mutants(text: str, kinds=KINDS, per_kind: int = 1) -> list[Mutant]:
    """Up to `per_kind` mutants of each kind (the first live sites in program order)."""
    p = Program(text)
    out = []
    for kind in kinds:
        made = 0
        for m in _SITES[kind](p):
            if made >= per_kind:
                break
            if m.text != text:
                out.append(m)
                made += 1
    return out


# ---- collectives -----------------------------------------------------------------------

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def groups_of(rest: str) -> list[list[int]] | None:
    """replica_groups as lists of device ids (explicit `{{..}}` or iota `[g,s]<=[..]T(..)`)."""
    m = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", rest)
    if m:
        return [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}", m[1])]
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", rest)
    if m:
        dims = [int(x) for x in m[3].split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if m[4]:
            ids = ids.transpose([int(x) for x in m[4].split(",")])
        return ids.reshape(int(m[1]), int(m[2])).tolist()
    return None


def _with_groups(rest: str, groups: list[list[int]]) -> str:
    text = "replica_groups={" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"
    return re.sub(
        r"replica_groups=(\{(?:\{[\d,]*\},?)*\}|\[[^ ]*?\]<=\[[\d,]+\](?:T\([\d,]+\))?)",
        text,
        rest,
        count=1,
    )


def _live_collectives(p: Program, ops=COLLECTIVES):
    for i in p.instrs:
        if i.op in ops and p.is_live(i) and not i.type.startswith("("):
            yield i


def _trivial_groups(i: Instr) -> bool:
    g = groups_of(i.rest)
    return g is not None and all(len(x) <= 1 for x in g)


def _dropped(p: Program):
    """A collective whose result has its operand's shape becomes a copy of its operand."""
    for i in _live_collectives(p, ("all-reduce", "collective-permute", "all-to-all")):
        if len(i.operands) != 1 or _trivial_groups(i):
            continue
        meta = re.search(r", metadata=\{.*\}$", i.rest)
        yield Mutant(
            "dropped collective",
            f"{i.name} ({i.op}) -> copy",
            p.with_line(i, i.text(op="copy", rest=meta[0] if meta else "")),
        )


def _regrouped(p: Program):
    """Other groups of the same sizes: an element swapped between two groups; a single
    group rotated (all-gather, all-to-all, reduce-scatter: their concatenation order) or,
    under an all-reduce (whose order does not matter), split in two."""
    for i in _live_collectives(p, ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")):
        g = groups_of(i.rest)
        if not g or all(len(x) <= 1 for x in g):
            continue
        big = [k for k, x in enumerate(g) if len(x) >= 2]
        if len(g) >= 2 and len(big) >= 1:
            a = big[0]
            b = next(k for k in range(len(g)) if k != a)
            new = [list(x) for x in g]
            new[a][-1], new[b][0] = g[b][0], g[a][-1]
        elif i.op == "all-reduce":
            x = g[0]
            new = [x[: len(x) // 2], x[len(x) // 2 :]]
        else:
            new = [g[0][1:] + g[0][:1]]
        yield Mutant(
            "wrong groups",
            f"{i.name} ({i.op}) groups {g} -> {new}",
            p.with_line(i, i.text(rest=_with_groups(i.rest, new))),
        )


def _reversed_pairs(p: Program):
    """collective-permute pairs reversed (source and target swapped), unless the set of
    pairs is its own reverse."""
    for i in _live_collectives(p, ("collective-permute",)):
        m = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", i.rest)
        if not m:
            continue
        pairs = [tuple(map(int, x)) for x in re.findall(r"\{(\d+),(\d+)\}", m[1])]
        rev = [(t, s) for s, t in pairs]
        if set(rev) == set(pairs):
            continue
        text = "source_target_pairs={" + ",".join(f"{{{s},{t}}}" for s, t in rev) + "}"
        rest = i.rest[: m.start()] + text + i.rest[m.end() :]
        yield Mutant(
            "permuted pairs", f"{i.name} pairs reversed", p.with_line(i, i.text(rest=rest))
        )


def _wrong_reduction(p: Program):
    """The reduction a collective applies changed (add->maximum, maximum<->minimum,
    multiply->add, and<->or) in its own computation."""
    swap = {
        "add": "maximum",
        "maximum": "minimum",
        "minimum": "maximum",
        "multiply": "add",
        "and": "or",
        "or": "and",
    }
    for i in _live_collectives(p, ("all-reduce", "reduce-scatter")):
        if _trivial_groups(i):
            continue
        m = re.search(r"to_apply=(%[\w.\-]+)", i.rest)
        body = p.computations.get(m[1]) if m else None
        root = next((r for r in body or [] if "ROOT" in r.lead), None)
        if root is None or root.op not in swap:
            continue
        yield Mutant(
            "wrong reduction",
            f"{i.name} ({i.op}) {root.op} -> {swap[root.op]}",
            p.with_line(root, root.text(op=swap[root.op])),
        )


# ---- slices and offsets ----------------------------------------------------------------


def _shifted_slice(p: Program):
    """A static slice moved by one along a dimension it does not take whole."""
    for i in p.instrs:
        if i.op != "slice" or not p.is_live(i) or len(i.operands) != 1:
            continue
        dims = p.dims(i.operands[0], i.computation)
        m = re.search(r"slice=\{([^}]*)\}", i.rest)
        if dims is None or not m:
            continue
        bounds = re.findall(r"\[(\d+):(\d+)(?::(\d+))?\]", m[1])
        for d, (lo, hi, stride) in enumerate(bounds):
            lo, hi = int(lo), int(hi)
            if stride not in ("", "1") or hi - lo == dims[d]:
                continue
            step = 1 if hi < dims[d] else -1
            new = [list(b) for b in bounds]
            new[d][0], new[d][1] = str(lo + step), str(hi + step)
            text = ", ".join(f"[{a}:{b}{':' + s if s else ''}]" for a, b, s in new)
            rest = i.rest[: m.start(1)] + text + i.rest[m.end(1) :]
            yield Mutant(
                "shifted slice", f"{i.name} dim {d} by {step:+d}", p.with_line(i, i.text(rest=rest))
            )
            break


def _shifted_offsets(p: Program):
    """An s32/u32 table with one entry per device (the offsets XLA reads by partition-id)
    rotated by one, unless its entries are all equal."""
    n = _num_partitions(p)
    for i in p.instrs:
        if i.op != "constant" or not p.is_live(i):
            continue
        if not re.match(rf"[su]32\[{n}\]", i.type):
            continue
        values = [v.strip() for v in i.args.strip("{}").split(",")]
        if len(values) != n or len(set(values)) == 1:
            continue
        rotated = values[1:] + values[:1]
        yield Mutant(
            "shifted offsets",
            f"{i.name} {values} -> {rotated}",
            p.with_line(i, i.text(args="{" + ", ".join(rotated) + "}")),
        )


def _num_partitions(p: Program) -> int:
    for line in p.lines[:3]:
        m = re.search(r"num_partitions=(\d+)", line)
        if m:
            return int(m[1])
    return 0


# ---- operands --------------------------------------------------------------------------

NON_COMMUTATIVE = ("subtract", "divide", "power", "remainder", "atan2")


def _swapped(p: Program):
    """The two operands of a non-commutative op exchanged (subtract, divide, power,
    remainder, atan2, an ordered compare, select's two cases, a concatenate's first two
    pieces), when they are two values;
    float data first, then index arithmetic."""
    sites = []
    for i in p.instrs:
        if not p.is_live(i):
            continue
        ops = i.operands
        if i.op in NON_COMMUTATIVE or (
            i.op == "compare" and re.search(r"direction=(LT|LE|GT|GE)", i.rest)
        ):
            if len(ops) == 2 and ops[0] != ops[1]:
                sites.append((i, [ops[1], ops[0]]))
        elif i.op == "select" and len(ops) == 3 and ops[1] != ops[2]:
            sites.append((i, [ops[0], ops[2], ops[1]]))
        elif i.op == "concatenate" and len(ops) >= 2 and ops[0] != ops[1]:
            sites.append((i, [ops[1], ops[0], *ops[2:]]))
    sites.sort(key=lambda s: not re.match(r"(f|bf)\d", s[0].type))
    for i, ops in sites:
        yield Mutant(
            "swapped operands",
            f"{i.name} ({i.op}) operands swapped",
            p.with_line(i, i.text(args=", ".join(ops))),
        )


_SITES = {
    "dropped collective": _dropped,
    "wrong groups": _regrouped,
    "permuted pairs": _reversed_pairs,
    "shifted slice": _shifted_slice,
    "shifted offsets": _shifted_offsets,
    "wrong reduction": _wrong_reduction,
    "swapped operands": _swapped,
}
