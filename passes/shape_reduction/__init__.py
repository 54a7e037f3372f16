"""shape-reduction: prove a spec/impl pair at small shapes instead of their real ones.

Both programs' dimensions are grouped into classes that must scale together (`classes`,
`rules`: every op's shape rule, tied across the spec/impl boundary by the layouts), each
class gets the largest factor its members allow (`factors`), and both programs are rebuilt
with every dimension divided by its class's factor (`rewrite`). Classes that an op needs at
their real size (a window, a gather by data, a constant tensor) are kept, with the reason.
Why a verdict at the reduced shapes holds at the real ones: docs/equivalence.md, "Shape
reduction".
"""

from __future__ import annotations

import itertools
import os
import sys
from dataclasses import dataclass, field, replace

import numpy as np

from tv_ir.ir.program import Module, TensorType, elements, walk
from tv_ir.semantics.ops.shape import TABLE_ATTR
from tv_ir.semantics.scale_symbols import SCALE_KEY, parse_scale_key, scale_key

from .affine import choose_affine
from .aggregation import aggregated
from .classes import DimClasses
from .device_shares import device_shares
from .factors import (
    MergedDims,
    can_shrink,
    choose,
    grown,
    separating_groups,
    smallest_prime,
    witnesses,
)
from .rewrite import Rewriter, inconsistent, scaled_layout
from .rules import Normaliser, ShapeRules, narrow_positions

name = "shape-reduction"


@dataclass(frozen=True)
class DimClass:
    """One class: where it first appears, its real and reduced sizes (of that member), and
    why it was kept at its real size (None when it could shrink)."""

    name: str
    real: int
    reduced: int
    kept: str | None = None
    # an affine class (affine.py): its unit at the real and the reduced size (and a second
    # unit's, for a class of two units)
    unit: tuple[int, ...] | None = None

    def __str__(self) -> str:
        if self.kept:
            return f"{self.name}: {self.real} kept ({self.kept})"
        if self.unit:
            units = " and ".join(
                f"{self.unit[i]} -> {self.unit[i + 1]}" for i in range(0, len(self.unit), 2)
            )
            return f"{self.name}: {self.real} -> {self.reduced} (units of {units})"
        return f"{self.name}: {self.real} -> {self.reduced}"


@dataclass
class Reduction:
    """What shape reduction did to a pair: classes, and the reduced programs."""

    classes: list[DimClass] = field(default_factory=list)
    spec: Module | None = None
    impl: Module | None = None
    placement: object = None
    real_elements: int = 0
    reduced_elements: int = 0
    # elements of the real-size pair a confirmation runs, when not the pair reduced here
    # (the real sizes on a reduced mesh: the pipeline sets it); see `replay_elements`
    run_elements: int | None = None
    # the pair again with one class larger, to check concretely before trusting a proof
    witnesses: list = field(default_factory=list)
    failed: str | None = None  # why the pair could not be reduced after all
    tables: int = 0  # constant tables that shrank and stand for any values
    # scales that stand for any positive number instead of keeping the classes whose size
    # they may be: "the constant 16 at LOC" -> those classes' names
    scales: dict[str, list[str]] = field(default_factory=dict)
    symbol_uses: int = 0  # the uses of those scales that read a symbol
    # layer loops (layer_stacks.py): (where, real trip count, reduced trip count)
    layer_loops: list[tuple[str, int, int]] = field(default_factory=list)
    # when a layer loop shrank: the pair at its real sizes with only the layer counts
    # reduced (what is proved), and with other classes reduced, the layer counts at their
    # real values and a prime times the reduced ones (what that proof is checked against)
    fewer_layers: Witness | None = None
    # why the shrunk layer loops' layers are not one function repeated (a layer singled out,
    # layer_stacks.LayerLoop.singled_out): a proof at fewer layers is then not used
    singled_out: list[str] = field(default_factory=list)
    layer_witnesses: list[Witness] = field(default_factory=list)
    # the pair again with one shrunk class at its real size (the others reduced), one per
    # class: a refutation whose real programs are too large to run must hold there too
    real_class_witnesses: list[Witness] = field(default_factory=list)

    @property
    def reduced(self) -> bool:
        return self.spec is not None

    @property
    def replay_elements(self) -> int:
        """Elements of the real-size pair that confirmations and replays run (both programs):
        the real pair, or the real sizes on a reduced mesh (`run_elements`)."""
        return self.real_elements if self.run_elements is None else self.run_elements

    @property
    def generalised(self) -> bool:
        """Constants stand for any values (tables, scales): a verdict other than `equivalent`
        is checked again without (`reduce_pair(..., tables=False)`)."""
        return bool(self.tables or self.scales or self.symbol_uses)

    def standing(self) -> str:
        """What stood for any values: "constant tables", "scales" or both."""
        scales = bool(self.scales or self.symbol_uses)
        both = self.tables and scales
        return "constant tables and scales" if both else "scales" if scales else "constant tables"

    def summary(self) -> str:
        shrunk = [c for c in self.classes if c.reduced < c.real]
        kept = [c for c in self.classes if c.kept and c.real > 1]
        head = (
            f"shape reduction: {len(shrunk)} dimension classes reduced "
            f"({self.real_elements:,} -> {self.reduced_elements:,} elements over all values)"
        )
        if not shrunk:
            head = (
                f"shape reduction: no dimension class reduced ({self.real_elements:,} elements "
                "over all values, checked at the real sizes)"
            )
        lines = [head] + ["  " + str(c) for c in shrunk[:12]]
        if len(shrunk) > 12:
            lines.append(f"  ... {len(shrunk) - 12} more")
        if self.tables:
            lines.append(f"  {self.tables} constant tables shrank: proved for any values they hold")
        for what, names in list(self.scales.items())[:6]:
            more = f" and {len(names) - 2} more" if len(names) > 2 else ""
            lines.append(
                f"  {what} may be the size of {', '.join(names[:2])}{more}: proved for any "
                "positive value"
            )
        lines += ["  " + str(c) for c in kept[:6]]
        if len(kept) > 6:
            lines.append(f"  ... {len(kept) - 6} more kept")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "reduced": self.reduced,
            "failed": self.failed,
            "summary": self.summary(),
            "real_elements": self.real_elements,
            "reduced_elements": self.reduced_elements,
            "tables": self.tables,
            "scales": self.scales,
            "layer_loops": [{"loop": w, "real": n, "reduced": k} for w, n, k in self.layer_loops],
            "classes": [
                {"name": c.name, "real": c.real, "reduced": c.reduced, "kept": c.kept}
                | ({"unit": list(c.unit)} if c.unit else {})
                for c in self.classes
                if c.real > 1
            ],
        }


