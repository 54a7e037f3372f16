"""Reduced sizes: one factor per dimension class, as large as the class allows.

A class's factor divides every member's real size and every offset recorded against it,
and leaves each member at least its lower bound (2 on contracted and reduced dimensions,
TrainVerify's rule; 1 elsewhere, so every shard stays non-empty). A class that is the
product of others (a reshape's merged dimension) takes the product of their factors; when
that breaks one of its own bounds, the largest factor among its parts is lowered until it
holds. Kept classes have factor 1.
"""

from __future__ import annotations

from .affine import affine_unit
from .classes import DimClasses, Key


def _largest_divisor(g: int, cap: int) -> int:
    if g <= 0 or cap <= 1:
        return 1
    best = 1
    k = 1
    while k * k <= g:
        if g % k == 0:
            for c in (k, g // k):
                if c <= cap and c > best:
                    best = c
        k += 1
    return best


def smallest_prime(n: int) -> int:
    p = 2
    while p * p <= n:
        if n % p == 0:
            return p
        p += 1
    return n


def can_shrink(d: DimClasses, members: list[Key]) -> bool:
    """Whether the class of `members` may shrink: not kept, and its bounds (every member's
    size, offsets, lower bounds) allow a factor above 1, or an affine unit (`affine.py`: a
    ragged split). A class that cannot keeps its size whatever else is decided (`choose`
    only ever lowers factors)."""
    if d.reason_kept(members) is not None:
        return False
    if d.reason_uneven(members) is None and _largest_divisor(*d.bound(members)) > 1:
        return True
    return affine_unit(d, members) is not None


def choose(d: DimClasses) -> dict[Key, int]:
    """The factor of every class (keyed by its root)."""
    classes = d.classes()
    limits: dict[Key, tuple[int, int]] = {}
    for root, members in classes.items():
        g, cap = d.bound(members)
        if d.reason_kept(members) is not None or d.reason_uneven(members) is not None:
            g, cap = 1, 1
        limits[root] = (g, cap)
    defs, pinned = _products(d)
    for r in pinned:
        limits[r] = (1, 1)

    def atoms(root: Key, seen: frozenset = frozenset()) -> list[Key] | None:
        if root not in defs:
            return [root]
        if root in seen:
            return None  # a cycle of products
        out = []
        for p in defs[root][0]:
            sub = atoms(p, seen | {root})
            if sub is None:
                return None
            out += sub
        return out

    factor = {r: _largest_divisor(*limits[r]) for r in classes if r not in defs}
    stuck: set[Key] = set()
    for _ in range(10_000):
        changed = False
        for whole, alts in defs.items():
            groups = [atoms(whole)] + [
                sum((atoms(p) or [p] for p in parts), []) for parts in alts[1:]
            ]
            if any(g is None for g in groups):
                for r in _roots_of(defs, whole):
                    factor[r] = 1
                stuck.add(whole)
                continue
            g, cap = limits[whole]
            values = [_prod(factor[a] for a in grp if a in factor) for grp in groups]
            bad = [v for v in values if v > cap or (g and g % v) or v != values[0]]
            if not bad:
                continue
            # lower the largest factor among the parts of the largest product
            grp = groups[values.index(max(values))]
            a = max((x for x in grp if factor.get(x, 1) > 1), key=lambda x: factor[x], default=None)
            if a is None:
                stuck.add(whole)
                continue
            factor[a] //= smallest_prime(factor[a])
            changed = True
        if not changed:
            break
    for whole in defs:
        grp = atoms(whole)
        factor[whole] = 1 if grp is None or whole in stuck else _prod(factor[a] for a in grp)
    check_factors(d, classes, factor)
    return factor


def check_factors(d: DimClasses, classes: dict[Key, list[Key]], factor: dict[Key, int]) -> None:
    """Every factor is a whole divisor of every member's size, so no reduced size exceeds
    its real one; a class where that fails (a bug in the choice above) keeps its size, and
    the report says so."""
    for root, members in classes.items():
        f = factor.get(root, 1)
        bad = [d.real[k] for k in members if f < 1 or d.real[k] % f]
        if bad:
            factor[root] = 1
            d.keep(root, f"tv chose factor {f}, which does not divide size {bad[0]} (a bug)")


def _roots_of(defs, whole) -> list:
    out, stack, seen = [], [whole], set()
    while stack:
        r = stack.pop()
        if r in seen:
            continue
        seen.add(r)
        if r in defs:
            for parts in defs[r]:
                stack.extend(parts)
        else:
            out.append(r)
    return out


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def _products(d: DimClasses) -> tuple[dict[Key, list[tuple[Key, ...]]], set[Key]]:
    """Each merged dimension's class -> every product of classes that defines it, and the
    classes that cannot shrink because a product holds its own whole: W = A x W (a tile
    gathered from the devices along A, W being the tile's class by the layout) says A's
    factor is 1, and is no definition of W."""
    defs: dict[Key, list[tuple[Key, ...]]] = {}
    pinned: set[Key] = set()
    for whole, parts in d.products:
        w, ps = d.find(whole), [d.find(p) for p in parts]
        if w in ps:
            ps.remove(w)
            pinned.update(ps)
            continue
        defs.setdefault(w, []).append(tuple(ps))
    return defs, pinned


def _definitions(d: DimClasses) -> dict[Key, list[tuple[Key, ...]]]:
    """Each merged dimension's class -> every product of classes that defines it."""
    return _products(d)[0]


def _value(defs, factor: dict, root: Key, seen=frozenset()) -> set[int]:
    """The factors a class gets from each of its definitions (its own when it has none)."""
    if root not in defs or root in seen:
        return {factor.get(root, 1)}
    out = set()
    for parts in defs[root]:
        vals = {1}
        for p in parts:
            vals = {a * b for a in vals for b in _value(defs, factor, p, seen | {root})}
        out |= vals
    return out


def witnesses(d: DimClasses, factor: dict[Key, int]) -> list[tuple[Key, dict[Key, int]]]:
    """For each class that shrank, the factors with that class a prime times larger (its
    other members too, merged dimensions recomputed): where the reduced pair is checked
    again, concretely, before its proof is trusted. A class whose change would leave a
    merged dimension with disagreeing definitions has no witness."""
    merged = MergedDims(d, factor)
    out = []
    for root, f in factor.items():
        if f <= 1 or root in merged.defs:
            continue
        other = merged.grown([root])
        if other is not None:
            out.append((root, other))
    return out


def grown(d: DimClasses, factor: dict[Key, int], roots: list[Key]) -> dict[Key, int] | None:
    """The factors with every class of `roots` a prime times larger (merged dimensions
    recomputed from their parts), or None when a merged dimension's definitions would then
    disagree."""
    return MergedDims(d, factor).grown(roots)


class MergedDims:
    """The merged dimensions' definitions at `factor`, to recompute with a few classes
    grown. Definitions without cycles (the usual case) are evaluated once, parts before
    wholes, and per grown set only the wholes that read a grown class (at 126 layers, one
    full recomputation per class took minutes); with a cycle, every whole is recomputed
    with `_value`, as before."""

    def __init__(self, d: DimClasses, factor: dict[Key, int]) -> None:
        self.factor = factor
        self.defs = _definitions(d)
        self.order = _parts_first(self.defs)
        self.reads: dict[Key, set[Key]] = {}
        if self.order is not None:
            for w in self.order:
                r = self.reads[w] = set()
                for parts in self.defs[w]:
                    for p in parts:
                        r.add(p)
                        r |= self.reads.get(p, set())
            self.base = self._values(factor, {})

    def grown(self, roots: list[Key]) -> dict[Key, int] | None:
        f = self.factor
        return self.changed({root: f[root] // smallest_prime(f[root]) for root in roots})

    def at_real(self, roots: list[Key]) -> dict[Key, int] | None:
        """The factors with every class of `roots` at its real size (merged dimensions
        recomputed), or None when a merged dimension's definitions would then disagree."""
        return self.changed({root: 1 for root in roots})

    def changed(self, new: dict[Key, int]) -> dict[Key, int] | None:
        """The factors with each class of `new` at the factor it gives, merged dimensions
        recomputed from their parts (None when their definitions would then disagree)."""
        roots = list(new)
        other = dict(self.factor)
        other.update(new)
        if self.order is None:
            for whole in self.defs:
                vals = _value(self.defs, other, whole)
                if len(vals) != 1:
                    return None
                other[whole] = vals.pop()
            return other
        changed = set(roots)
        same = {w: v for w, v in self.base.items() if not self.reads[w] & changed}
        values = self._values(other, same)
        for whole in self.defs:
            if len(values[whole]) != 1:
                return None
            other[whole] = next(iter(values[whole]))
        return other

    def _values(self, factor: dict, known: dict) -> dict[Key, set[int]]:
        """Each merged class's factors from its definitions (`_value`), parts first."""
        vals = dict(known)
        for w in self.order:
            if w in vals:
                continue
            out: set[int] = set()
            for parts in self.defs[w]:
                v = {1}
                for p in parts:
                    pv = vals[p] if p in self.defs else {factor.get(p, 1)}
                    v = {a * b for a in v for b in pv}
                out |= v
            vals[w] = out
        return vals


def _parts_first(defs: dict) -> list[Key] | None:
    """The merged classes with every part before the wholes it defines, or None when the
    definitions form a cycle."""
    order: list[Key] = []
    state: dict[Key, int] = {}  # 1: on the path, 2: done
    for start in defs:
        if state.get(start):
            continue
        stack = [(start, iter(p for parts in defs[start] for p in parts))]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next((p for p in it if p in defs and state.get(p) != 2), None)
            if nxt is None:
                stack.pop()
                state[node] = 2
                order.append(node)
            elif state.get(nxt) == 1:
                return None
            else:
                state[nxt] = 1
                stack.append((nxt, iter(p for parts in defs[nxt] for p in parts)))
    return order


def separating_groups(n: int) -> list[list[int]]:
    """Indices 0..n-1 in `n.bit_length()` groups, group j holding those whose index + 1 has
    bit j set: every index is in a group, and every two indices are told apart by one (it
    holds one of them and not the other). So the classes that grow together in one witness
    still each grow in one, and no two keep their ratio in all (docs/equivalence.md)."""
    return [[i for i in range(n) if (i + 1) >> j & 1] for j in range(n.bit_length())]
