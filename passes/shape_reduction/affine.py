"""Affine classes: a dimension split unevenly, reduced with its remainders kept.

A dimension of 39295 split over 2 devices is padded to 39296, sliced into tiles of 19648 at
offsets {0, 19648}, gathered back to 39296 and sliced to 39295: no factor divides its sizes
and offsets, so a ratio (`factors.py`) cannot shrink it. Each of those numbers is `a x U + b`
for one unit U (the tile, 19648) and small remainders b (39295 = 2U - 1, 39296 = 2U, pad
width 1 = 0U + 1). The class is reduced by giving the unit a small value U' and keeping
every remainder: `a x U + b -> a x U' + b` (3, 4, 2 and a pad of 1 at U' = 2). The reduced
program has the same number of tiles, the same padding and the same partial last tile.

The map is additive (a pad's `lo + n + hi`, a concatenation's sum, a slice's start + size
all stay exact), and keeps the order of every two numbers of the class as long as U' is
more than twice the largest remainder: the segments between offsets are the same ones, in
the same order, none of them empty. Why a verdict carries over: docs/equivalence.md,
"Uneven splits (affine classes)".
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .classes import DimClasses, Key

REMAINDER_LIMIT = 8  # the largest remainder |b| a member or offset may have
MIN_REAL = 64  # a class whose largest member is smaller gains too little to be worth it


@dataclass(frozen=True)
class Affine:
    """A class whose sizes and offsets are `a x unit + b`: read at `a x reduced + b`."""

    unit: int
    reduced: int

    def parts(self, n: int) -> tuple[int, int]:
        """(a, b) with n = a x unit + b and |b| <= unit / 2."""
        a = (2 * n + self.unit) // (2 * self.unit)
        return a, n - a * self.unit

    def at(self, n: int) -> int:
        """n at the reduced unit (signed: a negative offset maps to minus its map)."""
        if n < 0:
            return -self.at(-n)
        a, b = self.parts(n)
        return a * self.reduced + b

    def grown(self) -> Affine:
        """The witness's unit: one position more per unit."""
        return Affine(self.unit, self.reduced + 1)

    def witnesses(self) -> list[Affine]:
        return [self.grown()]


@dataclass(frozen=True)
class TwoUnits:
    """A class whose sizes and offsets are `a x unit + c x unit2 + b` (a sort's length
    and the k of its top k beside it): read at `a x reduced + c x reduced2 + b`."""

    unit: int
    reduced: int
    unit2: int
    reduced2: int

    def parts(self, n: int) -> tuple[int, int, int] | None:
        """The one (a, c, b) with |c| <= SECOND_LIMIT and |b| <= REMAINDER_LIMIT, or None
        when there is none or more than one."""
        return _two_parts(self.unit, self.unit2, n)

    def at(self, n: int) -> int:
        if n < 0:
            return -self.at(-n)
        a, c, b = self.parts(n)
        return a * self.reduced + c * self.reduced2 + b

    def grown(self) -> TwoUnits:
        return TwoUnits(self.unit, self.reduced + 1, self.unit2, self.reduced2)

    def witnesses(self) -> list[TwoUnits]:
        """Each unit one position larger, the other as it is (where that keeps the order
        of the class's numbers: checked by the caller)."""
        return [
            self.grown(),
            TwoUnits(self.unit, self.reduced, self.unit2, self.reduced2 + 1),
        ]


@functools.lru_cache(maxsize=65536)
def _two_parts(unit: int, unit2: int, n: int) -> tuple[int, int, int] | None:
    """`TwoUnits.parts`, which depends on the units only (not their reduced sizes): the
    search for reduced sizes asks it for the same numbers many times."""
    found = []
    for c in range(-SECOND_LIMIT, SECOND_LIMIT + 1):
        rest = n - c * unit2
        a = (2 * rest + unit) // (2 * unit)
        b = rest - a * unit
        if abs(b) <= REMAINDER_LIMIT:
            found.append((a, c, b))
    return found[0] if len(found) == 1 else None


SECOND_LIMIT = 4  # the largest multiple |c| of a second unit
TWO_UNIT_VALUES = 16  # a class with more distinct sizes and offsets is not tried


def affine_unit(d: DimClasses, members: list[Key]) -> Affine | None:
    """The affine reduction of a class (its members' sizes and offsets all `a U + b` with
    small b), or None. Of the units that fit, the one giving the smallest reduced sizes."""
    sizes = {d.real[k] for k in members}
    offsets = {o for k in members for o in d.offsets.get(k, ()) if (k, o) not in d.ratio_only}
    values = {v for v in sizes | offsets if v > 0}
    if max(values, default=0) < MIN_REAL:
        return None
    needs = {}
    for k in members:  # each member keeps its lower bound (2 on contracted dimensions)
        need = min(d.lower.get(k, 1), d.real[k])
        needs[d.real[k]] = max(needs.get(d.real[k], 0), need)
    best: tuple[int, Affine] | None = None
    for u in _candidates(values):
        found = _fit(u, values, needs)
        if found is not None and (best is None or found[0] < best[0]):
            best = found
    if best is not None and max(best[1].at(n) for n in needs) <= 32:
        return best[1]
    # none, or a small unit (52 for 2080 keys beside a top 48): two units may do better
    two = _two_units(values, needs)
    if two is not None and (best is None or sum(two.at(n) for n in needs) < best[0]):
        return two
    return best[1] if best else None