@dataclass
class Witness:
    """The reduced pair with class `name` at `larger` positions instead of `reduced`
    (`build()` gives (spec, impl, placement)); or, with `members` (those classes' own
    witnesses), with several classes larger at once."""

    name: str
    reduced: int
    larger: int
    build: object
    members: list = field(default_factory=list)

    def describe(self) -> str:
        """Which classes are larger, and how much."""
        if self.members:
            return ", ".join(w.describe() for w in self.members)
        return f"{self.name} at {self.larger} positions instead of {self.reduced}"


class Inconsistent(Exception):
    """A reduced program whose shapes an op's meaning forbids (a bug in a shape rule)."""


class _Builder:
    """The pair rebuilt at given class factors and affine units (normalisers read at the
    counts they give)."""

    def __init__(self, d, spec, impl, placement, spec_rules, impl_rules, accepted, affine, symbols):
        self.d, self.spec, self.impl, self.placement = d, spec, impl, placement
        self.spec_rules, self.impl_rules, self.accepted = spec_rules, impl_rules, accepted
        self.affine, self.symbols = affine, symbols

    def __call__(self, factor: dict, affine: dict | None = None, symbols: bool = True):
        """The pair at `factor` and `affine`; with `symbols`, the ambiguous scales stand for
        symbols (off: the pair at fewer layers, checked on its own afterwards)."""
        d = self.d
        affine = self.affine if affine is None else affine
        normalised = {}
        for n, power, value in self.accepted:
            real = reduced = 1
            for k in n.keys:
                real *= d.real[k]
                reduced *= _reduced_size(d, factor, affine, k, d.real[k])
            if reduced < real:  # value is the real count N (power 1) or 1 / N
                normalised[(id(n.op), n.operand)] = (
                    value * real / reduced if power < 0 else value * reduced / real
                )
        sp, ip = self.spec_rules.pos, self.impl_rules.pos
        scales = self.symbols if symbols else {}
        spec = Rewriter(
            d, factor, sp.rescales, 1, normalised, sp.splats, sp.tables, affine, scales
        ).module(self.spec)
        impl = Rewriter(
            d,
            factor,
            ip.rescales,
            self.placement.num_partitions,
            normalised,
            ip.splats,
            ip.tables,
            affine,
            scales,
        ).module(self.impl)
        for m in (spec, impl):
            bad = inconsistent(m)
            if bad is not None:
                raise Inconsistent(bad)
        return spec, impl, _scaled_placement(d, factor, affine, self.spec, self.placement)


def _reduced_size(d: DimClasses, factor: dict, affine: dict, key, n: int) -> int:
    """n (a size or offset of key's class) at the reduced size."""
    root = d.find(key)
    if root in affine:
        return affine[root].at(n)
    return n // factor.get(root, 1)


