"""Repeated stages: which spec value an implementation value matches, known before looking.

A program with repeated structure (a stack of layers, the same step on every micro-batch)
poses the same stage again and again: the same implementation op, on operands cut at the
same blocks of spec values that are themselves the same computation on other values.
Finding the spec value such a stage matches costs a search of the simulated spec tiles
(`TileIndex`), per device for a pipeline; this module answers it from the structure
instead, keyed before anything is evaluated:

- a stage's *form* is its op (`op_signature`: name, attributes, types, regions), which of
  its results it is, and per operand how it was cut: per device, the block (box) of a spec
  value it was proved equal to, the spec values numbered by first occurrence (an operand
  not cut is described by the ops that made it, a few deep);
- when a stage of some form was proved equal to blocks of spec values, a later stage of
  the same form is predicted to match the *image* of those values under the renaming its
  operands give (first spec value to first, ...), the image of a value outside the
  renaming being the spec op of the same signature applied to the images of its operands
  (an argument, or a value the renaming leaves, is itself).

A prediction is only a candidate: the stage is proved against it as against any candidate
(by normal form or expansion, `StageProver._cut_as_predicted`), and an unproved prediction
falls back to the search. So a wrong prediction costs time, never a verdict.
"""

from __future__ import annotations

from tv_ir.ir.program import Op, Value

from .spec_graph import SpecGraph

# implementation ops followed back from a stage's operands to values already cut
FORM_DEPTH = 4
# spec ops followed back from a predicted value to the renaming its operands give
IMAGE_DEPTH = 8

# per device: (spec value id, box) the value was proved equal to, or None (not cut there)
Cut = tuple


class RepeatedStages:
    """Cuts proved so far, by form; predictions of the cut of a stage of a form met before."""

    def __init__(self, graph: SpecGraph) -> None:
        self._graph = graph
        self._proved: dict[tuple, tuple[list[int], Cut]] = {}  # form -> (numbering, cut)

    def form(self, op: Op, result: int, cuts: dict[int, Cut]) -> tuple[tuple, list[int]] | None:
        """(form, spec values by number) of `op`'s `result`-th value given how values were
        cut (`cuts`: implementation value id -> Cut); None when no operand reaches a cut
        value. An operand not cut is described by the op that made it (a broadcast, a
        reshape, a constant: its signature holds the constant's value) and its operands in
        turn, FORM_DEPTH ops deep, or by its type past that."""
        numbering: list[int] = []
        numbers: dict[int, int] = {}

        def describe(u: Value, depth: int):
            cut = cuts.get(u.id)
            if cut is not None:
                described = []
                for piece in cut:
                    if piece is None:  # a device not cut (an idle pipeline stage's work)
                        described.append(None)
                        continue
                    vid, box = piece
                    if vid not in numbers:
                        numbers[vid] = len(numbering)
                        numbering.append(vid)
                    described.append((numbers[vid], box))
                return tuple(described)
            if u.owner is None:
                return ("argument", u.index, str(u.type))
            if depth == 0:
                return ("value", str(u.type))
            inner = tuple(describe(w, depth - 1) for w in u.owner.operands)
            return (self._graph.signature(u.owner), u.index, inner)

        operands = tuple(describe(u, FORM_DEPTH) for u in op.operands)
        if not numbering:
            return None
        return (self._graph.signature(op), result, operands), numbering

    def record(self, form: tuple, numbering: list[int], cut: Cut) -> None:
        """A stage of `form` was proved equal to `cut` (first proof of a form kept)."""
        self._proved.setdefault(form, (numbering, cut))

    def predict(self, form: tuple, numbering: list[int]) -> Cut | None:
        """The cut a stage of `form` is likely to be proved equal to, when a stage of the same
        form was (its spec values renamed as the operands' are), else None."""
        earlier = self._proved.get(form)
        if earlier is None:
            return None
        before, cut = earlier
        renaming = dict(zip(before, numbering, strict=True))
        out: list = []
        for piece in cut:
            if piece is None:
                out.append(None)
                continue
            vid, box = piece
            image = self._image(vid, renaming, IMAGE_DEPTH)
            if image is None:
                return None
            out.append((image, box))
        return tuple(out)

    # -- the spec's structure ------------------------------------------------------------
    def _image(self, vid: int, renaming: dict[int, int | None], depth: int) -> int | None:
        if vid in renaming:
            return renaming[vid]
        defining = self._graph.definition(vid)
        if defining is None:
            return vid  # an argument the renaming leaves: itself
        found = None
        if depth > 0:
            op, j = defining
            floats = [u for u in op.operands if u.type.is_float]
            images = [self._image(u.id, renaming, depth - 1) for u in floats]
            if all(i == u.id for i, u in zip(images, floats, strict=True)):
                found = vid  # the renaming leaves its operands (a table of positions): itself
            elif None not in images:
                found = self._applied(op, j, floats, images)
        renaming[vid] = found
        return found

    def _applied(self, op: Op, j: int, floats: list[Value], images: list[int]) -> int | None:
        """The `j`-th result of the one spec op of `op`'s signature whose float operands are
        `images` (None when there is none, or more than one)."""
        signature = self._graph.signature(op)
        found = None
        for other in self._graph.users(images[0]):
            if other is op or self._graph.signature(other) != signature:
                continue
            theirs = [u.id for u in other.operands if u.type.is_float]
            if all(map(self._alike, theirs, images)):
                if found is not None and found is not other:
                    return None
                found = other
        return None if found is None else found.results[j].id

    def _alike(self, a: int, b: int) -> bool:
        """The same value, or two constants of one value (each layer has its own copy)."""
        if a == b:
            return True
        da, db = self._graph.definition(a), self._graph.definition(b)
        return (
            da is not None
            and db is not None
            and da[0].name == db[0].name == "stablehlo.constant"
            and self._graph.signature(da[0]) == self._graph.signature(db[0])
        )
