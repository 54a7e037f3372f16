"""The spec at the reduced mesh: each dimension split over mesh axes shrinks by the product
of those axes' real / reduced sizes (a tile keeps its size, so its whole shrinks), every
other dimension keeps its size, and every constant keeps its value.

The dimensions are grouped into classes by shape reduction's rules (passes/shape_reduction),
so a class shrinks as a whole. A merged dimension (heads x head_dim after a reshape) shrinks
in its major part, the one shards split (each shard must hold whole minor parts). A class
shape reduction keeps (a gather's indexed dimension, a window, a constant table along it, a
count computed from its size) cannot shrink: the axes splitting it keep their sizes.
"""

from __future__ import annotations

import math

from tv_ir.passes.shape_reduction.classes import DimClasses
from tv_ir.passes.shape_reduction.factors import _products, choose
from tv_ir.passes.shape_reduction.rewrite import Rewriter
from tv_ir.passes.shape_reduction.rules import ShapeRules

from tv_ir.ir.program import Module

# (value, dimension) -> (factor it must shrink by, shards it is split into at the real mesh)
Wanted = dict[tuple[object, int], tuple[int, int]]


def shrink_spec(spec: Module, wanted: Wanted) -> tuple[Module | None, dict]:
    """(the spec with each wanted dimension shrunk by its factor, {(value, dim): why not})
    — the module is None when some dimension cannot shrink as wanted."""
    d = DimClasses()
    rules = ShapeRules(d, spec, "spec", 1, 1, False)
    rules.run(spec.main)
    failed: dict = {}
    if rules.pos.counts:
        n, where = rules.pos.counts[0]
        why = f"the spec computes a count ({n}) from a size at {where}"
        return None, {key: why for key in wanted}
    defs, _ = _products(d)
    forced: dict = {}
    for (v, a), (f, shards) in wanted.items():
        if f == 1:
            continue
        root = d.find((v.id, a))
        targets = [root]
        if root in defs:  # a merged dimension: its major-most parts shrink
            found = _majors(d, defs, root)
            size = v.type.shape[a]
            if (
                found is None
                or not all(_aligned(size // shards, m) for _, m in found)
                or shards % f
            ):
                failed[(v, a)] = "a merged dimension whose shards split its minor parts"
                continue
            targets += [major for major, _ in found]
        other = next((forced[x] for x in targets if forced.get(x, f) != f), None)
        if other is not None:
            name = d.names.get(root) or f"dimension {a} of a {v.type}"
            part = "its major part (heads: K/V heads)" if root in defs else "it"
            failed[(v, a)] = f"{name} would shrink by {f}, but {part} by {other} elsewhere"
            continue
        forced.update((x, f) for x in targets)
    if failed:
        return None, failed
    indexed = _indexed(d, rules)
    for v, a in wanted:
        root = d.find((v.id, a))
        for key in (root, *(defs[root][0][:1] if root in defs else ())):
            if d.find(key) in indexed:
                failed[(v, a)] = indexed[d.find(key)]
    if failed:
        return None, failed
    for root, members in d.classes().items():
        if root in defs and root not in forced:
            continue  # a merged dimension: its parts' factors make its own
        for k in members:
            d.divides(k, forced.get(root, 1))
    factor = choose(d)
    for (v, a), (f, _) in wanted.items():
        got = factor.get(d.find((v.id, a)), 1)
        if got != f:
            members = d.classes()[d.find((v.id, a))]
            why = d.reason_kept(members) or f"its class shrinks by {got}, not {f}"
            failed[(v, a)] = why
    if failed:
        return None, failed
    rewriter = Rewriter(d, factor, rules.pos.rescales, 1, {}, rules.pos.splats, {})
    return rewriter.module(spec), {}


def _aligned(tile: int, minor: int) -> bool:
    """Whether shards of `tile` elements hold whole minor parts, or split each one into the
    same whole number of shards (FSDP's shards of a K/V group's query heads): either way a
    shard's place in the merged dimension is the same function of its device at any number
    of major parts."""
    minor = max(minor, 1)
    return tile % minor == 0 or minor % tile == 0


def _majors(d: DimClasses, defs, root, seen=frozenset()) -> list | None:
    """The major-most part of each way a merged dimension is defined ((kv heads x group) x
    head_dim: the kv heads), with the product of the minor parts below it; None on a
    cycle."""
    if root in seen:
        return None
    out = []
    for parts in defs[root]:
        minor = math.prod(d.real[p] for p in parts[1:])
        if parts[0] not in defs:
            out.append((parts[0], minor))
            continue
        below = _majors(d, defs, parts[0], seen | {root})
        if below is None:
            return None
        out += [(major, m * minor) for major, m in below]
    return out


def _indexed(d: DimClasses, rules: ShapeRules) -> dict:
    """Classes the spec indexes: offsets other than 0 and a member's whole size (a slice, a
    pad, a concatenation), integers in its units. Shape reduction scales those with the
    class; on a smaller mesh a tile keeps its size, so an offset of one tile from either
    end, or from the middle, would have to be read differently (first, last, or scaled),
    and is not guessed: the axes splitting the class keep their sizes. Positions alone (an
    iota, compared with other positions: a causal mask) are the class's positions at any
    size, as in shape reduction; compared with an integer, that integer is in its units."""
    out = {}
    for key, offsets in d.offsets.items():
        if any(o not in (0, d.real[key]) for o in offsets):
            out.setdefault(d.find(key), "the spec slices or pads it at offsets")
    for r in rules.pos.rescales:
        out.setdefault(d.find(r.key), f"the spec offsets it by integers at {r.op.loc}")
    return out
