"""Shape rule of `sort`: the sorted dimension shrinks when the comparator is a strict weak order.

A sort's lanes (every position but the sorted dimension) are sorted on their own by a
comparator of scalars, so the other dimensions are size-generic. The sorted dimension is
too when the comparator is a strict weak order (checked on small values,
tv_ir/semantics/comparator_order.py): the result at any length n is then the one stable
sorted permutation of the lane, a function that is the same at every n, as a sum is; a
partitioned sort gathers or exchanges the lane whole before sorting it (offsets and shard
boundaries that scale with the class, as for any data movement), and a sort of shards
followed by a merge (TopK's partitioning) is a sort at each step.

The sorted dimension keeps at least `MIN_SORTED` positions: at 3 a lane has a middle rank
(an element can move past another one, not only swap with it) and two equal keys can lie
apart with a third between them, so a sort that is not stable or not by that comparator
shows; every ordering pattern of 2 positions occurs within it. As everywhere in shape
reduction, a proof is confirmed at the real sizes (or with the class a prime larger)
before it is reported (docs/equivalence.md, "Shape reduction").

Positions (an `iota`) sorted along as payload stay positions of their class: a sort
permutes a lane, so every element is still one of its positions; the comparator may read
them only by comparing two of them (the tie-break of TopK), which keeps their order at
every size. Any other use in the comparator keeps the class, as before.
"""

from __future__ import annotations

from tv_ir.ir.program import Op, walk

MIN_SORTED = 3
COMPARISONS = {"stablehlo.compare"}


def sort_rule(rules, op: Op) -> None:
    """Tie a sort's operands and results dimension by dimension, and shrink or keep its
    sorted dimension (`rules` is the program's ShapeRules)."""
    d = rules.d
    dim = op.attrs["dimension"]
    first = op.operands[0]
    for v in list(op.operands[1:]) + list(op.results):
        rules.tie_all(first, v)
    keys = rules.keys(first)
    if not keys:
        return
    block = op.regions[0].block if op.regions else None
    why = "no comparator" if block is None else _violation(rules, block, op)
    if why:
        d.keep(keys[dim], f"sorted dimension of sort at {op.loc}: comparator {why}")
        for v in op.operands:
            rules.untrack(v, f"sort at {op.loc}")
        return
    for v in list(op.operands) + list(op.results):
        d.at_least(rules.keys(v)[dim], MIN_SORTED)
    for i, (v, r) in enumerate(zip(op.operands, op.results, strict=True)):
        key = rules.pos.index.get(v.id)
        if key is None:
            continue
        if _compared_only(block, 2 * i, 2 * i + 1):
            rules.pos.index[r.id] = key
        else:
            rules.untrack(v, f"sort at {op.loc} (its comparator computes with positions)")


def _violation(rules, block, op: Op) -> str | None:
    cache = rules.__dict__.setdefault("_comparators", {})
    if id(block) not in cache:
        from tv_ir.semantics.comparator_order import strict_weak_order_violation

        found = strict_weak_order_violation(rules.module, block)
        cache[id(block)] = f"is not a strict weak order: {found}" if found else None
    return cache[id(block)]


def _compared_only(block, lhs: int, rhs: int) -> bool:
    """The comparator reads its arguments `lhs` and `rhs` only in `compare(lhs, rhs)` (or
    `compare(rhs, lhs)`), or not at all."""
    pair = {block.args[lhs].id, block.args[rhs].id}
    for inner in walk(block):
        read = {v.id for v in inner.operands} & pair
        if not read:
            continue
        if inner.name not in COMPARISONS or {v.id for v in inner.operands} != pair:
            return False
    return all(v.id not in pair for v in block.results)