def reduce_pair(
    spec: Module, impl: Module, placement, tables: bool = True, layers_only: bool = False
) -> Reduction:
    """The pair at reduced shapes (`Reduction.reduced` False when nothing could shrink).
    `tables`: finite float tables may shrink, standing for any values (see rule_constant);
    a verdict other than `equivalent` with them is checked again with `tables=False`.
    `layers_only`: only the layer loops' pairs (`fewer_layers`, `layer_witnesses`, built
    when asked for), not the pair with every class reduced, which the caller does not use
    (it reduces the pair at fewer layers on its own)."""
    d = DimClasses()
    spec_rules = ShapeRules(d, spec, "spec", 1, 1, tables)
    spec_rules.run(spec.main)
    impl_rules = ShapeRules(
        d, impl, "impl", placement.num_partitions, placement.num_replicas, tables
    )
    impl_rules.run(impl.main)
    for what, svals, ivals, layouts in (
        ("argument", spec.main.args, impl.main.args, placement.args),
        ("result", spec.main.body.results, impl.main.body.results, placement.results),
    ):
        for k, (s, i, lay) in enumerate(zip(svals, ivals, layouts, strict=True)):
            _tie_by_layout(d, s, i, lay, f"{what} {k}")
    _same_factorisation(d)
    _arity(d)
    _digits(d)
    rules = (spec_rules, impl_rules)
    narrow_positions(d, rules)
    accepted, scales = _normalisers(d, rules, tables)
    factor = choose(d)
    if scales and not _symbols_pay(d, factor, scales, (spec, impl)):
        for _, roots, why in scales.values():  # the classes kept, as without `tables`
            for root in roots:
                d.keep(root, f"{why} may be its size")
        scales = {}
        factor = choose(d)
    from .layer_stacks import layer_units, trip_key

    loops = [loop for r in rules for loop in r.pos.layer_loops]
    trips = {d.find(trip_key(loop)) for loop in loops}
    by_factor = dict(factor)
    affine = choose_affine(d, factor, trips)
    affine.update(layer_units(d, factor, loops))
    # a scale stands for a symbol only where a class it would have kept shrinks
    shrunk = {root for root, f in factor.items() if f > 1} | set(affine)
    symbols = {use: key for use, (key, roots, _) in scales.items() if roots & shrunk}
    build = _Builder(d, spec, impl, placement, spec_rules, impl_rules, accepted, affine, symbols)
    if os.environ.get("TV_REDUCTION_DEBUG"):
        _debug(d, factor)
    splats = set(spec_rules.pos.splats) | set(impl_rules.pos.splats)
    only_splats = {
        root for root, members in d.classes().items() if all(k[0] in splats for k in members)
    }
    real = elements(spec) + elements(impl)
    red = Reduction([], real_elements=real, reduced_elements=real)
    affine_roots = set(affine) - only_splats
    if affine_roots:
        try:  # the affine classes' reduced shapes, checked on their own first
            build({}, affine)
        except Inconsistent as e:  # a factor it replaced comes back; else kept, said why
            for root in affine:
                factor[root] = by_factor.get(root, 1)
                if factor[root] == 1:
                    d.keep(root, f"its affine reduction gave inconsistent shapes at {e}")
            affine.clear()
            affine_roots = set()
    red.classes = _describe(d, factor, affine, only_splats)
    if not affine_roots and all(k == 1 for root, k in factor.items() if root not in only_splats):
        return red
    if layers_only:
        _layer_loops(red, d, factor, affine, build, rules)
        return red
    try:
        red.spec, red.impl, red.placement = build(factor)
    except Inconsistent as e:  # a shape rule tv got wrong: check at the real sizes
        red.classes = []
        red.failed = f"shape reduction gave inconsistent shapes at {e}; checked at real sizes"
        return red
    red.witnesses = _grouped(d, factor, build, only_splats)
    red.witnesses += [
        Witness(
            d.names.get(root, "?"),
            aff.at(d.real[root]),
            grown.at(d.real[root]),
            lambda root=root, grown=grown: build(factor, {**affine, root: grown}),
        )
        for root, aff in affine.items()
        if root not in only_splats
        for grown in aff.witnesses()
    ]
    red.real_class_witnesses = _at_real_sizes(d, factor, affine, build, only_splats)
    red.reduced_elements = elements(red.spec) + elements(red.impl)
    _layer_loops(red, d, factor, affine, build, rules)
    if red.reduced_elements > real:  # a bug of this pass: said, and the real sizes checked
        red.failed = (
            f"shape reduction made the programs larger ({real:,} -> {red.reduced_elements:,} "
            "elements, a bug in tv); checked at real sizes"
        )
        red.spec = red.impl = red.placement = None
        red.witnesses, red.reduced_elements = [], real
        return red
    red.tables = sum(
        1
        for m in (red.spec, red.impl)
        for op in walk(m.main.body)
        if op.name == "stablehlo.constant"
        and TABLE_ATTR in op.attrs
        and not op.attrs[TABLE_ATTR].startswith(SCALE_KEY)
    )
    shrunk = {root for root, f in factor.items() if f > 1} | set(affine)
    red.symbol_uses = len(symbols)
    for _, roots, why in scales.values():
        if roots & shrunk:
            names = {d.names.get(root, "?") for root in roots}
            red.scales[why] = sorted(names | set(red.scales.get(why, ())))
    return red


def _grouped(d: DimClasses, factor: dict, build, only_splats: set) -> list[Witness]:
    """The witnesses: the shrunk classes grown in `separating_groups` (a few pairs instead
    of one per class, each class still one step larger in one of them, and every two
    classes apart in one); a group whose merged dimensions would disagree is checked class
    by class. `WITNESS_GROUPS` off: one witness per class."""
    singles = [
        (
            root,
            Witness(
                d.names.get(root, "?"),
                d.real[root] // factor[root],
                d.real[root] // f[root],
                lambda f=f: build(f),
            ),
        )
        for root, f in witnesses(d, factor)
        if root not in only_splats
    ]
    if not WITNESS_GROUPS:
        return [w for _, w in singles]
    out: list[Witness] = []
    for group in separating_groups(len(singles)):
        members = [singles[i] for i in group]
        f = grown(d, factor, [root for root, _ in members]) if len(members) > 1 else None
        if f is None:
            out += [w for _, w in members if all(w is not o for o in out)]
            continue
        ws = [w for _, w in members]
        out.append(Witness(f"{len(ws)} classes", 0, 0, lambda f=f: build(f), ws))
    return out


WITNESS_GROUPS = True


def _at_real_sizes(d: DimClasses, factor: dict, affine: dict, build, only_splats) -> list[Witness]:
    """Per shrunk class, the reduced pair with that class alone back at its real size (a
    class whose merged dimensions would then disagree has none)."""
    merged = MergedDims(d, factor)
    out = []
    for root in dict.fromkeys([r for r, f in factor.items() if f > 1] + list(affine)):
        if root in only_splats or root in merged.defs:
            continue
        f = merged.at_real([root])
        if f is None:
            continue
        rest = {k: a for k, a in affine.items() if k != root}
        reduced = _reduced_size(d, factor, affine, root, d.real[root])
        out.append(
            Witness(
                d.names.get(root, "?"),
                reduced,
                d.real[root],
                lambda f=f, rest=rest: build(f, rest),
            )
        )
    return out


def _layer_loops(red: Reduction, d: DimClasses, factor: dict, affine: dict, build, rules) -> None:
    """Record the layer loops and their reduced trip counts, and the witness that keeps every
    shrunk one at its real count (layer_stacks.py). A layer class shrinks by a factor, or
    in units of its layers per stage (`layer_stacks.layer_units`, in `affine`)."""
    from .layer_stacks import trip_key

    def at(root, n: int, f: dict, units: dict) -> int:
        return units[root].at(n) if root in units else n // f.get(root, 1)

    shrunk = set()
    first = None
    for r in rules:
        for loop in r.pos.layer_loops:
            root = d.find(trip_key(loop))
            k = at(root, loop.trips, factor, affine)
            red.layer_loops.append((f"loop at {loop.loop.loc}", loop.trips, k))
            if k < loop.trips:
                shrunk.add(root)
                first = first or (root, loop.trips)
                if loop.singled_out:
                    red.singled_out.append(loop.singled_out)
    if not shrunk:
        return
    loops = [(n, k) for _, n, k in red.layer_loops if k < n]
    name = f"the layer count ({len(loops)} loops)"
    only = {root: factor[root] for root in shrunk if root not in affine}
    units = {root: affine[root] for root in shrunk if root in affine}
    red.fewer_layers = Witness(name, loops[0][1], loops[0][0], lambda: build(only, units, False))
    at_real = {**factor, **dict.fromkeys(shrunk, 1)}
    others = {root: a for root, a in affine.items() if root not in shrunk}
    red.layer_witnesses = [Witness(name, loops[0][1], loops[0][0], lambda: build(at_real, others))]
    larger = {**factor}
    for root in only:
        larger[root] = factor[root] // smallest_prime(factor[root])
    grown = {**affine, **{root: a.grown() for root, a in units.items()}}
    root, n = first
    k = at(root, n, larger, grown)
    if k < n:
        red.layer_witnesses.append(Witness(name, loops[0][1], k, lambda: build(larger, grown)))