def _two_units(values: set[int], needs: dict[int, int]) -> TwoUnits | None:
    """A reduction by two units (TopK: 209664 keys in tiles of 104832, the top 2000): every
    value `a U + c K + b` in one way only, and reduced units that keep every two values in
    their order with at least min(their real distance, 2) positions between them, every
    member its lower bound, and both witnesses (each unit one larger) the same order."""
    if len(values) > TWO_UNIT_VALUES:
        return None  # the search below is quadratic in them, and such a class is no TopK
    big = sorted(values, reverse=True)[:6]
    units = {u for u in _candidates(set(big)) if u > 8 * REMAINDER_LIMIT}
    best = None
    for u in sorted(units, reverse=True)[:40]:
        probe = Affine(u, u)
        rest = {v for v in values if abs(probe.parts(v)[1]) > REMAINDER_LIMIT}
        if not rest:
            continue
        for k in _candidates(rest):
            if not 8 * REMAINDER_LIMIT < k < u:
                continue
            found = _fit_two(u, k, values, needs)
            if found is not None and (best is None or found[0] < best[0]):
                best = found
    return best[1] if best else None


def _fit_two(u: int, k: int, values: set[int], needs: dict[int, int]):
    """(cost, TwoUnits) for units u and k, or None."""
    probe = TwoUnits(u, u, k, k)
    if any(probe.parts(v) is None for v in values | set(needs)):
        return None
    points = sorted(values | set(needs) | {0})
    for k2 in range(1, 17):
        for u2 in range(k2 + 1, 65):
            t = TwoUnits(u, u2, k, k2)
            if _keeps(t, points, needs) and all(_keeps(w, points, {}) for w in t.witnesses()):
                return sum(t.at(n) for n in needs), t
    return None


def _keeps(t, points: list[int], needs: dict[int, int]) -> bool:
    """Whether t keeps the order of `points` (sorted), with min(real gap, 2) positions in
    every gap, and every member at least its lower bound."""
    mapped = [t.at(p) for p in points]
    for i in range(len(points) - 1):
        if mapped[i + 1] - mapped[i] < min(points[i + 1] - points[i], 2):
            return False
    return additive(t, points) and all(t.at(n) >= need for n, need in needs.items())


def additive(t, points: list[int]) -> bool:
    """Whether t maps every sum of two of `points` that is one of them to the sum of their
    maps (a slice's start + size = its operand, a pad's lo + n + hi, tiles x devices)."""
    present = set(points)
    return all(
        t.at(x) + t.at(y) == t.at(x + y)
        for i, x in enumerate(points)
        for y in points[i:]
        if x + y in present
    )


def _candidates(values: set[int]) -> set[int]:
    """Units to try: each value and its near neighbours (a tile of ceil size appears as an
    offset or a tile's size; a whole dimension is a few tiles plus a remainder)."""
    out = set()
    for v in values:
        for e in range(-REMAINDER_LIMIT, REMAINDER_LIMIT + 1):
            if v + e >= 4:  # _fit asks more of a unit with remainders (8 |b| < U)
                out.add(v + e)
    return out


def _fit(u: int, values: set[int], needs: dict[int, int]) -> tuple[int, Affine] | None:
    """(cost, the reduction) with unit u, or None when some value is not `a u + b` with a
    small b, nothing scales, or u cannot shrink."""
    probe = Affine(u, u)
    big, scales = 0, False
    for v in values:  # most units fail on some value's remainder: stop there
        a, b = probe.parts(v)
        big, scales = max(big, abs(b)), scales or a != 0
        if big > REMAINDER_LIMIT or 8 * big >= u:
            return None
    if not scales:
        return None
    reduced = 2 * big + 2  # order kept, every segment between offsets 2 positions or more
    for n, need in needs.items():
        a, b = probe.parts(n) if n > 0 else (0, 0)
        while a and a * reduced + b < need:
            reduced += 1
    if reduced >= u:
        return None
    aff = Affine(u, reduced)
    if not additive(aff, sorted(values | set(needs))):
        return None
    cost = sum(aff.at(n) for n in needs)
    if cost >= sum(needs):
        return None
    return cost, aff


def choose_affine(d: DimClasses, factor: dict[Key, int], exclude: set[Key]) -> dict[Key, Affine]:
    """The affine reduction of each class that no op keeps, and that is neither part of a
    merged dimension (a reshape's product) nor in `exclude`, where no factor shrinks it or
    a factor leaves it large and the affine unit far smaller (its factor is then set to 1).
    A class that is its own merged dimension's minor part (W = A x W: tiles gathered from A
    devices and merged, A kept at its size) may: A x (a U + b) maps to A x (a U' + b)."""
    merged = set()
    for whole, parts in d.products:
        w, ps = d.find(whole), {d.find(p) for p in parts}
        if w in ps:  # W = A x W: A keeps its size, W = A x (a U' + b) is still exact
            merged |= ps - {w}
        else:
            merged |= ps | {w}
    out = {}
    for root, members in d.classes().items():
        if root in merged or root in exclude or d.reason_kept(members) is not None:
            continue
        f = factor.get(root, 1)
        largest = max(d.real[k] for k in members)
        if f > 1 and largest // f < MIN_REAL:
            continue  # the factor leaves it small enough
        aff = affine_unit(d, members)
        if aff is None:
            continue
        if f > 1 and 4 * max(aff.at(d.real[k]) for k in members) > largest // f:
            continue  # a factor of 16 leaves 13104 of 209664 keys; two units leave 6
        out[root] = aff
        factor[root] = 1
    return out
