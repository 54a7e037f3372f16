"""Stage obligations decided once: proofs reused for obligations equal up to renaming.

A program with repeated structure (the same transformer layer N times, the same step on
every data-parallel device) poses the same stage obligation again and again, over other
symbols. This cache keys an obligation by its canonical form: its terms with every symbol
replaced by the order of its first occurrence, and beside each number what the symbol is
(family kind, element type, recorded sign). Two obligations with the same key are one
another's image under a bijective renaming of symbols, applied to both sides at once.

A stage proof may also have expanded cut symbols into their definitions. The cache stores
with each proof which symbols it expanded (by number, level by level) and the canonical
form of their definitions; a new obligation reuses the proof only when its symbols of those
numbers have definitions of the same canonical form (under the same, extended, renaming).
Then the renamed proof is a proof of the new obligation: the identities it ends with are
renamed, and the definitions it substituted hold in the program as well.

Only proofs are cached: an obligation not proved is tried again (a failure may depend on
which cut-points simulation suggested expanding).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

from tv_ir.semantics import terms as T

# canonical nodes per obligation (with its recorded definitions) beyond which it is not
# cached: a cost guard, the proof goes on without the cache
FORM_LIMIT = 200_000


class _Tag:
    """A node kind in a canonical form: compared by identity, so no number, string or
    tuple held in a term can be mistaken for one."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


_POLY, _BOOL, _SYM, _ATOM, _SET, _NODE = (
    _Tag(n) for n in ("poly", "bool", "sym", "atom", "set", "node")
)


class _Uncacheable(Exception):
    """The obligation holds something without a canonical form (or too much of it)."""


class CanonicalForm:
    """Terms as nested tuples, symbols numbered by first occurrence; one numbering shared by
    every term given to the same instance. Each atom and boolean is a node of `nodes`,
    numbered by first occurrence too, and referred to by its number: a term is a DAG whose
    shared parts, spelled out as nested tuples, grow exponentially with depth (hashing one
    such form ran for minutes on a Llama layer's attention stage)."""

    def __init__(self) -> None:
        self.symbols: list[int] = []  # symbol atom ids, by number
        self.descriptors: list[tuple] = []  # what each numbered symbol is
        self._numbers: dict[int, int] = {}  # symbol atom id -> number
        self._atoms: dict[int, object] = {}  # atom id -> form (interned: ids are stable)
        self._bools: dict[int, object] = {}  # id(Bool) -> form (interned, kept alive)
        self.nodes: list[tuple] = []  # atom and boolean forms, by number
        self._node_numbers: dict[tuple, int] = {}  # node form -> its number
        self._size = 0

    def copy(self) -> CanonicalForm:
        c = CanonicalForm()
        c.symbols, c.descriptors = list(self.symbols), list(self.descriptors)
        c._numbers, c._atoms, c._bools = dict(self._numbers), dict(self._atoms), dict(self._bools)
        c.nodes, c._node_numbers = list(self.nodes), dict(self._node_numbers)
        c._size = self._size
        return c

    def number(self, atom_id: int) -> int | None:
        return self._numbers.get(atom_id)

    def of(self, x):
        """The canonical form of a term, a pair or tuple of them, or a number."""
        self._size += 1
        if self._size > FORM_LIMIT:
            raise _Uncacheable()
        if isinstance(x, T.Poly):
            return self._poly(x)
        if isinstance(x, T.Bool):
            return self._bool(x)
        if isinstance(x, T.Atom):
            return self._atom(x.id)
        if isinstance(x, tuple):
            return tuple(self.of(y) for y in x)
        if isinstance(x, frozenset):
            return (_SET, tuple(self.of(y) for y in x))
        if x is None or isinstance(x, (bool, int, float, str, Fraction)):
            return x  # equal numbers mean the same: numeric equality is enough
        raise _Uncacheable()

    def _poly(self, p: T.Poly):
        terms = tuple((tuple((self._atom(aid), e) for aid, e in m), c) for m, c in p.terms.items())
        self._size += len(p.terms)
        if p.dom is T.TRUE:
            return (_POLY, terms, p.inf)
        return (_POLY, terms, p.inf, self._bool(p.dom), self._bool(p.infs))

    def _bool(self, b: T.Bool):
        form = self._bools.get(id(b))
        if form is None:
            form = self._node((_BOOL, b.kind, self.of(b.args)))
            self._bools[id(b)] = form
        return form

    def _node(self, form: tuple) -> tuple:
        """A reference to `form` in `nodes` (equal forms share one number)."""
        n = self._node_numbers.get(form)
        if n is None:
            n = self._node_numbers[form] = len(self.nodes)
            self.nodes.append(form)
        return (_NODE, n)

    def _atom(self, aid: int):
        form = self._atoms.get(aid)
        if form is not None:
            return form
        a = T.ATOM_BY_ID[aid]
        if a.kind == "sym":
            n = len(self.symbols)
            self._numbers[aid] = n
            self.symbols.append(aid)
            self.descriptors.append(_describe(a))
            form = (_SYM, n)
        else:
            form = self._node((_ATOM, a.kind, self.of(a.args)))
        self._atoms[aid] = form
        return form