def _same_factorisation(d: DimClasses) -> None:
    """Merged dimensions of one class split the same way (heads x head_dim in the spec,
    local heads x head_dim on a device) shrink part by part alike: the parts after the first
    are tied when their real sizes agree, and the first parts then scale together too.
    Otherwise each program could shrink a different part, and the reduced programs would
    split their heads differently (a difference the real programs do not have)."""
    for _ in range(4):  # a tie may put two more wholes in one class
        by_whole: dict = {}
        for whole, parts in d.products:
            by_whole.setdefault(d.find(whole), []).append(parts)
        before = len({d.find(k) for k in d.parent})
        for splits in by_whole.values():
            first = splits[0]
            for parts in splits[1:]:
                if len(parts) != len(first):
                    continue
                if all(d.real[a] == d.real[b] for a, b in zip(first[1:], parts[1:], strict=True)):
                    for a, b in zip(first, parts, strict=True):
                        d.tie(a, b)
        if len({d.find(k) for k in d.parent}) == before:
            break


def _arity(d: DimClasses) -> None:
    """A value with m axes of one class combines m positions of that class in one term: each
    of those axes keeps at least m positions, so every pattern of equal and distinct
    positions a term can hold at the real size also occurs at the reduced size."""
    by_value: dict[int, list] = {}
    for key in d.parent:
        by_value.setdefault(key[0], []).append(key)
    for keys in by_value.values():
        if len(keys) < 2:
            continue
        groups: dict = {}
        for k in keys:
            if d.real[k] > 1:
                groups.setdefault(d.find(k), []).append(k)
        for members in groups.values():
            if len(members) > 1:
                for k in members:
                    d.at_least(k, len(members))


