"""Dimension classes: which tensor dimensions of the two programs must scale together.

Every dimension (value, axis) of both programs is a member. Two members are tied when an op
or a layout relates them (an elementwise op's operands, a dot's contracting pair, a shard and
its global dimension); tied members shrink by the same factor, so their real sizes keep their
ratios (a tile stays global size / shards). A class is *kept* at its real size when some op
needs that (a data-dependent index, a window, a non-splat constant): a reason is recorded.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

Key = tuple[int, int]  # (value id, axis)


@dataclass
class DimClasses:
    parent: dict[Key, Key] = field(default_factory=dict)
    real: dict[Key, int] = field(default_factory=dict)
    # a member whose reduced size must stay >= min(its lower bound, real size)
    lower: dict[Key, int] = field(default_factory=dict)
    # integers (slice offsets, pad widths, shard boundaries) that the factor must divide,
    # each once, in the order first recorded (a dict as an ordered set: 8,192 devices' shard
    # boundaries repeat a few hundred offsets)
    offsets: dict[Key, dict[int, None]] = field(default_factory=lambda: defaultdict(dict))
    kept: dict[Key, str] = field(default_factory=dict)
    # members split unevenly (a ragged last shard): no factor, an affine unit may (affine.py)
    uneven: dict[Key, str] = field(default_factory=dict)
    # (member, offset) recorded for factors only (`divides(..., ratio_only=True)`)
    ratio_only: set[tuple[Key, int]] = field(default_factory=set)
    # reshape factors: the member's size is the product of the listed members' sizes
    products: list[tuple[Key, tuple[Key, ...]]] = field(default_factory=list)
    names: dict[Key, str] = field(default_factory=dict)
    # classes (by a member) whose every member keeps at least this many positions
    class_lower: list[tuple[Key, int]] = field(default_factory=list)

    def add(self, key: Key, size: int, name: str | None = None) -> Key:
        if key not in self.parent:
            self.parent[key] = key
            self.real[key] = int(size)
        if name and key not in self.names:
            self.names[key] = name
        return key

    def find(self, key: Key) -> Key:
        root = key
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[key] != root:
            self.parent[key], key = root, self.parent[key]
        return root

    def tie(self, a: Key, b: Key) -> None:
        """a and b scale together (their real sizes keep their ratio)."""
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra

    def at_least(self, key: Key, n: int) -> None:
        self.lower[key] = max(self.lower.get(key, 1), n)

    def every_member_at_least(self, key: Key, n: int) -> None:
        self.class_lower.append((key, n))

    def divides(self, key: Key, offset: int, ratio_only: bool = False) -> None:
        """The class's factor must divide `offset` (an index that scales with the class).
        `ratio_only`: a digit read at a fraction of another member (`_digits`), which an
        affine unit, reading offsets as they are, does not need."""
        o = abs(int(offset))
        self.offsets[key][o] = None
        if ratio_only:
            self.ratio_only.add((key, o))

    def divides_each(self, key: Key, offsets: list[int]) -> None:
        """`divides` for each of `offsets` (8,192 devices' offsets: one update)."""
        values, first = np.unique(np.abs(np.asarray(offsets, dtype=np.int64)), return_index=True)
        self.offsets[key].update(dict.fromkeys(values[np.argsort(first)].tolist()))

    def keep(self, key: Key, why: str) -> None:
        self.kept.setdefault(key, why)

    def split_unevenly(self, key: Key, why: str) -> None:
        """key's shards differ in size: its class shrinks only by an affine unit."""
        self.uneven.setdefault(key, why)

    def product(self, whole: Key, parts: tuple[Key, ...]) -> None:
        self.products.append((whole, parts))

    # -- per class views -------------------------------------------------------------------

    def classes(self) -> dict[Key, list[Key]]:
        if self.class_lower:
            pending, self.class_lower = self.class_lower, []
            roots = {self.find(k): n for k, n in pending}
            for k in list(self.parent):
                n = roots.get(self.find(k))
                if n:
                    self.at_least(k, n)
        out: dict[Key, list[Key]] = defaultdict(list)
        for k in self.parent:
            out[self.find(k)].append(k)
        return out

    def bound(self, members: list[Key]) -> tuple[int, int]:
        """(g, m): every factor of the class divides g, and is at most m (lower bounds)."""
        g, m = 0, None
        for k in members:
            g = math.gcd(g, self.real[k])
            for o in self.offsets.get(k, ()):
                g = math.gcd(g, o)
            low = min(self.lower.get(k, 1), self.real[k])
            cap = self.real[k] // max(low, 1)
            m = cap if m is None else min(m, cap)
        return g, (m if m is not None else 1)

    def reason_kept(self, members: list[Key]) -> str | None:
        for k in members:
            if k in self.kept:
                return self.kept[k]
        return None

    def reason_uneven(self, members: list[Key]) -> str | None:
        """Why no factor may shrink the class (a ragged shard), or None."""
        for k in members:
            if k in self.uneven:
                return self.uneven[k]
        return None
