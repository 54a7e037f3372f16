"""Reduced sizes: one factor per dimension class, as large as the class allows.

A class's factor divides every member's real size and every offset recorded against it,
and leaves each member at least its lower bound (2 on contracted and reduced dimensions,
TrainVerify's rule; 1 elsewhere, so every shard stays non-empty). A class that is the
product of others (a reshape's merged dimension) takes the product of their factors; when
that breaks one of its own bounds, the largest factor among its parts is lowered until it
holds. Kept classes have factor 1.
"""

from __future__ import annotations

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
    """Whether the class of `members` may get a factor above 1: not kept, and its bounds
    (every member's size, offsets, lower bounds) allow one. A class that cannot keeps a
    factor of 1 whatever else is decided (`choose` only ever lowers factors)."""
    if d.reason_kept(members) is not None:
        return False
    return _largest_divisor(*d.bound(members)) > 1


def choose(d: DimClasses) -> dict[Key, int]:
    """The factor of every class (keyed by its root)."""
    classes = d.classes()
    limits: dict[Key, tuple[int, int]] = {}
    for root, members in classes.items():
        g, cap = d.bound(members)
        if d.reason_kept(members) is not None:
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
    defs = _definitions(d)
    out = []
    for root, f in factor.items():
        if f <= 1 or root in defs:
            continue
        other = dict(factor)
        other[root] = f // smallest_prime(f)
        ok = True
        for whole in defs:
            vals = _value(defs, other, whole)
            if len(vals) != 1:
                ok = False
                break
            other[whole] = vals.pop()
        if ok:
            out.append((root, other))
    return out