def _normalisers(d: DimClasses, rules, tables: bool) -> tuple[list, dict]:
    """Float constants that are the count of what they normalise (`sum / N`, `sum * (1/N)`,
    `g / N` spread over N positions), checked against the classes' real sizes: these are
    read at the reduced count. Any other float constant equal to the size (or its
    reciprocal) of a class that some op sums over or spreads along might be a count too:
    that class keeps its size (an ambiguous constant is never guessed). A class nothing
    aggregates has no count (aggregation.py). With `tables`, such a constant that scales a
    value (`x * c`, `x / c`) stands for any positive number instead (scale_symbols.py) and
    its classes may shrink. Returns the normalisers accepted and the scales that stand for
    symbols ((id(op), operand) -> (key, the classes it would have kept, "the constant c at
    LOC"))."""
    symbols: dict = {}
    holders: dict = {}  # a scale's symbol -> the programs holding it as such a scale
    sizes: dict = {}
    by_size: dict = {}
    fixed = set()  # classes whose factor is 1 whatever is decided below
    for root, members in d.classes().items():
        if not can_shrink(d, members):
            fixed.add(root)
        sizes[root] = {d.real[k] for k in members}
        for n in sizes[root]:
            if n >= 3:
                by_size.setdefault(n, []).append(root)

    accepted = []
    ambiguous: dict = {}  # (id(op), operand) -> (normaliser, constant, its readings)
    for r in rules:
        # a one-device program's constants count its own dimensions: the other program's
        # members (a device's shard of them) are no sizes it can mean
        counted = _own_sizes(d, r.module, sizes) if r.num_devices == 1 else sizes
        for n in r.pos.normalisers:
            c = r.pos.floats[n.constant]
            count = _through_chain(c, n, r.pos.floats)
            # what is summed here (a shard's count), or the whole dimension's count: any
            # member's size of each class summed over shrinks by that class's factor. A sum
            # may be normalised by some of what it sums only (`mean(sum(x, -1))`, the sum
            # of a loss over tokens and vocabulary divided by the tokens): each set of its
            # classes is a candidate, and they must all be read at one reduced count: the
            # classes that can shrink must be the same in all (a class whose factor is 1,
            # such as a micro-batch of 2 that a mean reduces, counts alike at every size)
            found = {}
            # a class of size 1 (a kept dimension of a keepdims sum) counts nothing
            real_keys = tuple(k for k in n.keys if max(counted[d.find(k)]) > 1)
            for keys in _key_subsets(real_keys):
                # a sum added over devices (all_reduce) adds more than a device's positions:
                # all of them at one device's sizes are not what it counts
                devices = n.devices if len(keys) == len(real_keys) else 1
                power = _normalises(count, keys, d, counted, devices)
                if power:
                    shrinking = frozenset(d.find(k) for k in keys) - fixed
                    found.setdefault((shrinking, power), (keys, power))
            if os.environ.get("TV_REDUCTION_DEBUG"):
                print(f"normaliser? {count} of {n.keys}: {list(found.values())}", file=sys.stderr)
            if len(found) == 1:
                keys, power = next(iter(found.values()))
                accepted.append((replace(n, keys=keys), power, c))
            elif found and not n.chain:  # decided once scales and device shares are known
                ambiguous[(id(n.op), n.operand)] = (n, c, found)
    absorbed = _longest_chains(accepted, ambiguous, d)
    # one constant normalising several uses (a spread splat) must shrink the same way in all
    by_operand: dict = {}
    for n, power, _ in accepted:
        classes = frozenset(d.find(k) for k in n.keys) - fixed
        by_operand.setdefault((id(n.op), n.operand), set()).add((classes, power))
    if os.environ.get("TV_REDUCTION_DEBUG"):
        for v in by_operand.values():
            if len(v) > 1:
                print(f"normaliser conflict: {v}", file=sys.stderr)
    accepted = [a for a in accepted if len(by_operand[(id(a[0].op), a[0].operand)]) == 1]
    explained = {(id(n.op), n.operand) for n, _, _ in accepted} | absorbed
    summed_or_spread = aggregated(d, [(r.module, r.pos.floats) for r in rules])
    for r in rules:
        # a device's share of a psum'd sum, 1/(devices x micro-batches): fixed at any size
        shares, seeded = device_shares(r.module, r.pos.float_uses, r.pos.floats, r.pos.known)
        for found in _elementwise_chains(r, d, sizes, shares, seeded, explained):
            accepted.append(found)
            explained.add((id(found[0].op), found[0].operand))
            explained.update((id(op), k) for op, k, _ in found[0].chain)
        for n, loc in r.pos.counts:  # a count computed from the size normalises anything
            for root in by_size.get(n, ()):
                d.keep(root, f"the count {n} computed at {loc} may be its size")
        for op, k, vid in r.pos.float_uses:
            if (id(op), k) in explained:
                continue
            c = r.pos.floats[vid]
            if (id(op), k) in shares:
                if os.environ.get("TV_REDUCTION_DEBUG"):
                    print(f"device share {c:g}: {op.name} at {op.loc}", file=sys.stderr)
                ambiguous.pop((id(op), k), None)
                continue
            if c == 0 or not np.isfinite(c):
                continue
            # a share's seed folded into this constant: the rest of it may still be a count
            rest = c / seeded.get(vid, 1.0)
            folded = _folded_normaliser(c, r, op, k, vid, d, sizes)
            # classes whose size c may be (a class nothing aggregates has no count:
            # aggregation.py)
            maybe = [
                root
                for n in {round(abs(rest)), round(1 / abs(rest))}
                if n >= 3 and _matches(rest, n)
                for root in by_size.get(n, ())
                if root in summed_or_spread
            ]
            if maybe and os.environ.get("TV_REDUCTION_DEBUG"):
                print(f"unexplained {c:g}: {op.name} operand {k} {op}", file=sys.stderr)
            if maybe and tables and folded is None and vid not in seeded and _scales(op, k, r):
                # a scale: it stands for any positive number, so what is proved holds for
                # its own value and for a count's at the reduced size alike (a proof that
                # needs its value fails, and the pair is checked again with `tables` off,
                # these classes kept)
                key = scale_key(c)
                readings = ambiguous.pop((id(op), k), (None, None, {}))[2]
                roots = frozenset(maybe).union(*(shrinking for shrinking, _ in readings))
                symbols[(id(op), k)] = (key, roots, f"the constant {c:g} at {op.loc}")
                holders.setdefault(parse_scale_key(key)[0], set()).add(r.side)
                maybe = []
            for root in maybe:
                d.keep(root, f"the constant {c:g} at {op.loc} may be its size")
            if isinstance(folded, tuple) and vid not in seeded:
                accepted.append(folded)
            elif isinstance(folded, tuple):  # a share is no count: ambiguous, kept
                folded = {d.find(key) for key in folded[0].keys}
            for root in folded if isinstance(folded, set) else ():
                d.keep(root, f"the constant {c:g} at {op.loc} may count its positions")
    taken = {(id(n.op), n.operand) for n, _, _ in accepted}
    for use, (n, c, found) in ambiguous.items():  # neither a scale nor a device share
        if use in taken or use in by_operand:  # read otherwise too: every class kept
            for shrinking, _ in found:
                for root in shrinking:
                    d.keep(root, f"the constant {c:g} at {n.op.loc} may count its positions")
            continue
        _ambiguous_count(d, n, c, found, accepted)
    # a scale one program alone holds (the implementation's 1/8 of a micro-batch's tokens
    # where the spec divides by 16) cannot be matched by the other's: its classes are kept
    if os.environ.get("TV_REDUCTION_DEBUG"):
        print(f"scales held by: {holders}", file=sys.stderr)
    for use, (key, roots, why) in list(symbols.items()):
        if len(holders[parse_scale_key(key)[0]]) < 2:
            del symbols[use]
            for root in roots:
                d.keep(root, f"{why} may be its size")
    return accepted, symbols


def _through_chain(c: float, n: Normaliser, floats: dict) -> float:
    """The count a chain of constants scaling one sum stands for (`sum / 8 / 4096`, `sum *
    2**-12 * 2**-12`), as the last constant's own would: a divisor's N, a factor's 1/N."""
    m = 1.0
    for op, _, vid in n.chain:
        f = floats[vid]
        if f == 0 or not np.isfinite(f):
            return 0.0  # `sum * 0 * 2`, `sum / inf`: no count (and no division by zero)
        m = m * f if op.name == "stablehlo.multiply" else m / f
    return c / m if n.op.name == "stablehlo.divide" else c * m


def _one_reading_per_use(accepted: list, d: DimClasses) -> None:
    """A constant after a sum of scaled values (`sum(y / 4096) / 8`) is read on its own and
    with the scales before the sum: the reading with them stands when it counts every class
    the one without does and more (8 the rows, 32768 the rows and the width: 4096 counts the
    width); otherwise the two disagree on what is counted, and neither stands (its classes
    keep their sizes, as for any constant read two ways)."""
    by_use: dict = {}
    for a in accepted:
        by_use.setdefault((id(a[0].op), a[0].operand), []).append(a)
    drop = set()
    for readings in by_use.values():
        if len({len(a[0].chain) for a in readings}) < 2:
            continue  # one reading (or copies of one: a spread splat's uses), as before
        readings.sort(key=lambda a: -len(a[0].chain))
        roots = [frozenset(d.find(k) for k in a[0].keys) for a in readings]
        if all(r < roots[0] for r in roots[1:]):
            drop.update(id(a) for a in readings[1:])
        else:
            drop.update(id(a) for a in readings)
    accepted[:] = [a for a in accepted if id(a) not in drop]