def _describe(a: T.Atom) -> tuple:
    """Everything about a symbol that a proof may use besides its name: the family's kind
    (input, cut, table, partial), its element type (integer symbols range over it) and the
    sign recorded for it (a cut symbol keeps its definition's sign)."""
    key = a.args[0]
    sign = T.sign(T.atom_poly(a))
    if isinstance(key, T.Key):
        return (key.kind, key.dtype, sign)
    return ("named", None, sign)


class _Recipe:
    """A cached proof: the symbols it expanded (numbers, level by level), the canonical
    forms of their definitions (and of the symbols those introduced), and how it ended."""

    __slots__ = ("levels", "definitions", "method")

    def __init__(self, levels: tuple, definitions: tuple, method: str):
        self.levels, self.definitions, self.method = levels, definitions, method


class Probe:
    """One obligation looked up in the cache: `hit()` says whether a cached proof applies;
    after a proof by other means, `record(...)` stores it."""

    def __init__(self, cache: ObligationCache, key, canon: CanonicalForm | None, definition):
        self._cache, self._key, self._canon, self._definition = cache, key, canon, definition

    def hit(self) -> str | None:
        """The method of a cached proof this obligation is a renaming of (else None)."""
        if self._key is None:
            return None
        for recipe in self._cache._entries.get(self._key, ()):
            canon = self._canon.copy()
            try:
                if _definitions(canon, recipe.levels, self._definition) == recipe.definitions:
                    self._cache.hits += 1
                    return recipe.method
            except _Uncacheable:
                continue
        return None

    def record(self, expanded: list[set[int]], method: str) -> None:
        """Store a proof that expanded the symbols `expanded` (atom ids, level by level)."""
        if self._key is None:
            return
        canon = self._canon.copy()
        levels = []
        try:
            for atoms in expanded:
                numbers = [canon.number(a) for a in atoms]
                if any(n is None for n in numbers):
                    return  # a symbol the canonical form never met: do not cache
                levels.append(tuple(sorted(numbers)))
                _definitions(canon, levels[-1:], self._definition)  # numbers what it meets
            levels_t = tuple(levels)
            definitions = _definitions(self._canon.copy(), levels_t, self._definition)
        except _Uncacheable:
            return
        recipes = self._cache._entries.setdefault(self._key, [])
        if len(recipes) < 4:
            recipes.append(_Recipe(levels_t, definitions, method))


def _definitions(canon: CanonicalForm, levels, definition) -> tuple:
    """Canonical forms of the definitions of the numbered symbols, level by level, with the
    descriptors of the symbols each level adds (extends `canon`'s numbering)."""
    out = []
    for numbers in levels:
        seen, seen_nodes = len(canon.symbols), len(canon.nodes)
        forms = []
        for n in numbers:
            if n >= len(canon.symbols):
                raise _Uncacheable()
            d = definition(canon.symbols[n])
            if d is None:
                raise _Uncacheable()
            forms.append(canon.of(d))
        out.append((tuple(forms), tuple(canon.descriptors[seen:]), tuple(canon.nodes[seen_nodes:])))
    return tuple(out)


class ObligationCache:
    """Proved stage obligations by canonical form (see the module docstring)."""

    def __init__(self) -> None:
        self._entries: dict[tuple, list[_Recipe]] = {}
        self.hits = 0

    def probe(self, work: list, definition: Callable[[int], object]) -> Probe:
        """Look up an obligation: `work` its residues (terms, or pairs of terms that must be
        equal), `definition` a cut symbol's definition by atom id (None for other symbols)."""
        canon = CanonicalForm()
        try:
            forms = tuple(canon.of(w) for w in work)
        except _Uncacheable:
            return Probe(self, None, None, definition)
        return Probe(self, (forms, tuple(canon.descriptors), tuple(canon.nodes)), canon, definition)


def renaming_classes(work: list) -> list[list[int]] | None:
    """The residues of one obligation grouped by canonical form: each group's members are
    one another's images under a bijective renaming of symbols (kinds, element types and
    signs kept), so a proof of one member proves the rest. A stage over a tile holds the
    same identity once per element (an embedding row looked up by each token id, in each
    column): its elements prove one at a time where all of them at once overwhelm the
    solver. Positions into `work`, the groups in order of first member; None when a
    residue has no canonical form (or one too large)."""
    groups: dict[tuple, list[int]] = {}
    for i, w in enumerate(work):
        canon = CanonicalForm()
        try:
            key = (canon.of(w), tuple(canon.descriptors), tuple(canon.nodes))
        except _Uncacheable:
            return None
        groups.setdefault(key, []).append(i)
    return list(groups.values())