def _longest_chains(accepted: list, ambiguous: dict, d: DimClasses) -> set:
    """A sum scaled by several constants in a row (a global mean normalised in steps, `psum(s
    / rows / hidden) / devices`) is normalised by their product: the longest chain read as a
    count stands, its last constant is read at the reduced count, and the constants before it
    keep their values. The readings of those earlier constants on their own (and of shorter
    chains) are dropped from `accepted` and `ambiguous`. Returns the uses the chains took
    ((id(op), operand))."""
    absorbed: set = set()
    standing: set = set()  # the uses whose chains stand
    _one_reading_per_use(accepted, d)
    chains = sorted(
        (a for a in accepted if a[0].chain),
        key=lambda a: (-len(a[0].chain), -len({d.find(k) for k in a[0].keys})),
    )
    for n, _, _ in chains:
        use, uses = (id(n.op), n.operand), {(id(op), k) for op, k, _ in n.chain}
        counted = frozenset(d.find(k) for k in n.keys)
        if any(_counts_others(ambiguous.get(u), counted, d) for u in uses):
            # a constant before the last may count classes the chain does not (`mean /
            # micro`: 8 the micro-batch's tokens, or a vocabulary of 8; 16 the vocabulary
            # and the rows): the chain is one reading among several, not guessed (the
            # constant stays ambiguous). One that counts a part of the chain's classes
            # either way (16 the rows or the width, 256 both) does not stop it.
            continue
        if use not in absorbed and not uses & (absorbed | standing):
            absorbed |= uses
            standing.add(use)
    # a chain that does not stand is not read (its constants may be another's chain)
    accepted[:] = [
        a
        for a in accepted
        if (id(a[0].op), a[0].operand) not in absorbed
        and (not a[0].chain or (id(a[0].op), a[0].operand) in standing)
    ]
    for use in absorbed:
        ambiguous.pop(use, None)
    return absorbed


def _counts_others(entry, counted: frozenset, d: DimClasses) -> bool:
    """Does an ambiguous constant (`_normalisers`' `ambiguous` entry, or None) have a
    reading that counts a class outside `counted`?"""
    if entry is None:
        return False
    return any(frozenset(d.find(k) for k in keys) - counted for keys, _ in entry[2].values())


def _ambiguous_count(d: DimClasses, n, c: float, found: dict, accepted: list) -> None:
    """A constant that counts the positions of several sets of the classes it may normalise
    (the spec's tokens 16 x 24 = 384, or a vocabulary of 32 x a rank's 12 tokens: the classes
    are shared with the implementation, whose members have other sizes): a class in some
    readings and not in all keeps its size, and the constant is read by the classes every
    reading shares. With different powers (N in one reading, 1/N in another) every class of
    every reading keeps its size. Never guessed: before, such a constant shrank nothing and
    kept nothing, so the classes shrank while it stayed (a false refutation)."""
    readings = list(found.values())
    sets = [shrinking for shrinking, _ in found]
    powers = {power for _, power in found}
    why = f"the constant {c:g} at {n.op.loc} may count its positions"
    if len(powers) > 1:
        for root in frozenset().union(*sets):
            d.keep(root, why)
        return
    common = frozenset.intersection(*sets)
    for root in frozenset().union(*sets) - common:
        d.keep(root, why)
    keys, power = readings[0]
    accepted.append((replace(n, keys=keys), power, c))


# scales stand for symbols only where keeping their classes would leave the reduced
# programs at least SCALE_GAIN times larger and SCALE_MIN elements or more: a proof with
# symbols costs a concrete run first, terms that carry the symbol, and a second check where
# it fails; where the classes are small, keeping them costs less
SCALE_GAIN = 2
SCALE_MIN = 200_000


def _symbols_pay(d: DimClasses, factor: dict, symbols: dict, modules) -> bool:
    """Do the scales standing for symbols save enough (SCALE_GAIN, SCALE_MIN)?"""
    saved = dict(d.kept)
    for _, roots, why in symbols.values():
        for root in roots:
            d.keep(root, f"{why} may be its size")
    try:
        kept = choose(d)
    finally:
        d.kept = saved
    with_kept = _elements_at(d, kept, modules)
    return with_kept >= SCALE_MIN and with_kept >= SCALE_GAIN * _elements_at(d, factor, modules)


def _elements_at(d: DimClasses, factor: dict, modules) -> int:
    """The elements of every value of `modules` with each class divided by its factor."""
    total = 0
    for m in modules:
        fn = m.main  # what the rules read (as `elements` counts)
        for v in list(fn.args) + [r for op in walk(fn.body) for r in op.results]:
            if not isinstance(v.type, TensorType):
                continue
            n = 1
            for a, size in enumerate(v.type.shape):
                key = (v.id, a)
                n *= size // factor.get(d.find(key), 1) if key in d.parent else size
            total += n
    return total


def _scales(op, k: int, rules) -> bool:
    """Operand k of `op` is a float scale of a value: `x * c`, `c * x` or `x / c`, x no
    constant."""
    if op.name not in ("stablehlo.multiply", "stablehlo.divide") or len(op.operands) != 2:
        return False
    if op.name == "stablehlo.divide" and k != 1:
        return False
    other = op.operands[1 - k]
    t = op.results[0].type if op.results else None
    return other.id not in rules.pos.floats and isinstance(t, TensorType) and t.is_float


def _folded_normaliser(c: float, rules, op, k: int, vid: int, d: DimClasses, sizes: dict):
    """A constant scaling a value (`x * c`, `x / c`) that counts positions of two or more of
    the value's classes together: XLA folds the cotangent of a mean over a (batch, features)
    tile, `1 / N` spread over N positions, to one constant 1/(batch * features), which no
    single class's size is; the spec, traced by JAX, may still divide by N. Counted by one
    set of classes: a normaliser spread over them (read at the reduced count, as the spec's
    `1 / N` is; read as an ordinary constant, the reduced pair differed where the real one
    does not). Counted by several: those classes keep their sizes (a set of roots). Else
    None."""
    res = op.results[0] if op.results else None
    if (
        op.name not in ("stablehlo.multiply", "stablehlo.divide")
        or (op.name == "stablehlo.divide" and k != 1)
        or res is None
        or not isinstance(res.type, TensorType)
    ):
        return None
    keys = tuple(key for key in rules.keys(res) if max(sizes[d.find(key)]) > 1)
    found = {}
    for sub in _key_subsets(keys):
        roots = frozenset(d.find(key) for key in sub)
        if len(roots) < 2:
            continue
        power = _normalises(c, sub, d, sizes)
        if power and (op.name == "stablehlo.multiply") == (power < 0):
            found.setdefault(roots, (sub, power))
    if not found:
        return None
    if len(found) > 1:
        return set().union(*found)
    sub, power = next(iter(found.values()))
    return Normaliser(op, k, sub, vid), power, c


def _elementwise_chains(rules, d: DimClasses, sizes: dict, shares, seeded, explained) -> list:
    """Constants scaling a value element by element in a row before it is summed (`sum(y /
    4096 / 8)`, a mean over (rows, width) normalised in steps) whose product counts the
    positions of two or more of its classes together, as one constant would
    (`_folded_normaliser`): the accepted normalisers, each carrying the constants before its
    own (`Normaliser.chain`; those keep their values, its own is read at the reduced count).
    Read one at a time, each constant could be a class's size and kept it."""
    uses = [u for u in rules.pos.float_uses if _scales(u[0], u[1], rules)]
    before = rules.pos.scaled_values  # the constants that scaled each value in a row
    chains = {(id(op), k): before.get(op.operands[1 - k].id, ()) for op, k, _ in uses}
    inner = {(id(op), k) for chain in chains.values() for op, k, _ in chain}
    out = []
    for op, k, vid in uses:
        chain = chains[(id(op), k)]
        use = (id(op), k)
        if not chain or use in inner or use in explained or use in shares:
            continue
        if vid in seeded or any(v in seeded or (id(o), j) in explained for o, j, v in chain):
            continue
        c = rules.pos.floats[vid]
        count = _through_chain(c, Normaliser(op, k, (), vid, chain), rules.pos.floats)
        if count == 0 or not np.isfinite(count):
            continue
        folded = _folded_normaliser(count, rules, op, k, vid, d, sizes)
        if isinstance(folded, tuple):
            n, power, _ = folded
            out.append((replace(n, chain=chain), power, c))
    return out


def _key_subsets(keys: tuple, most: int = 6) -> list[tuple]:
    """The non-empty subsets of `keys` (all of them only, past `most` keys)."""
    if len(keys) > most:
        return [keys]
    return [sub for r in range(len(keys), 0, -1) for sub in itertools.combinations(keys, r)]


def _normalises(c: float, keys: tuple, d: DimClasses, sizes: dict, devices: int = 1) -> int:
    """1 (c is N) or -1 (c is 1/N) when c is a count of the positions of `keys` (any member's
    size of each class), else 0. With `devices` > 1 (`keys` summed on each device, then over
    that many devices), every key at its own size is no count of the sum."""
    counts = {(1, True)}  # (a count, whether every key so far is at its own size)
    for k in keys:
        own = d.real[k]
        counts = {(a * b, mine and b == own) for a, mine in counts for b in sizes[d.find(k)]}
        if len(counts) > 512:
            return 0
    found = (_matches(c, m) for m, mine in counts if m > 1 and not (mine and devices > 1))
    return next((p for p in found if p), 0)


def _own_sizes(d: DimClasses, module, sizes: dict) -> dict:
    """`sizes` (root -> its members' real sizes) with each class's sizes those of its
    members in `module` only (classes with none there keep all theirs)."""
    ids = set()
    for fn in module.functions.values():
        ids.update(a.id for a in fn.args)
        for op in walk(fn.body):
            ids.update(r.id for r in op.results)
            for region in op.regions:
                ids.update(a.id for a in region.block.args)
    own: dict = {}
    for k in d.parent:
        if k[0] in ids:
            own.setdefault(d.find(k), set()).add(d.real[k])
    return {root: own.get(root, s) for root, s in sizes.items()}


def _matches(c: float, n: int) -> int:
    """1 when c is n, -1 when c is 1/n (to float32 precision), else 0."""
    if abs(c - n) <= 1e-6 * n:
        return 1
    if abs(c * n - 1) <= 1e-6:
        return -1
    return 0


def _digits(d: DimClasses) -> None:
    """An offset into a merged dimension (a shard boundary, a slice start) is a position in
    its parts' mixed radix. Each digit must stay a whole number of its part's positions, and
    parts more major than a non-zero digit keep their size: shrinking them would move the
    offset to another digit (another group, another expert) at the reduced size."""
    for _ in range(4):  # digits land on parts that may be merged dimensions themselves
        before = sum(len(v) for v in d.offsets.values())
        with_offsets: dict = {}
        for k, v in d.offsets.items():
            if v:
                with_offsets.setdefault(d.find(k), []).append(k)
        for whole, parts in d.products:
            real = d.real[whole]
            radix = [d.real[p] for p in parts]
            # W = A x W (tiles gathered from A devices): A keeps its size (`_products`), and
            # W may still shrink by an affine unit (the tiles' remainders kept, affine.py)
            own = d.find(whole) in {d.find(p) for p in parts}
            for m in with_offsets.get(d.find(whole), ()):
                for o in list(d.offsets[m]):
                    if real < d.real[m] and d.real[m] % real == 0 and o % real == 0:
                        continue  # a boundary of real-sized blocks (a shard's): digits all 0
                    scaled = o * real
                    if scaled % d.real[m] and own:
                        d.split_unevenly(whole, "an offset inside its tiles is off their grid")
                        continue
                    if scaled % d.real[m]:
                        d.keep(whole, "an offset inside a merged dimension is off its grid")
                        continue
                    ow = scaled // d.real[m]
                    if ow in (0, real):
                        continue
                    digits = []
                    for n in reversed(radix):
                        digits.append(ow % n)
                        ow //= n
                    digits.reverse()
                    for i, (p, digit) in enumerate(zip(parts, digits, strict=True)):
                        if digit and digit not in d.offsets.get(p, ()):
                            d.divides(p, digit, ratio_only=own)
                        if digit:
                            for major in parts[:i]:
                                d.keep(major, "an offset inside a merged dimension")
        if sum(len(v) for v in d.offsets.values()) == before:
            break


def _tie_by_layout(d: DimClasses, s, i, lay, where: str) -> None:
    """A spec value's dimension and the impl's tile of it scale together; every shard's
    boundary must stay on the reduced grid (and ragged shards keep the dimension)."""
    st, it = s.type, i.type
    if not isinstance(st, TensorType) or not isinstance(it, TensorType):
        return
    rows = lay.box_rows[0]  # devices share few boxes: each distinct one once
    for a, n in enumerate(st.shape):
        ks = d.add((s.id, a), n, f"spec {where} dim {a}")
        ki = d.add((i.id, a), it.shape[a], f"impl {where} dim {a}")
        d.tie(ks, ki)
        tile = lay.tile_shape[a] if a < len(lay.tile_shape) else n
        if not len(rows):
            continue
        ends = rows[:, a, :]  # each box's (start, stop) along a
        sizes = ends[:, 1] - ends[:, 0]
        if ((sizes != tile) & (sizes != 0)).any() or n % max(tile, 1):
            d.split_unevenly(ks, f"{where} is sharded unevenly along dim {a}")
        d.divides_each(ks, ends.reshape(-1).tolist())


def _scaled_placement(d: DimClasses, factor: dict, affine: dict, spec: Module, placement):
    import dataclasses

    def factors(v) -> list:
        """Per dimension of v: its factor, or its affine class's map of sizes."""
        out = _factors_of(d, factor, v)
        for a in range(len(out)):
            aff = affine.get(d.find((v.id, a)))
            if aff is not None:
                out[a] = aff.at
        return out

    made: dict = {}  # arguments and results share layouts: each scaled once by its factors

    def scaled(lay, v):
        fs = factors(v)
        if any(callable(f) for f in fs):
            return scaled_layout(lay, fs)
        key = (id(lay), tuple(fs))
        if key not in made:
            made[key] = scaled_layout(lay, fs)
        return made[key]

    args = [scaled(lay, v) for lay, v in zip(placement.args, spec.main.args, strict=True)]
    results = [
        scaled(lay, v) for lay, v in zip(placement.results, spec.main.body.results, strict=True)
    ]
    return dataclasses.replace(placement, args=args, results=results)


def _factors_of(d: DimClasses, factor: dict, v) -> list[int]:
    t = v.type
    if not isinstance(t, TensorType):
        return []
    return [factor.get(d.find((v.id, a)), 1) for a in range(len(t.shape))]


def _describe(d: DimClasses, factor: dict, affine: dict, skip: set) -> list[DimClass]:
    """The classes, for the report (not the dimensions of splats: one value broadcast)."""
    out = []
    for root, members in d.classes().items():
        if root in skip:
            continue
        first = min(members, key=lambda k: (_rank_name(d.names.get(k, "")), k))
        f = factor.get(root, 1)
        real = d.real[first]
        why = d.reason_kept(members)
        if root in affine:
            aff = affine[root]
            name = d.names.get(first, "?")
            unit = (aff.unit, aff.reduced) + tuple(
                getattr(aff, f) for f in ("unit2", "reduced2") if hasattr(aff, f)
            )
            out.append(DimClass(name, real, aff.at(real), why, unit))
            continue
        if why is None and f == 1 and real > 2:
            why = d.reason_uneven(members) or _why_whole(d, members)
        out.append(DimClass(d.names.get(first, "?"), real, real // f, why))
    out.sort(key=lambda c: (c.reduced == c.real, -c.real))
    return out


def _why_whole(d: DimClasses, members: list) -> str:
    """Why a class that no op keeps still has factor 1 (so the report says so)."""
    ones = [k for k in members if d.real[k] == 1]
    if ones:
        return f"its member {d.names.get(ones[0], '?')} has size 1"
    g, cap = d.bound(members)
    if g == 1:
        return "no factor divides all its members' sizes and offsets"
    if cap <= 1:
        return "its lower bounds (2 on reduced and contracted dimensions) allow no factor"
    return "the merged dimensions it is a part of allow no factor"


def _rank_name(name: str) -> int:
    """Prefer naming a class by a spec argument, then a spec result, then anything."""
    for i, prefix in enumerate(("spec argument", "spec result", "impl argument")):
        if name.startswith(prefix):
            return i
    return 9


def _debug(d: DimClasses, factor: dict) -> None:
    """TV_REDUCTION_DEBUG=1: every class with its bounds, on stderr (for tv's developers)."""
    for root, members in d.classes().items():
        if max(d.real[k] for k in members) <= 1:
            continue
        g, cap = d.bound(members)
        sizes = sorted({d.real[k] for k in members})
        offs = sorted({o for k in members for o in d.offsets.get(k, ())})[:8]
        lows = sorted({(d.lower[k], d.real[k]) for k in members if k in d.lower})[:6]
        print(
            f"class {d.names.get(root, root)}: factor {factor.get(root, 1)} sizes {sizes} "
            f"g={g} cap={cap} offsets={offs} lower={lows} kept={d.reason_kept(members)}",
            file=sys.stderr,
        )
    for whole, parts in d.products[:40]:
        print(
            f"product {d.real[whole]} = {[d.real[p] for p in parts]} factors "
            f"{factor.get(d.find(whole), 1)} = {[factor.get(d.find(p), 1) for p in parts]}",
            file=sys.stderr,
        )
