"""Symbolic terms with canonical normal forms.

A numeric term is a `Poly`: a Laurent polynomial with exact rational coefficients over
*atoms*. An atom is a symbol (an input element or a cut-point element) or an opaque
application (exp, log, tanh, 1/p for a multi-term p, max/min, select, ...) whose arguments
are themselves in normal form. Atoms are hash-consed, so two terms are equal as normal forms
exactly when their monomial dictionaries are equal: that decides every polynomial identity
(reassociation, distributivity, cancellation) without a solver. What normal forms leave open
goes to Z3 (tv_ir.prover.smt).

Boolean terms (`Bool`) are hash-consed comparisons `p > 0`, `p >= 0`, `p == 0` with `p`
normalised (leading coefficient +-1), and their logical combinations.

Definedness: every `Poly` carries `dom`, a `Bool` saying where its value is what its terms
say. Where `dom` fails, some partial operation on the value's path left its domain
(division by zero, log of a non-positive number, sqrt of a negative one, ...) and the value
is *some* non-finite float: which one (+inf, -inf, NaN) is not modelled, as reals have no
signed zero. Partial operations add their condition to `dom`; total ones combine their
operands' `dom`s (strictness: inf + 1 and 0 * NaN are non-finite); `select` is
path-sensitive, so a guard like `where(x == 0, 0, y / x)` is defined everywhere. So
cancellation (`x * x^-1 = 1`) is exact: its condition stays in `dom`. An operation that can
map a non-finite operand back to a finite value (compare, exp, 1/x, max, ...) is applied
only where its operands are defined; elsewhere its result is a fresh opaque value, unique
to that application, so nothing is assumed about it. Atom arguments are stored without
their `dom` (it lives in the Poly that uses the atom), except opaque ones.

Infinities also appear as constants (masks, max-reduction identities) and are handled by a
few absorbing rules; anything else involving them is unsupported rather than guessed.
"""

from __future__ import annotations

import itertools
import math
import re
import zlib
from fractions import Fraction

import numpy as np

from tv_ir.errors import Unsupported
from tv_ir.ir.float_constants import EXACT, exact_reciprocal
from tv_ir.limits import check_time
from tv_ir.semantics.run_tables import run_table

Num = int | Fraction
Mono = tuple  # ((atom_id, power), ...) sorted by atom id

_atom_ids = itertools.count()
_ATOMS: dict[tuple, Atom] = run_table({})
ATOM_BY_ID: dict[int, Atom] = run_table({})


class _Interned:
    """Hash-consed nodes: one object per (kind, args), so equality is identity."""

    __slots__ = ()

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return self is other


# Python salts the hash of every string per process (PYTHONHASHSEED), so a node hashed
# with its kind's or a key's name would iterate in another order in every run (the items
# of an `and`, the operands of a `max`), and z3, given them in that order, may prove a
# query in one run and run out of its budget in the next. An interned node's hash is its
# serial number instead (equal nodes are one object): the order in which a run creates
# nodes follows the programs and, through these hashes, itself, so terms, their order and
# the queries they become are the same in every run. A Key is compared by value: its hash
# is that of its fields, strings by their CRC.
_node_serials = itertools.count()
_STRING_HASHES: dict[str, int] = {}


def stable_hash(x) -> int:
    """A hash that is the same in every process: strings by their CRC, tuples by their
    elements' stable hashes, anything else by its own hash."""
    if isinstance(x, str):
        h = _STRING_HASHES.get(x)
        if h is None:
            h = _STRING_HASHES[x] = zlib.crc32(x.encode())
        return h
    if type(x) is tuple:
        return hash(tuple(stable_hash(y) for y in x))
    return hash(x)


def _intern(cls, table: dict, kind: str, args: tuple):
    node = object.__new__(cls)
    node.kind = kind
    node.args = args
    node._hash = next(_node_serials)
    node.syms = _syms_of(args)
    table[(kind, args)] = node
    return node


_LONG_ARGS: dict[int, tuple] = run_table(
    {}
)  # id of a long argument tuple -> (the tuple, its symbols)


def _syms_of(args: tuple) -> frozenset:
    """The symbols of a node's arguments, in one union (`syms |= x.syms` per argument copies
    the growing set); a long tuple's (an opaque function's hundreds of arguments, shared by
    every element of its results) computed once."""
    parts = []
    for x in args:
        if isinstance(x, (Poly, Bool)):
            parts.append(x.syms)
        elif isinstance(x, (frozenset, tuple)) and len(x) > 16:
            hit = _LONG_ARGS.get(id(x))
            if hit is None or hit[0] is not x:
                if len(_LONG_ARGS) > 10_000:
                    _LONG_ARGS.clear()
                hit = _LONG_ARGS[id(x)] = (x, union([y.syms for y in _flat_args(x)]))
            parts.append(hit[1])
        elif isinstance(x, (frozenset, tuple)):
            parts.extend(y.syms for y in _flat_args(x))
    return union(parts)


_NO_SYMS = frozenset()


def union(sets) -> frozenset:
    """The union of frozensets, sharing the one set when they are all the same object (an
    opaque function's elements share their arguments' symbols)."""
    distinct = {id(x): x for x in sets if x}
    if not distinct:
        return _NO_SYMS
    if len(distinct) == 1:
        return next(iter(distinct.values()))
    return frozenset().union(*distinct.values())


class Atom(_Interned):
    """An interned leaf or opaque application. `kind` names it; `args` are canonical."""

    __slots__ = ("kind", "args", "id", "syms", "_hash")

    def __new__(cls, kind: str, args: tuple):
        a = _ATOMS.get((kind, args))
        if a is None:
            a = _intern(cls, _ATOMS, kind, args)
            a.id = next(_atom_ids)
            if kind == "sym":
                a.syms = frozenset((a.id,))
            ATOM_BY_ID[a.id] = a
        return a

    def __repr__(self) -> str:
        if self.kind == "sym":
            name, index = self.args[0], self.args[1]
            return f"{name}{list(index) if index else ''}"
        return f"{self.kind}({', '.join(map(repr, self.args))})"


def _flat_args(args):
    for x in args:
        if isinstance(x, (Poly, Bool)):
            yield x
        elif isinstance(x, (frozenset, tuple)):
            yield from _flat_args(x)


# -- booleans ----------------------------------------------------------------------------

_BOOLS: dict[tuple, Bool] = run_table({})


class Bool(_Interned):
    """An interned boolean term: const, cmp (poly REL 0), not, and, or, xor, sym."""

    __slots__ = ("kind", "args", "syms", "_hash")

    def __new__(cls, kind: str, args: tuple):
        b = _BOOLS.get((kind, args))
        return b if b is not None else _intern(cls, _BOOLS, kind, args)

    def __repr__(self) -> str:
        if self.kind == "const":
            return str(self.args[0])
        if self.kind == "cmp":
            return f"({self.args[1]!r} {self.args[0]} 0)"
        return f"{self.kind}({', '.join(map(repr, self.args))})"


def _num(c) -> Num:
    """Exact rational for a Python/numpy number: a float is the exact value of its bits,
    but a float64 1/n rounded is 1/n and one a pass read as a rational is that rational."""
    if isinstance(c, (int, Fraction)) and not isinstance(c, bool):
        return c
    if isinstance(c, (bool, np.bool_)):
        return int(c)
    if isinstance(c, (np.integer,)):
        return int(c)
    f = float(c)
    if math.isinf(f) or math.isnan(f):
        raise ValueError("non-finite")
    r = EXACT.get(f) or _FLOAT_CACHE.get(f)  # EXACT first: a pass may add to it later
    if r is None:
        r = Fraction(f)
        if r.denominator == 1:
            r = r.numerator
        else:  # 1/n rounded to float64 is 1/n (tv_ir/ir/float_constants.py)
            r = exact_reciprocal(f) or r
        if len(_FLOAT_CACHE) < 100_000:
            _FLOAT_CACHE[f] = r
    return r


_FLOAT_CACHE: dict[float, Num] = run_table({})


def _norm(c: Num) -> Num:
    if type(c) is int:  # the common case, without isinstance's ABC check for Fraction
        return c
    if isinstance(c, Fraction) and c.denominator == 1:
        return c.numerator
    return c


def _reciprocal(c: Num) -> Num:
    """1/c exactly (an int when it is one) of a non-zero coefficient. Most are 1 or -1
    (a monomial's coefficient inverted), which need no Fraction."""
    if type(c) is int:
        return c if c in (1, -1) else Fraction(1, c)
    if type(c) is Fraction:
        return _norm(Fraction(c.denominator, c.numerator))
    return _norm(Fraction(1) / c)


class Poly:
    """sum of coeff * monomial; immutable. `inf` is +1/-1 for the constants +inf/-inf.
    `dom` says where the value is what the terms say (elsewhere: some non-finite float);
    `infs` covers where that non-finite float may be an infinity (elsewhere it is NaN)."""

    __slots__ = ("terms", "inf", "dom", "infs", "_hash", "_syms")

    def __init__(
        self, terms: dict, inf: int = 0, dom: Bool | None = None, infs: Bool | None = None
    ):
        self.terms = terms
        self.inf = inf
        self.dom = TRUE if dom is None else dom
        self.infs = FALSE if infs is None or self.dom is TRUE else infs
        self._hash = None
        self._syms = None

    # -- identity ---------------------------------------------------------------------
    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((frozenset(self.terms.items()), self.inf, self.dom, self.infs))
        return self._hash

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, Poly)
            and self.inf == other.inf
            and self.dom is other.dom
            and self.infs is other.infs
            and self.terms == other.terms
        )

    @property
    def syms(self) -> frozenset:
        if self._syms is None:
            # one union over the distinct atoms: `s |= atom.syms` per occurrence copies the
            # growing set each time, quadratic in a residue of thousands of monomials
            atoms = {aid for m in self.terms for aid, _ in m}
            s = union([ATOM_BY_ID[aid].syms for aid in atoms])
            if self.dom is not TRUE:
                s = union([s, self.dom.syms, self.infs.syms])
            self._syms = s
        return self._syms

    def is_const(self) -> bool:
        # no term but the constant one (at most one key is the empty monomial): asked of
        # every divisor twice (`inverse`), at once rather than by a walk over the terms
        terms = self.terms
        return not self.inf and (not terms or (len(terms) == 1 and () in terms))

    def const_value(self) -> Num:
        return self.terms.get((), 0)

    def __repr__(self) -> str:
        if self.dom is FALSE:
            return "undefined"
        if self.dom is not TRUE:
            return f"({value(self)!r} where {self.dom!r})"
        if self.inf:
            return "inf" if self.inf > 0 else "-inf"
        if not self.terms:
            return "0"
        parts = []
        for m, c in sorted(self.terms.items(), key=lambda kv: kv[0]):
            mono = "*".join(repr(ATOM_BY_ID[a]) + (f"^{p}" if p != 1 else "") for a, p in m)
            parts.append(f"{c}*{mono}" if mono and c != 1 else (mono or str(c)))
        return " + ".join(parts)


TRUE = Bool("const", (True,))
FALSE = Bool("const", (False,))
ZERO = Poly({})
ONE = Poly({(): 1})
POS_INF = Poly({}, 1)
NEG_INF = Poly({}, -1)
UNDEFINED = Poly({}, 0, FALSE, TRUE)  # a non-finite value: inf or NaN (1/0, log(0), ...)
NAN = Poly({}, 0, FALSE, FALSE)  # NaN (0 * inf, inf - inf, sqrt(-1), a NaN constant)


def value(p: Poly) -> Poly:
    """p's terms without its definedness condition (what atoms store as arguments)."""
    return p if p.dom is TRUE else Poly(p.terms, p.inf)


def with_dom(p: Poly, d: Bool, infs: Bool | None = None) -> Poly:
    """p, defined only where d also holds; where d fails it may be an infinity where
    `infs` holds (default: anywhere), else it is NaN."""
    if d is TRUE:
        return p
    infs = TRUE if infs is None else infs
    if p.dom is not TRUE:
        infs = logical_or(p.infs, infs)
    d = logical_and(p.dom, d)
    if d is FALSE:
        return UNDEFINED if infs is not FALSE else NAN
    if d is p.dom and infs is p.infs:
        return p
    return Poly(p.terms, p.inf, d, infs)


def _infs2(p: Poly, q: Poly) -> Bool:
    """Where a strict combination of p and q may be an infinity (an infinite operand)."""
    if p.infs is FALSE:
        return q.infs
    if q.infs is FALSE or p.infs is q.infs:
        return p.infs
    return logical_or(p.infs, q.infs)


def _infs_all(items) -> Bool:
    out = FALSE
    for p in items:
        if p.infs is not FALSE and p.infs is not out:
            out = logical_or(out, p.infs)
    return out


def _dom2(p: Poly, q: Poly) -> Bool:
    if q.dom is TRUE or p.dom is q.dom:
        return p.dom
    if p.dom is TRUE:
        return q.dom
    return logical_and(p.dom, q.dom)


def _dom_all(items) -> Bool:
    d = TRUE
    for p in items:
        if p.dom is not TRUE and p.dom is not d:
            d = logical_and(d, p.dom)
    return d


def const(c) -> Poly:
    if isinstance(c, Poly):
        return c
    f = float(c) if not isinstance(c, (int, Fraction)) else None
    if f is not None and math.isinf(f):
        return POS_INF if f > 0 else NEG_INF
    if f is not None and math.isnan(f):
        return NAN
    c = _num(c)
    return Poly({(): c}) if c != 0 else ZERO


def atom_poly(a: Atom) -> Poly:
    return Poly({((a.id, 1),): 1})


class Key:
    """The identity of a family of symbols: a kind ("input", "cut", ...), a number (the
    argument number, the spec value id, ...) and the element type (integer symbols range
    over their type). The name is for printing only. No program text is a Key, so no name
    in a program can collide with one."""

    __slots__ = ("kind", "number", "dtype", "name", "_hash")

    def __init__(self, kind: str, number, dtype: str | None = None, name: str = ""):
        self.kind, self.number, self.dtype, self.name = kind, number, dtype, name
        self._hash = stable_hash(("Key", kind, number, dtype, name))

    def __eq__(self, other) -> bool:
        return isinstance(other, Key) and (
            (self.kind, self.number, self.dtype, self.name)
            == (other.kind, other.number, other.dtype, other.name)
        )

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return self.name or f"{self.kind}{self.number}"

    @property
    def int_range(self) -> tuple[int, int] | None:
        """The values an integer symbol ranges over (None: a real symbol)."""
        return dtype_range(self.dtype)


def dtype_range(dtype: str | None) -> tuple[int, int] | None:
    """The machine range of an integer element type as MLIR spells it (i1: 0..1), as the
    concrete interpreter holds it (TensorType.numpy_dtype); None for other types."""
    from tv_ir.ir.program import TensorType

    if dtype is None or not re.fullmatch(r"[su]?i\d+|index", dtype):
        return None
    t = TensorType((), dtype)
    if t.is_bool:
        return (0, 1)
    info = np.iinfo(t.numpy_dtype)
    return (int(info.min), int(info.max))


def symbol(name, index: tuple = ()) -> Poly:
    return atom_poly(Atom("sym", (name, tuple(int(i) for i in index))))


def symbol_array(name, shape: tuple) -> np.ndarray:
    """An object array of fresh symbols `name[index]`, one per element (`name`: a string
    or a Key)."""
    return symbol_array_ids(name, shape)[0]


SYMBOLS_BETWEEN_POLLS = 2**16 - 1  # a mask: the clock is read every 65,536 symbols


def symbol_array_ids(name, shape: tuple) -> tuple[np.ndarray, list[tuple[tuple, int]]]:
    """`symbol_array(name, shape)`, with each element's (index, atom id) in index order:
    the spec's cut-points make one symbol per element of every value, so this is
    `symbol(name, idx)` without its per-call overhead."""
    shape = tuple(int(n) for n in shape)
    out = np.empty(shape, dtype=object)
    flat = out.reshape(-1)
    ids = []
    for k, idx in enumerate(itertools.product(*map(range, shape))):
        if k and k & SYMBOLS_BETWEEN_POLLS == 0:  # millions at real sizes: seconds
            check_time()  # between polls (a small value, made after a stop, never polls)
        key = ("sym", (name, idx))
        a = _ATOMS.get(key)
        if a is None:
            a = object.__new__(Atom)
            a.kind, a.args, a._hash = "sym", key[1], next(_node_serials)
            a.id = next(_atom_ids)
            a.syms = frozenset((a.id,))
            _ATOMS[key] = a
            ATOM_BY_ID[a.id] = a
        flat[k] = Poly({((a.id, 1),): 1})
        ids.append((idx, a.id))
    return out, ids


def instantiate(arr, env: dict[int, float]) -> np.ndarray:
    """The numbers an array of terms denotes at `env` (symbol atom id -> value)."""
    arr = np.asarray(arr)
    if arr.dtype != object:
        return arr
    memo: dict = {}
    flat = [evaluate(e, env, memo) if isinstance(e, (Poly, Bool)) else e for e in arr.flat]
    if all(isinstance(v, (bool, np.bool_)) for v in flat):
        return np.array(flat, dtype=bool).reshape(arr.shape)
    return np.array(flat, dtype=np.float64).reshape(arr.shape)


def as_atom(p: Poly) -> Atom | None:
    """The atom if p is exactly one atom with coefficient 1 and power 1."""
    if len(p.terms) == 1:
        ((m, c),) = p.terms.items()
        if c == 1 and len(m) == 1 and m[0][1] == 1:
            return ATOM_BY_ID[m[0][0]]
    return None


# -- ring operations -------------------------------------------------------------------


def _mono_mul(a: Mono, b: Mono) -> Mono:
    if not a:
        return b
    if not b:
        return a
    if len(b) == 1 and len(a) <= 3:
        x, f = b[0]
        out = []
        placed = False
        for y, e in a:
            if not placed and x <= y:
                placed = True
                if x == y:
                    if e + f:
                        out.append((x, e + f))
                    continue
                out.append((x, f))
            out.append((y, e))
        if not placed:
            out.append((x, f))
        return tuple(out)
    d = dict(a)
    for k, e in b:
        e2 = d.get(k, 0) + e
        if e2:
            d[k] = e2
        else:
            del d[k]
    return tuple(sorted(d.items()))


def add(p: Poly, q: Poly) -> Poly:
    dom = _dom2(p, q)
    if p.inf or q.inf:
        if p.inf and q.inf and p.inf != q.inf:
            return NAN  # inf - inf
        return with_dom(value(p if p.inf else q), dom, _infs2(p, q))
    if not p.terms:
        return with_dom(q, p.dom, p.infs)
    if not q.terms:
        return with_dom(p, q.dom, q.infs)
    if len(p.terms) < len(q.terms):
        p, q = q, p
    d = dict(p.terms)
    for m, c in q.terms.items():
        c2 = d.get(m, 0) + c
        if c2:
            d[m] = _norm(c2)
        else:
            del d[m]
    return with_dom(Poly(d), dom, _infs2(p, q))


def scale(p: Poly, c: Num) -> Poly:
    if p.inf:
        if c == 0:
            return NAN  # 0 * inf
        return with_dom(POS_INF if (p.inf > 0) == (c > 0) else NEG_INF, p.dom, p.infs)
    if c == 0:
        return with_dom(ZERO, p.dom, FALSE)  # 0 * inf and 0 * NaN are NaN
    if c == 1:
        return p
    return Poly({m: _norm(v * c) for m, v in p.terms.items()}, 0, p.dom, p.infs)


def neg(p: Poly) -> Poly:
    return scale(p, -1)


def sub(p: Poly, q: Poly) -> Poly:
    return add(p, neg(q))


def mul(p: Poly, q: Poly) -> Poly:
    dom = _dom2(p, q)
    if p.inf or q.inf:
        other = q if p.inf else p
        if not other.is_const():
            raise Unsupported("inf times a non-constant in a symbolic computation")
        inf = p if p.inf else q
        out = (
            scale(value(inf), other.const_value())
            if not other.inf
            else (POS_INF if p.inf == q.inf else NEG_INF)
        )
        return with_dom(out, dom, _infs2(p, q))
    if not p.terms or not q.terms:
        return with_dom(ZERO, dom, FALSE)  # 0 * inf is NaN
    if len(p.terms) == 1 and () in p.terms:
        return with_dom(scale(q, p.terms[()]), p.dom, p.infs)
    if len(q.terms) == 1 and () in q.terms:
        return with_dom(scale(p, q.terms[()]), q.dom, q.infs)
    d: dict = {}
    for m1, c1 in p.terms.items():
        for m2, c2 in q.terms.items():
            m = _mono_mul(m1, m2)
            c = d.get(m, 0) + c1 * c2
            if c:
                d[m] = c
            else:
                del d[m]
    return with_dom(Poly({m: _norm(c) for m, c in d.items()}), dom, _infs2(p, q))


def sum_of(items) -> Poly:
    """n-ary sum (one dictionary accumulation instead of n-1 binary adds)."""
    d: dict = {}
    inf = 0
    dom = TRUE
    infs = FALSE
    nan = False
    for p in items:
        p = lift(p)
        if p.dom is not TRUE and p.dom is not dom:
            dom = logical_and(dom, p.dom)
        if p.infs is not FALSE and p.infs is not infs:
            infs = logical_or(infs, p.infs)
        if p.inf:
            if inf and inf != p.inf:
                nan = True  # inf - inf is NaN
            inf = p.inf
            continue
        for m, c in p.terms.items():
            d[m] = d.get(m, 0) + c
    if nan:
        return NAN
    if inf:
        return with_dom(POS_INF if inf > 0 else NEG_INF, dom, infs)
    return with_dom(Poly({m: _norm(c) for m, c in d.items() if c}), dom, infs)


def _zero_number(x) -> bool:
    """A plain number (not a term) equal to 0."""
    if type(x) is Poly:  # the common case, without isinstance's ABC check for Fraction
        return False
    return isinstance(x, (int, float, Fraction, np.integer, np.floating, np.bool_)) and x == 0


def _finite_everywhere(x) -> bool:
    """A finite number, or a term defined and finite wherever it is evaluated."""
    if isinstance(x, Poly):
        return not x.inf and x.dom is TRUE
    if isinstance(x, (int, Fraction, np.integer, np.bool_)):
        return True
    return isinstance(x, (float, np.floating)) and math.isfinite(x)


def dot(xs, ys) -> Poly:
    """sum_i xs[i] * ys[i], accumulated in one dictionary."""
    d: dict = {}
    dom = TRUE
    infs = FALSE
    for x, y in zip(xs, ys, strict=True):
        if (_zero_number(x) and _finite_everywhere(y)) or (
            _zero_number(y) and _finite_everywhere(x)
        ):
            # 0 times a finite value adds nothing and guards nothing (a convolution's
            # padding: most of its products); 0 times a term that may be undefined or
            # infinite keeps that term's conditions, below
            continue
        x, y = lift(x), lift(y)
        if x.inf or y.inf:
            return sum_of(mul(a, b) for a, b in zip(map(lift, xs), map(lift, ys), strict=True))
        for p in (x, y):
            if p.dom is not TRUE and p.dom is not dom:
                dom = logical_and(dom, p.dom)
            if p.infs is not FALSE and p.infs is not infs:
                infs = logical_or(infs, p.infs)
        for m1, c1 in x.terms.items():
            for m2, c2 in y.terms.items():
                m = _mono_mul(m1, m2)
                d[m] = d.get(m, 0) + c1 * c2
    return with_dom(Poly({m: _norm(c) for m, c in d.items() if c}), dom, infs)


def power_int(p: Poly, n: int) -> Poly:
    if n == 0:
        return ONE  # pow(x, 0) is 1 for every x, NaN included
    if n < 0:
        return power_int(inverse(p), -n)
    r = ONE
    base = p
    while n:
        if n & 1:
            r = mul(r, base)
        n >>= 1
        if n:
            base = mul(base, base)
    return r


def leading(p: Poly) -> tuple[Mono, Num]:
    m = min(p.terms)
    return m, p.terms[m]


def inverse(p: Poly) -> Poly:
    """1/p: constants and single monomials invert exactly, others become an `inv` atom;
    defined where p is defined and non-zero (1/inf = 0 maps a non-finite value back)."""
    if p.dom is not TRUE:
        return _guarded("inv", (p,), lambda v: inverse(v[0]))
    if p.inf:
        return ZERO
    if not p.terms:
        return UNDEFINED  # 1/0 is inf (and x * (1/0) NaN where x = 0)
    if len(p.terms) == 1:
        ((m, c),) = p.terms.items()
        out = Poly({tuple((a, -e) for a, e in m): _reciprocal(c)})
        return out if not m else with_dom(out, _nonzero(p), _cmp("==", p))
    g = _common_factor(p)
    if g:  # 1/(g * q) = g^-1 * 1/q: a factor every term shares leaves the inv atom
        q = Poly({_mono_mul(m, tuple((a, -e) for a, e in g)): c for m, c in p.terms.items()})
        return mul(inverse(Poly({g: 1})), inverse(q))
    m, c = leading(p)
    r = _reciprocal(c)
    unit = scale(p, r)
    out = scale(atom_poly(Atom("inv", (unit,))), r)
    return with_dom(out, _nonzero(p), _cmp("==", p))


def _common_factor(p: Poly) -> Mono:
    """The monomial every term of p is a multiple of (atoms to their lowest power)."""
    monos = list(p.terms)
    common = dict(monos[0])
    for m in monos[1:]:
        powers = dict(m)
        for a in list(common):
            e = powers.get(a)
            if e is None or (e > 0) != (common[a] > 0):
                del common[a]
            else:
                common[a] = min(common[a], e) if e > 0 else max(common[a], e)
        if not common:
            return ()
    return tuple(sorted(common.items()))


def _nonzero(p: Poly) -> Bool:
    return logical_not(_cmp("==", value(p)))


# -- operations applied where their operands are defined -------------------------------

_opaque_ids = itertools.count()


def _guarded(kind: str, args: tuple, apply) -> Poly:
    """`apply` on the operands' values where all are defined; NaN where one is NaN (every
    guarded operation propagates NaN); where one may be an infinity, a fresh opaque value
    (this application's own: exp(-inf) = 0, 1/inf = 0, and two applications to equal
    terms may see different infinities, as reals have no signed zero)."""
    dom = _dom_all(args)
    known = with_dom(apply([value(a) for a in args]), dom, FALSE)
    maybe_inf = logical_and(logical_not(dom), _infs_all(args))
    if maybe_inf is FALSE:
        return known
    uid = next(_opaque_ids)
    unknown = atom_poly(Atom("opaque", (uid, kind, tuple(args))))
    fin = Bool("opaque", (uid, "fin", (unknown,)))
    unknown = Poly(unknown.terms, 0, fin, logical_not(fin))
    return select(maybe_inf, unknown, known)


def _guarded_bool(kind: str, args: tuple, apply, on_nan: Bool | None = FALSE) -> Bool:
    """A predicate of operands that may be undefined (see `_guarded`): `on_nan` where an
    operand is NaN (NaN compares unequal to everything); None: unknown there too (a
    total-order comparison depends on the NaN's sign bit)."""
    dom = _dom_all(args)
    known = apply([value(a) for a in args])
    infs = _infs_all(args) if on_nan is not None else TRUE
    maybe_inf = logical_and(logical_not(dom), infs)
    nan = logical_and(logical_not(dom), logical_not(infs))
    out = logical_or(logical_and(dom, known), logical_and(nan, on_nan or FALSE))
    if maybe_inf is FALSE:
        return out
    unknown = Bool("opaque", (next(_opaque_ids), kind, tuple(args)))
    return logical_or(out, logical_and(maybe_inf, unknown))


def div(p: Poly, q: Poly) -> Poly:
    return mul(p, inverse(q))


# -- opaque functions ------------------------------------------------------------------

# functions whose result is non-finite whenever their argument is (inf and NaN in, non-finite
# out); the others (exp(-inf) = 0, tanh(inf) = 1, rsqrt(inf) = 0, ...) are `_guarded`
_STRICT = frozenset(
    (
        "log",
        "log1p",
        "sqrt",
        "sin",
        "cos",
        "tan",
        "cbrt",
        "floor",
        "ceil",
        "round_nearest_afz",
        "round_nearest_even",
        "lgamma",
        "digamma",
        "erf_inv",
    )
)


def _cast_to_float(name: str) -> bool:
    """A bit cast to floats (`bitcast_SRC_DST[_j]`, semantics/bit_casts.py): some bit
    patterns are infinities or NaNs."""
    parts = name.split("_")
    return parts[0] == "bitcast" and len(parts) > 2 and parts[2].startswith(("f", "bf"))


def _fn_domain(name: str, v: Poly) -> Bool:
    """Where a math function of a finite real argument is finite."""
    if _cast_to_float(name):
        return Bool("finite_at", (name, v))
    if name == "log":
        return _cmp(">", v)  # log(0) = -inf, log(-1) = NaN
    if name == "log1p":
        return _cmp(">", add(v, ONE))
    if name == "sqrt":
        return _cmp(">=", v)
    if name == "rsqrt":
        return _cmp(">", v)
    if name == "erf_inv":
        return logical_and(_cmp(">", add(v, ONE)), _cmp(">", sub(ONE, v)))
    if name in ("lgamma", "digamma"):  # poles at 0, -1, -2, ...
        return logical_or(_cmp(">", v), Bool("finite_at", (name, v)))
    return TRUE


def _fold(name: str, c: Num | float) -> Poly:
    """A math function of a constant, in float64 (NaN: undefined; +-inf: the constant)."""
    from tv_ir.semantics.algebra import UNARY

    with np.errstate(all="ignore"):
        v = float(np.asarray(UNARY[name](np.float64(float(c)))).reshape(()))
    return const(v)


def fn(name: str, p: Poly) -> Poly:
    """An opaque math function of a canonical argument (constant arguments fold in float64),
    defined where its argument is defined and in the function's domain."""
    if p.dom is not TRUE and name not in _STRICT:
        return _guarded(name, (p,), lambda v: fn(name, v[0]))
    if p.inf:
        if name == "exp":
            return ZERO if p.inf < 0 else POS_INF
        if name in ("tanh", "sign", "erf"):
            return const(float(p.inf))
        if name == "logistic":
            return ZERO if p.inf < 0 else ONE
        from tv_ir.semantics.algebra import UNARY

        if name not in UNARY:
            raise Unsupported(f"{name}(inf) in a symbolic computation")
        # the function at the infinity itself, folded as any constant: sin(inf) is NaN
        # (undefined), sqrt(inf) is inf (a padded tile's rsqrt(0), then its sine)
        return with_dom(_fold(name, math.inf * p.inf), p.dom, p.infs)
    v = value(p)
    if p.is_const():
        return with_dom(_fold(name, p.const_value()), p.dom, p.infs)
    if name == "exp" and (len(v.terms) > 1 or next(iter(v.terms.values())) != 1):
        return with_dom(_exp_of_sum(v), p.dom, p.infs)
    if name == "log":
        split = _log_of_exp_factors(v)
        if split is not None:
            return with_dom(split, p.dom, p.infs)
    out = atom_poly(Atom("fn", (name, v)))
    return with_dom(out, logical_and(p.dom, _fn_domain(name, v)), _fn_infs(name, p, v))


def _exp_of_sum(v: Poly) -> Poly:
    """exp(a + k b) = exp(a) * exp(b)^k for whole k: exp(s - max) is exp(s) / exp(max), so
    a softmax with and without its max subtracted has one normal form. The constant and
    the fractional multiples stay in one exp atom."""
    out, rest = ONE, {}
    for m, c in v.terms.items():
        if m and (c == int(c)):
            out = mul(out, power_int(_exp_atom(Poly({m: 1})), int(c)))
        else:
            rest[m] = c
    if rest:
        r = Poly(rest)
        out = mul(out, _exp_constant(r) if r.is_const() else _exp_atom(r))
    return value(out)


def _exp_constant(r: Poly) -> Poly:
    """exp of a constant split off a sum: folded where float64 holds it as a normal number;
    else an atom, positive and opaque. exp(-1e9) folded to 0.0 made exp(x - 1e9) = 0 for
    every x, though at x = 1e9 it is 1 (the proof is over the reals)."""
    with np.errstate(all="ignore"):
        v = float(np.exp(np.float64(float(r.const_value()))))
    if np.isfinite(v) and v >= np.finfo(np.float64).tiny:
        return const(v)
    return _exp_atom(r)


def _exp_atom(v: Poly) -> Poly:
    return atom_poly(Atom("fn", ("exp", v)))


def _log_of_exp_factors(v: Poly) -> Poly | None:
    """log(exp(a)^k * q) = k a + log q (exp(a) > 0, so the domains agree): a log-sum-exp
    with and without its max factored out has one normal form. None: no exp factor."""
    g = _common_factor(v) if len(v.terms) > 1 else next(iter(v.terms))
    exps = tuple(
        (a, e) for a, e in g if ATOM_BY_ID[a].kind == "fn" and ATOM_BY_ID[a].args[0] == "exp"
    )
    if not exps:
        return None
    q = Poly({_mono_mul(m, tuple((a, -e) for a, e in exps)): c for m, c in v.terms.items()})
    out = fn("log", q)
    for a, e in exps:
        out = add(out, scale(ATOM_BY_ID[a].args[1], e))
    return out


def _fn_infs(name: str, p: Poly, v: Poly) -> Bool:
    """Where a strict math function's undefined result may be an infinity."""
    keeps = FALSE if name in ("sin", "cos", "tan") else p.infs  # sin(inf) is NaN
    if name in ("log", "rsqrt"):  # log(0) = -inf, rsqrt(0) = inf
        return logical_or(keeps, _cmp("==", v))
    if name == "log1p":
        return logical_or(keeps, _cmp("==", add(v, ONE)))
    if name in ("erf_inv", "lgamma", "digamma") or _cast_to_float(name):
        return logical_or(keeps, logical_not(_fn_domain(name, v)))
    return keeps


def power(x: Poly, y: Poly) -> Poly:
    """x ** y for a non-constant or fractional exponent: an opaque `pow` atom, defined for
    x > 0, for x = 0 with y >= 0, and for x < 0 with an integer y (else inf or NaN)."""
    if x.dom is not TRUE or y.dom is not TRUE:  # pow(NaN, 0) = 1
        return _guarded("pow", (x, y), lambda v: power(v[0], v[1]))
    dom = logical_or(
        _cmp(">", x),
        logical_or(
            logical_and(_cmp("==", x), _cmp(">=", y)),
            logical_and(_cmp(">", neg(x)), Bool("finite_at", ("integer", y))),
        ),
    )
    return with_dom(atom_poly(Atom("pow", (x, y))), dom, logical_not(dom))


def atan2(y: Poly, x: Poly) -> Poly:
    """atan2(y, x): finite for finite arguments (atan2(1, inf) = 0: guarded)."""
    if x.dom is not TRUE or y.dom is not TRUE:
        return _guarded("atan2", (y, x), lambda v: atan2(v[0], v[1]))
    return atom_poly(Atom("atan2", (y, x)))


def is_finite(p) -> Bool:
    """Whether p is a finite number: where it is defined, unless its value may itself be an
    infinity (a select of a -inf mask, ...), which is left opaque."""
    p = lift(p)
    if p.inf:
        return FALSE
    if _may_be_infinite(p):
        return Bool("opaque", (next(_opaque_ids), "is_finite", (p,)))
    return p.dom


_MAY_INF: dict[int, bool] = run_table({})


def _may_be_infinite(p: Poly) -> bool:
    """Whether p's value (where defined) may be an infinity: some atom has an inf branch."""
    if p.inf:
        return True
    return any(_atom_may_be_infinite(aid) for m in p.terms for aid, _ in m)


def _atom_may_be_infinite(aid: int) -> bool:
    hit = _MAY_INF.get(aid)
    if hit is None:
        a = ATOM_BY_ID[aid]
        if a.kind in ("sym", "opaque", "wrap"):
            hit = False
        else:
            hit = any(isinstance(x, Poly) and _may_be_infinite(x) for x in _flat_args(a.args))
        _MAY_INF[aid] = hit
    return hit


def maximum(items, is_max: bool = True) -> Poly:
    """AC-normalised max (or min): flattened, deduplicated, constants folded."""
    kind = "max" if is_max else "min"
    items = [lift(p) for p in items]
    if any(p.dom is not TRUE for p in items):  # max(-inf, x) = x: guarded
        return _guarded(kind, tuple(items), lambda v: maximum(v, is_max))
    args: set = set()
    consts: list = []
    for p in items:
        a = as_atom(p)
        if a is not None and a.kind == kind:
            args |= a.args[0]
        elif p.inf or p.is_const():
            consts.append(p)
        else:
            args.add(p)
    if consts:
        best = _const_extreme(consts, is_max)
        if best.inf == (1 if is_max else -1):
            return best
        if not (best.inf == (-1 if is_max else 1)):
            args.add(best)
    if not args:
        return _const_extreme(consts, is_max)
    if len(args) == 1:
        return next(iter(args))
    if len(args) == 2:
        a, b = args
        d = sub(a, b)
        if d.is_const():
            bigger = d.const_value() > 0
            return a if bigger == is_max else b
        # a difference of known sign wherever both are defined (|s| for a sum of
        # exponentials s, as jax.nn.logsumexp takes it: s - (-s) = 2 s > 0)
        s = sign(d)
        if s:
            return a if (s > 0) == is_max else b
    return atom_poly(Atom(kind, (frozenset(args),)))


def _const_extreme(consts, is_max):
    def key(p):
        return float(p.inf) * math.inf if p.inf else p.const_value()

    return (max if is_max else min)(consts, key=key)


def bconst(v) -> Bool:
    return TRUE if bool(v) else FALSE


def _unit(p: Poly) -> tuple[Poly, Num]:
    """p scaled so its leading coefficient is +-1; returns (unit, |scale|)."""
    _, c = leading(p)
    a = abs(c)
    return scale(p, _reciprocal(a)), a


def compare(direction: str, x, y, total_order: bool = False) -> Bool:
    """x REL y over the reals; where an operand is undefined, what IEEE (or, with
    `total_order`, IEEE totalOrder) says of NaN, and nothing where it may be infinite."""
    x, y = lift(x), lift(y)
    if x.dom is not TRUE or y.dom is not TRUE:  # inf > 0 but not NaN > 0: guarded
        return _guarded_bool(
            f"compare {direction}",
            (x, y),
            lambda v: compare(direction, v[0], v[1]),
            None if total_order else TRUE if direction == "NE" else FALSE,
        )
    if x.inf or y.inf:
        if x.is_const() or x.inf:
            if y.is_const() or y.inf:
                xv = math.inf * x.inf if x.inf else float(x.const_value())
                yv = math.inf * y.inf if y.inf else float(y.const_value())
                return bconst(_CMP[direction](xv, yv))
        # a finite non-constant term against an infinity
        if direction in ("EQ",):
            return FALSE
        if direction == "NE":
            return TRUE
        big = y.inf if y.inf else -x.inf  # sign of (y - x) at infinity
        return bconst(big > 0) if direction in ("LT", "LE") else bconst(big < 0)
    if direction == "LT":
        return _cmp(">", sub(y, x))
    if direction == "LE":
        return _cmp(">=", sub(y, x))
    if direction == "GT":
        return _cmp(">", sub(x, y))
    if direction == "GE":
        return _cmp(">=", sub(x, y))
    if direction == "EQ":
        return _cmp("==", sub(x, y))
    if direction == "NE":
        return logical_not(_cmp("==", sub(x, y)))
    raise Unsupported(f"comparison {direction}")


_CMP = {
    "EQ": lambda a, b: a == b,
    "NE": lambda a, b: a != b,
    "LT": lambda a, b: a < b,
    "LE": lambda a, b: a <= b,
    "GT": lambda a, b: a > b,
    "GE": lambda a, b: a >= b,
}


def _cmp(rel: str, d: Poly) -> Bool:
    if d.inf:  # an infinity (a substituted -inf mask, x + 1/0): its sign decides
        return bconst(rel != "==" and d.inf > 0)
    if d.is_const():
        v = d.const_value()
        return bconst(v > 0 if rel == ">" else v >= 0 if rel == ">=" else v == 0)
    if rel == "==":
        known = _equals_fact(d)
        if known is None:
            known = _wrap_equals(d)
        if known is not None:
            return known
    s = sign(d)  # facts that hold wherever d is defined (exp > 0, squares >= 0, ...)
    if s:
        if rel == "==" and abs(s) == 2:
            return FALSE
        if rel == ">" and s < 0 or rel == ">=" and s == -2:
            return FALSE
        if rel == ">" and s == 2 or rel == ">=" and s > 0:
            return TRUE
    u, _ = _unit(d)
    if rel == "==" and leading(u)[1] < 0:
        u = neg(u)
    return Bool("cmp", (rel, u))


def _equals_fact(d: Poly) -> Bool | None:
    """`d == 0` from d's structure, when it is `a + b * x` for an atom x whose structure says
    where it is 0 or 1 (None: nothing known beyond the comparison itself). A power c**e of a
    constant base c > 0, c != 1 is positive and is 1 exactly where e is 0, so AdamW's bias
    correction `1 - b1**t` is zero where `t == 0`, the same condition as `1 - b2**t`'s (as
    opaque atoms the two were unrelated); a cut symbol keeps its definition's facts
    (`note_levels`), so the two corrections stay one condition past their cut-points."""
    if len(d.terms) > 2 or d.dom is not TRUE or d.inf:
        return None
    a = d.terms.get((), 0)
    rest = [(m, c) for m, c in d.terms.items() if m]
    if len(rest) != 1 or len(rest[0][0]) != 1 or rest[0][0][0][1] != 1:
        return None
    (aid, _), b = rest[0][0][0], rest[0][1]
    target = Fraction(-a) / Fraction(b)
    if target <= 0 and _atom_sign(aid) == 2:
        return FALSE  # x > 0 wherever it is defined
    if ATOM_BY_ID[aid].kind == "select":
        known = _select_equals(aid, target)
        if known is not None:
            return known
    if target in (0, 1):
        return _atom_equals(aid, int(target))
    return None


# (select atom id, k) -> where the select equals k, when its branches decide it for good
_SELECT_LEVEL: dict[tuple[int, Fraction], Bool | None] = run_table({})


def _select_equals(aid: int, k: Fraction) -> Bool | None:
    """`select(c, x, y) == k` when `(c and x == k) or (not c and y == k)` folds to a
    constant (None: it does not). A division's guard `select(n == 0, 1, n)` is never 0:
    where n == 0 it is 1, elsewhere it is n, which is not 0 there; so the count of valid
    labels a loss divides by adds no definedness condition (without this, every value
    behind the loss carried `not(select(n == 0, 1, n) == 0)` per token, and an embedding
    gradient's update conjoined them per vocabulary row until memory ran out)."""
    key = (aid, k)
    if key in _SELECT_LEVEL:
        return _SELECT_LEVEL[key]
    _SELECT_LEVEL[key] = None  # a select inside its own branches cannot recurse forever
    c, x, y = ATOM_BY_ID[aid].args
    kc = const(k)
    out = logical_or(
        logical_and(c, _cmp("==", sub(x, kc))), logical_and(logical_not(c), _cmp("==", sub(y, kc)))
    )
    known = out if out.kind == "const" else None
    _SELECT_LEVEL[key] = known
    return known


def _wrap_equals(d: Poly) -> Bool | None:
    """`wrap(q + k) == t` for a machine integer wrap: `q + k` and t are congruent modulo
    2**bits, and where q's integer values span fewer than 2**bits consecutive integers at
    most one of them, v, is congruent to `t - k`: the comparison is `q == v` (FALSE when no
    value is, or when t is no value of the wrap's type). So a device's local index into its
    vocabulary shard, `wrap(token - offset) == j`, is the spec's `token == offset + j`
    (XLA's partitioned scatter-add against the spec's; None: not of that form)."""
    if len(d.terms) > 2 or d.dom is not TRUE or d.inf:
        return None
    a = d.terms.get((), 0)
    rest = [(m, c) for m, c in d.terms.items() if m]
    if len(rest) != 1 or len(rest[0][0]) != 1 or rest[0][0][0][1] != 1:
        return None
    (aid, _), b = rest[0][0][0], rest[0][1]
    w = ATOM_BY_ID[aid]
    if w.kind != "wrap" or not _integral_poly(w.args[0]):
        return None
    inner, bits, signed = w.args
    target = Fraction(-a) / Fraction(b)
    lo, hi = int_bounds(bits, signed)
    if target.denominator != 1 or not lo <= target <= hi:
        return FALSE  # a wrap takes only integers of its type's range
    k = inner.terms.get((), 0)
    q = sub(inner, const(k))
    r = int_range(q)
    if r is None or r[1] - r[0] >= 1 << bits:
        return None
    v = r[0] + (int(target) - k - r[0]) % (1 << bits)
    return FALSE if v > r[1] else _cmp("==", sub(q, const(v)))


# where a cut symbol equals 0 or 1, as its definition's structure says: (atom id, k) -> Bool
_SYM_LEVEL: dict[tuple[int, int], Bool] = run_table({})


def _atom_equals(aid: int, k: int) -> Bool | None:
    """Where atom `aid` equals the constant k (0 or 1), from its structure (None: unknown)."""
    a = ATOM_BY_ID[aid]
    if a.kind == "sym":
        _settle_later(aid)
        return _SYM_LEVEL.get((aid, k))
    if a.kind == "pow" and k == 1 and a.args[0].is_const():
        base, exponent = a.args[0].const_value(), a.args[1]
        if base > 0 and base != 1 and exponent.dom is TRUE:
            return _cmp("==", exponent)
    return None


def note_levels(p: Poly, definition: Poly) -> None:
    """Record where a symbol (a cut-point) is 0 and where it is 1, as its definition's
    structure says: the symbol equals its definition wherever it is defined, so `c2 == 0`
    for the cut-point of `c2 = 1 - b2**t` is `t == 0`, as it is for `c1 = 1 - b1**t`."""
    a = as_atom(p)
    if a is None or a.kind != "sym" or definition.inf:
        return
    _note_levels(a, definition)


def _note_levels(a: Atom, definition: Poly) -> None:
    v = value(definition)
    for k in (0, 1):
        fact = _equals_fact(sub(v, const(k)))
        if fact is not None:
            _SYM_LEVEL[(a.id, k)] = fact


# cut symbols standing for `max(args)` (defined everywhere): atom id -> args; and for
# `select(c, 1, 0)`, an indicator of c: atom id -> c (`note_extremum`, `_attains_max`)
_SYM_MAX: dict[int, frozenset] = run_table({})
_SYM_INDICATOR: dict[int, Bool] = run_table({})


def note_extremum(p: Poly, definition: Poly) -> None:
    """Record what a symbol (a cut-point) needs for `_attains_max`: that it stands for a max
    of finitely many terms, or for the indicator `select(c, 1, 0)` of a condition c. Only
    definitions defined everywhere: where a term may be non-finite, `x == max(...)` may
    fail for every x (NaN)."""
    a = as_atom(p)
    if a is None or a.kind != "sym" or definition.dom is not TRUE or definition.inf:
        return
    d = as_atom(definition)
    if d is None:
        return
    if d.kind == "max":
        _SYM_MAX[a.id] = d.args[0]
    elif d.kind == "select" and d.args[1] == ONE and d.args[2] == ZERO:
        _SYM_INDICATOR[a.id] = d.args[0]


def _indicator(aid: int) -> Bool | None:
    """c, when atom `aid` is `select(c, 1, 0)` or a cut symbol standing for one."""
    a = ATOM_BY_ID[aid]
    if a.kind == "select" and a.args[1] == ONE and a.args[2] == ZERO:
        return a.args[0]
    return _SYM_INDICATOR.get(aid)


def _attains_max(p: Poly) -> bool:
    """Is p a positive sum of indicators `x == m` (`select(x == m, 1, 0)`, or cut symbols
    standing for them) covering every argument x of a max m (a symbol noted by
    `note_extremum`)? Then p >= 1 wherever it is defined: a max of
    finitely many reals is one of them (the count in the derivative of `reduce_max`,
    `sum(x == max(x))`, that jax divides by)."""
    conds = set()
    for m, c in p.terms.items():
        if not m:
            if c < 0:
                return False
            continue
        cond = _indicator(m[0][0]) if c > 0 and len(m) == 1 and m[0][1] == 1 else None
        if cond is None:
            return False
        conds.add(cond)
    if not conds:
        return False
    first = next(iter(conds))
    if first.kind != "cmp":
        return False
    for mono in first.args[1].terms:
        for aid, _ in mono:
            args = _SYM_MAX.get(aid)
            if args is not None:
                top = atom_poly(ATOM_BY_ID[aid])
                if all(compare("EQ", x, top) in conds for x in args):
                    return True
    return False


# -- simplification under a term's own condition ----------------------------------------


def settle(p):
    """p simplified where it matters, i.e. where it is defined: the facts its condition
    asserts (its literal conjuncts, such as `bias != 0`) decide parts of the rest of the
    condition and the selects in its value (a guard's opaque branch, say)."""
    if not isinstance(p, Poly) or p.dom is TRUE or p.dom is FALSE:
        return p
    for _ in range(4):
        facts = _literals(p.dom)
        if not facts:
            return p
        memo: dict = {}
        dom = _under(p.dom, facts, memo, top=True)
        val = _value_under(value(p), facts, memo)
        q = with_dom(val, dom, p.infs) if dom is not TRUE else val
        if q == p:
            return p
        p = q
        if p.dom is TRUE or p.dom is FALSE:
            return p
    return p


def _literals(b: Bool) -> frozenset:
    items = b.args[0] if b.kind == "and" else (b,)
    return frozenset(x for x in items if x.kind not in ("and", "or", "const"))


def _under(b: Bool, facts: frozenset, memo: dict, top: bool = False) -> Bool:
    """b with the facts true (and their negations false)."""
    if b.kind == "const" or not b.syms and b.kind != "opaque":
        return b
    if top and b in facts:
        return b  # the condition is itself the one fact: nothing to simplify
    hit = memo.get(b)
    if hit is not None and not top:
        return hit
    if not top and b in facts:
        out = TRUE
    elif b.kind in ("and", "or"):
        f = logical_and if b.kind == "and" else logical_or
        out = TRUE if b.kind == "and" else FALSE
        for x in b.args[0]:
            keep = top and b.kind == "and" and x in facts
            out = f(out, x if keep else _under(x, facts, memo))
    elif b.kind == "not":
        inner = b.args[0]
        out = FALSE if inner in facts else logical_not(_under(inner, facts, memo))
    elif not top and logical_not(b) in facts:
        out = FALSE
    else:
        out = b
    if not top:
        memo[b] = out
    return out


def _value_under(v: Poly, facts: frozenset, memo: dict) -> Poly:
    """v with the selects whose condition the facts decide replaced by their branch."""
    changed = False
    acc = []
    for m, c in v.terms.items():
        factors = []
        for aid, e in m:
            a = ATOM_BY_ID[aid]
            if a.kind == "select":
                cond = _under(a.args[0], facts, memo)
                if cond.kind == "const":
                    factors.append((a.args[1] if cond.args[0] else a.args[2], e))
                    changed = True
                    continue
            factors.append((atom_poly(a), e))
        acc.append((c, factors))
    if not changed:
        return v
    out = ZERO
    for c, factors in acc:
        term = const(c)
        for f, e in factors:
            term = value(mul(term, power_int(f, e)))
        out = add(out, term)
    return value(out)


# -- signs: facts that hold wherever a term is defined -----------------------------------
# 2: > 0, 1: >= 0, 0: unknown, -1: <= 0, -2: < 0

_ATOM_SIGN: dict[int, int] = run_table({})


def note_sign(p: Poly, s: int) -> None:
    """Record the sign of a symbol (a cut-point: the sign its definition has)."""
    a = as_atom(p)
    if a is not None and s:
        _ATOM_SIGN[a.id] = s


# facts about cut symbols worked out when first asked for: atom id -> (definition, deeper)
_LATER: dict[int, tuple] = run_table({})


def note_later(p: Poly, definition: Poly, deeper=None) -> None:
    """Record a cut symbol's sign and levels (`note_sign`, `note_levels`) to be worked out
    from its definition when first asked for: most cut symbols are never asked about,
    and the sign one op deeper (`deeper(definition)`) costs a substitution. The facts are
    the same whenever they are worked out (the definition does not change)."""
    a = as_atom(p)
    if a is not None and a.kind == "sym":
        _LATER[a.id] = (definition, deeper)


def forget_later() -> None:
    """Drop the facts not yet worked out (their prover's run is over)."""
    _LATER.clear()


def _settle_later(aid: int) -> None:
    job = _LATER.pop(aid, None)
    if job is None:
        return
    d, deeper = job
    s = sign(d)
    if not s and deeper is not None:
        s = sign(deeper(d))
    if s:
        _ATOM_SIGN[aid] = s
    if not d.inf:
        _note_levels(ATOM_BY_ID[aid], d)


def sign(p: Poly) -> int:
    """A sign that p has wherever it is defined, from its structure (0: unknown)."""
    if p.inf or not p.terms:
        return 0
    lo, hi = 2, -2  # the weakest and strongest monomial signs seen
    for m, c in p.terms.items():
        s = _mono_sign(m, c)
        if s == 0:
            return 0
        lo, hi = min(lo, s), max(hi, s)
    if lo > 0:  # every monomial >= 0
        return 2 if hi == 2 or _attains_max(p) else 1
    if hi < 0:
        return -2 if lo == -2 else -1
    return 0


def _mono_sign(m: Mono, c: Num) -> int:
    negative = c < 0
    strict = True
    for aid, e in m:
        a = _atom_sign(aid)
        if e % 2 == 0:
            a = 2 if abs(a) == 2 else 1
        elif e < 0 and a:
            a = 2 if a > 0 else -2  # 1/t with t >= 0, where defined: t > 0
        if a == 0:
            return 0
        strict = strict and abs(a) == 2
        negative ^= a < 0
    return (-1 if negative else 1) * (2 if strict else 1)


def _atom_sign(aid: int) -> int:
    s = _ATOM_SIGN.get(aid)
    if s is not None:
        return s
    if aid in _LATER:
        _settle_later(aid)
        s = _ATOM_SIGN.get(aid)
        if s is not None:
            return s
    a = ATOM_BY_ID[aid]
    k, args = a.kind, a.args
    s = 0
    if k == "fn":
        name = args[0]
        if name in ("exp", "rsqrt", "logistic"):
            s = 2
        elif name == "sqrt":
            s = 1
        elif name in ("tanh", "erf", "sign"):
            s = max(-1, min(1, sign(args[1])))
    elif k == "pow":  # a positive constant base: positive everywhere (where defined)
        base = args[0]
        s = 2 if base.is_const() and base.const_value() > 0 else 0
    elif k == "inv":
        t = sign(args[0])
        s = 2 if t > 0 else -2 if t < 0 else 0
    elif k in ("max", "min"):
        signs = [sign(x) for x in args[0]]
        if k == "max":
            if any(x == 2 for x in signs):
                s = 2
            elif any(x >= 1 for x in signs) or _is_abs(args[0]):
                s = 1
            elif all(x == -2 for x in signs):
                s = -2
            elif all(x <= -1 for x in signs):
                s = -1
        else:
            if any(x == -2 for x in signs):
                s = -2
            elif any(x <= -1 for x in signs):
                s = -1
            elif all(x == 2 for x in signs):
                s = 2
            elif all(x >= 1 for x in signs):
                s = 1
    elif k == "select":
        s = _select_sign(args[1], args[2])
    if k != "sym":
        _ATOM_SIGN[aid] = s
    return s


def _select_sign(x: Poly, y: Poly) -> int:
    """The sign both branches of a select share; a zero branch is both >= 0 and <= 0, so a
    boolean converted to a number (`select(c, 1, 0)`) is >= 0 and a count of them plus a
    positive epsilon is > 0 (MaxText's `total_weights + EPS`)."""
    signs = [None if p == ZERO else sign(p) for p in (x, y)]
    known = [s for s in signs if s is not None]
    if not known:
        return 0
    if all(s > 0 for s in known):
        return min(known) if len(known) == 2 else 1
    if all(s < 0 for s in known):
        return max(known) if len(known) == 2 else -1
    return 0


def _is_abs(args) -> bool:
    items = list(args)
    return len(items) == 2 and add(value(items[0]), value(items[1])) == ZERO


_NOT: dict[Bool, Bool] = run_table({})  # negations, both ways (a term's negation is built once)


def logical_not(b: Bool) -> Bool:
    if b.kind == "const":
        return bconst(not b.args[0])
    if b.kind == "not":
        return b.args[0]
    hit = _NOT.get(b)
    if hit is not None:
        return hit
    if b.kind == "cmp" and b.args[0] in (">", ">="):
        # not (p > 0)  <=>  -p >= 0 ;  not (p >= 0)  <=>  -p > 0
        out = _cmp(">=" if b.args[0] == ">" else ">", neg(b.args[1]))
    else:
        out = Bool("not", (b,))
    if out.kind != "const":
        _NOT[b] = out
        _NOT[out] = b
    return out


def logical_and(a: Bool, b: Bool) -> Bool:
    return _junction("and", a, b)


def logical_or(a: Bool, b: Bool) -> Bool:
    return _junction("or", a, b)


def _junction(kind: str, a: Bool, b: Bool) -> Bool:
    unit, absorb = (TRUE, FALSE) if kind == "and" else (FALSE, TRUE)
    if a is b:
        return a
    items: set = set()
    for x in (a, b):
        if x is absorb:
            return absorb
        if x is unit:
            continue
        if x.kind == kind:
            items |= x.args[0]
        else:
            items.add(x)
    if len(items) <= 8 and any(logical_not(x) in items for x in items):
        return absorb  # c and not c / c or not c
    if kind == "and" and 1 < len(items) <= 8:
        items = {x for x in items if not _implied_nonzero(x, items)}
    if not items:
        return unit
    if len(items) == 1:
        return next(iter(items))
    return Bool(kind, (frozenset(items),))


def _implied_nonzero(x: Bool, items: set) -> bool:
    """Is x `q != 0` for a q that another conjunct `p >= 0` (or `p > 0`) keeps away from 0,
    q being +-(p + k) for a constant k > 0 (k >= 0)? The clip `where(n < 1, g, g / n)` is
    defined where `n < 1` or where `n >= 1 and n != 0`: that is everywhere."""
    if x.kind != "not" or x.args[0].kind != "cmp" or x.args[0].args[0] != "==":
        return False
    q = x.args[0].args[1]
    for y in items:
        if y is x or y.kind != "cmp" or y.args[0] == "==":
            continue
        p = y.args[1]
        for sgn in _signs_matching(q, p):
            d = sub(scale(q, sgn), p)
            if d.is_const():
                k = d.const_value()
                if k > 0 or (k == 0 and y.args[0] == ">"):
                    return True
    return False


def _signs_matching(q: Poly, p: Poly) -> tuple[int, ...]:
    """The signs s for which `s * q - p` may be a constant (tried in this order): both
    signs when infinite or constant terms leave it open, else the one for which a
    non-constant monomial of q cancels with p's, if q and p have the same number of them
    (the sum is constant only if they all cancel: checking one, and the count, rules the
    other sign out without the sum's arithmetic on large polynomials)."""
    if q.inf or p.inf:
        return (1, -1)
    m = next((m for m in q.terms if m), None)
    if m is None:
        return (1, -1)
    nq = len(q.terms) - (() in q.terms)
    np_ = len(p.terms) - (() in p.terms)
    c = p.terms.get(m)
    if nq != np_ or c is None:
        return ()
    cq = q.terms[m]
    return tuple(sgn for sgn in (1, -1) if sgn * cq == c)


def logical_xor(a: Bool, b: Bool) -> Bool:
    if a.kind == "const":
        return logical_not(b) if a.args[0] else b
    if b.kind == "const":
        return logical_not(a) if b.args[0] else a
    if a is b:
        return FALSE
    return Bool("xor", (frozenset((a, b)),))


def select(c: Bool, x: Poly, y: Poly) -> Poly:
    """c ? x : y, defined where the chosen branch is (the other one may divide by zero)."""
    if c.kind == "const":
        return x if c.args[0] else y
    if x == y:
        return x
    if x.dom is y.dom:
        dom = x.dom
    else:
        dom = logical_or(logical_and(c, x.dom), logical_and(logical_not(c), y.dom))
    if x.infs is y.infs:
        infs = x.infs
    else:
        infs = logical_or(logical_and(c, x.infs), logical_and(logical_not(c), y.infs))
    x, y = value(x), value(y)
    if x == y:
        return with_dom(x, dom, infs)
    folded = _select_into_extremum(c, x, y)
    if folded is not None:
        return with_dom(folded, dom, infs)
    if c.kind == "not":
        c, x, y = c.args[0], y, x
    if c.kind == "cmp" and c.args[0] == ">=":
        # q >= 0 is not(-q > 0): keep one form so equal selects share one atom
        c, x, y = _cmp(">", neg(c.args[1])), y, x
    return with_dom(atom_poly(Atom("select", (c, x, y))), dom, infs)


def _select_into_extremum(c: Bool, x: Poly, y: Poly) -> Poly | None:
    """c ? max(y, u, ...) : y as max(y, c ? max(u, ...) : -inf) (min: +inf), exactly: an
    update combined into an accumulator where a condition holds (a max or min scatter, a
    guarded running max) becomes one more guarded item of a flat max, so the same updates
    combined in another order, or on other devices and then across them, meet the same
    normal form. Not for integers: their evaluation has no infinities."""
    if _integral_poly(x) or _integral_poly(y):
        return None
    for branch, other, cond in ((x, y, c), (y, x, None)):
        a = as_atom(branch)
        if a is None or a.kind not in ("max", "min"):
            continue
        b = as_atom(other)
        kept = b.args[0] if b is not None and b.kind == a.kind else frozenset((other,))
        if not kept < a.args[0]:
            continue
        is_max = a.kind == "max"
        rest = maximum(list(a.args[0] - kept), is_max)
        cond = c if cond is not None else logical_not(c)
        return maximum([*kept, select(cond, rest, NEG_INF if is_max else POS_INF)], is_max)
    return None


# -- lifting -----------------------------------------------------------------------------


def lift(x) -> Poly:
    if isinstance(x, Poly):
        return x
    if isinstance(x, Bool):
        return select(x, ONE, ZERO)
    if isinstance(x, np.ndarray):
        return lift(x.reshape(()).item() if x.dtype != object else x.reshape(())[()])
    return const(x)


def lift_bool(x) -> Bool:
    if isinstance(x, Bool):
        return x
    if isinstance(x, Poly):
        return compare("NE", x, ZERO)
    if isinstance(x, np.ndarray):
        return lift_bool(x.reshape(())[()])
    return bconst(x)


# -- opaque functions of many arguments ------------------------------------------------

# A loop whose trip count depends on the inputs (ops/control.py) and a large factorisation or
# triangular solve (ops/linalg.py) are kept whole: each element of their results is an
# opaque function of all the elements they read. `key` names the function (what computes
# it), so the same function of equal arguments is equal in both programs, and nothing else
# is known of it. OPAQUE_RUNNERS computes it on numbers (registered where it is met), for
# the values of its terms.
OPAQUE_RUNNERS: dict = run_table({})  # key -> (argument values) -> [[element values] per result]
_OPAQUE_RUNS: dict = run_table({})  # (key, argument values) -> results, a small memo
_OPAQUE_RUNS_KEPT = 256


class _Arguments(tuple):
    """An opaque function's arguments: a tuple hashed once (every element of the function's
    results is an atom holding it)."""

    def __hash__(self) -> int:
        h = self.__dict__.get("hash")
        if h is None:
            h = self.__dict__["hash"] = tuple.__hash__(self)
        return h


def opaque_elements(key: str, result: int, indices, args: tuple, kind: str) -> list:
    """Elements `indices` (flat) of result `result` of the function `key` at `args`
    (numbers or terms, all finite). `kind` is the element type's: "float" (defined where
    the function's value is finite: a loop may overflow, a factorisation fail), "int" (the
    caller wraps it to its type) or "pred"."""
    lifted = _Arguments(lift(p) for p in args)
    if any(p.dom is not TRUE or p.inf for p in lifted):
        raise Unsupported(f"{key.split(':')[0]} of a value that may be non-finite")
    out = []
    for index in indices:
        w = atom_poly(Atom("apply", (key, result, index, lifted)))
        if kind == "pred":
            out.append(_nonzero(w))
        elif kind == "float":
            out.append(with_dom(w, Bool("finite_at", ("apply", w))))
        else:
            out.append(w)
    return out


def _eval_opaque_element(a: Atom, env, memo):
    """An opaque element's value: its function run on the arguments' values."""
    key, result, index, args = a.args
    values = tuple(evaluate(x, env, memo) for x in args)
    out = _OPAQUE_RUNS.get((key, values))
    if out is None:
        runner = OPAQUE_RUNNERS.get(key)
        if runner is None:
            raise Unsupported(f"cannot evaluate {key}: it was not met in this process")
        out = runner(values)
        if len(_OPAQUE_RUNS) >= _OPAQUE_RUNS_KEPT:
            _OPAQUE_RUNS.clear()
        _OPAQUE_RUNS[(key, values)] = out
    return out[result][index]


# -- substitution and evaluation ------------------------------------------------------


class TermTooLarge(Unsupported):
    """A substitution produced more monomials than the caller allowed."""


def substitute(p, mapping: dict[int, Poly], memo: dict | None = None, limit: int | None = None):
    """Replace symbol atoms (by id) with terms, rebuilding normal forms.

    `limit` bounds the number of monomials of any rebuilt polynomial (TermTooLarge).
    """
    memo = {} if memo is None else memo
    if limit is not None:
        memo["limit"] = limit
    keys = mapping.keys()
    if isinstance(p, Bool):
        return _subst_bool(p, mapping, memo)
    if p.syms.isdisjoint(keys):
        return p
    hit = memo.get(("p", id(p)))
    if hit is not None and hit[0] is p:
        return hit[1]
    # the value from the substituted factors' values; definedness from p's own condition,
    # which already holds every condition its factors (symbols included) brought along
    dom = _subst_bool(p.dom, mapping, memo) if p.dom is not TRUE else TRUE
    infs = _subst_bool(p.infs, mapping, memo) if p.infs is not FALSE else FALSE
    if p.inf:
        out = with_dom(value(p), dom, infs)
        memo[("p", id(p))] = (p, out)
        return out
    acc: dict = {}
    inf_parts = []
    for m, c in p.terms.items():
        keep = []
        touched = []
        for aid, e in m:
            if ATOM_BY_ID[aid].syms.isdisjoint(keys):
                keep.append((aid, e))
            else:
                touched.append((aid, e))
        if not touched:
            acc[m] = acc.get(m, 0) + c
            continue
        factor = _factor(tuple(touched), mapping, memo)
        if factor.inf:
            inf_parts.append(mul(Poly({tuple(keep): c}), factor))
            continue
        keep_t = tuple(keep)
        for m2, c2 in factor.terms.items():
            mm = _mono_mul(keep_t, m2)
            acc[mm] = acc.get(mm, 0) + c * c2
        cap = memo.get("limit")
        if cap is not None and len(acc) > cap:
            raise TermTooLarge(f"expanded term has more than {cap} monomials")
    out = Poly({mm: _norm(v) for mm, v in acc.items() if v})
    if inf_parts:
        out = value(sum_of([out] + inf_parts))
    out = with_dom(out, dom, infs)
    memo[("p", id(p))] = (p, out)
    return out


def _factor(touched: tuple, mapping, memo) -> Poly:
    """Product of substituted atoms raised to their powers (memoised per combination)."""
    key = ("f", touched)
    hit = memo.get(key)
    if hit is not None:
        return hit
    out = ONE
    for aid, e in touched:
        pk = ("pow", aid, e)
        f = memo.get(pk)
        if f is None:
            f = value(power_int(value(_subst_atom(ATOM_BY_ID[aid], mapping, memo)), e))
            memo[pk] = f
        out = mul(out, f)
    memo[key] = out
    return out


def _subst_atom(a: Atom, mapping, memo) -> Poly:
    if a.id in mapping:
        return lift(mapping[a.id])  # a cut-point's expression may be a plain number
    hit = memo.get(("a", a.id))
    if hit is not None:
        return hit
    k, args = a.kind, a.args
    if k == "fn":
        out = fn(args[0], substitute(args[1], mapping, memo))
    elif k == "inv":
        out = inverse(substitute(args[0], mapping, memo))
    elif k in ("max", "min"):
        out = maximum([substitute(x, mapping, memo) for x in args[0]], k == "max")
    elif k == "select":
        out = select(
            _subst_bool(args[0], mapping, memo),
            substitute(args[1], mapping, memo),
            substitute(args[2], mapping, memo),
        )
    elif k == "pow":
        out = atom_poly(
            Atom("pow", (substitute(args[0], mapping, memo), substitute(args[1], mapping, memo)))
        )
    elif k == "atan2":
        out = atom_poly(
            Atom("atan2", (substitute(args[0], mapping, memo), substitute(args[1], mapping, memo)))
        )
    elif k == "opaque":
        uid, what, xs = args
        out = atom_poly(
            Atom("opaque", (uid, what, tuple(substitute(x, mapping, memo) for x in xs)))
        )
    elif k == "wrap":
        out = wrap(substitute(args[0], mapping, memo), args[1], args[2])
    elif k == "apply":
        xs = tuple(lift(substitute(x, mapping, memo)) for x in args[3])
        out = value(opaque_elements(args[0], args[1], [args[2]], xs, "int")[0])
    else:
        raise Unsupported(f"cannot substitute into atom kind {k}")
    memo[("a", a.id)] = out
    return out


def _subst_bool(b: Bool, mapping, memo) -> Bool:
    if b.syms.isdisjoint(mapping.keys()):
        return b
    hit = memo.get(("b", b))
    if hit is None:
        hit = memo[("b", b)] = _subst_bool_once(b, mapping, memo)
    return hit


def _subst_bool_once(b: Bool, mapping, memo) -> Bool:
    k, args = b.kind, b.args
    if k == "cmp":
        return _cmp(args[0], substitute(args[1], mapping, memo))
    if k == "not":
        return logical_not(_subst_bool(args[0], mapping, memo))
    if k in ("and", "or", "xor"):
        items = [_subst_bool(x, mapping, memo) for x in args[0]]
        f = {"and": logical_and, "or": logical_or, "xor": logical_xor}[k]
        out = items[0]
        for x in items[1:]:
            out = f(out, x)
        return out
    if k == "opaque":
        uid, what, xs = args
        return Bool("opaque", (uid, what, tuple(substitute(x, mapping, memo) for x in xs)))
    if k == "finite_at":
        return Bool("finite_at", (args[0], substitute(args[1], mapping, memo)))
    return b


def evaluate(p, env: dict[int, float], memo: dict | None = None) -> float:
    """Numeric value of a term given values for its symbol atoms (by atom id)."""
    memo = {} if memo is None else memo
    if isinstance(p, Bool):
        return _eval_bool(p, env, memo)
    return evaluate_with_scale(p, env, memo)[0]


def evaluate_with_scale(p: Poly, env, memo: dict | None = None) -> tuple[float, float]:
    """Value of p and the sum of its monomials' magnitudes (a scale for relative tolerances)."""
    memo = {} if memo is None else memo
    if p.dom is not TRUE and not _eval_bool(p.dom, env, memo):
        return math.nan, math.inf
    if p.inf:
        return math.inf * p.inf, math.inf
    total = scale = np.float64(0.0)
    with np.errstate(all="ignore"):  # float semantics: x / 0 is inf, 0 * inf is nan
        for m, c in p.terms.items():
            v = np.float64(float(c))
            for aid, e in m:
                v *= np.float64(_eval_atom(ATOM_BY_ID[aid], env, memo)) ** e
            total += v
            scale += abs(v)
    return float(total), float(scale)


class Perturbations:
    """`evaluate_with_scale` of one polynomial at a base point and then at points that move
    a few symbols each (the prover's culprit search moves each group of cut symbols of a
    residue in turn). The monomials are evaluated as arrays, an atom's value looked up by
    its slot, and only the atoms that read a moved symbol are evaluated again: per group a
    few array products instead of a Python loop over every monomial (residues of the
    optimizer's global norm have tens of thousands)."""

    def __init__(self, p: Poly, env: dict[int, float]):
        self.p, self.env = p, env
        # a partial domain or an infinite polynomial: every point is evaluated whole
        self.whole = p.dom is not TRUE or bool(p.inf)
        monomials = list(p.terms.items())
        slots: dict[int, int] = {}
        for m, _ in monomials:
            for aid, _ in m:
                slots.setdefault(aid, len(slots))
        self.atoms = list(slots)
        width = max((len(m) for m, _ in monomials), default=0)
        one = len(self.atoms)  # a slot whose value is 1, raised to the power 0
        self.index = np.full((len(monomials), width), one, dtype=np.int64)
        self.power = np.zeros((len(monomials), width), dtype=np.float64)
        for i, (m, _) in enumerate(monomials):
            for j, (aid, e) in enumerate(m):
                self.index[i, j], self.power[i, j] = slots[aid], e
        self.coef = np.array([float(c) for _, c in monomials], dtype=np.float64)
        # small whole powers as repeated factors (`x^2` as `x * x`, one rounding, the same
        # value): a product of gathered columns is several times faster than `np.power`
        self.factors = None
        if all(isinstance(e, int) and 1 <= e <= 4 for m, _ in monomials for _, e in m):
            depth = max((sum(e for _, e in m) for m, _ in monomials), default=0)
            self.factors = np.full((len(monomials), depth), one, dtype=np.int64)
            for i, (m, _) in enumerate(monomials):
                row = [slots[aid] for aid, e in m for _ in range(e)]
                self.factors[i, : len(row)] = row
        memo: dict = {}
        with np.errstate(all="ignore"):  # as evaluate_with_scale: sqrt(-1) is nan, silently
            self.atom_values = np.array(
                [_eval_atom(ATOM_BY_ID[aid], env, memo) for aid in self.atoms] + [1.0],
                dtype=np.float64,
            )
        self.slots_of_sym: dict[int, list[int]] = {}
        for k, aid in enumerate(self.atoms):
            for sym in ATOM_BY_ID[aid].syms:
                self.slots_of_sym.setdefault(sym, []).append(k)
        self.total, self.scale = self._sum(self.atom_values)

    def _sum(self, atom_values: np.ndarray) -> tuple[float, float]:
        with np.errstate(all="ignore"):  # float semantics: x / 0 is inf, 0 * inf is nan
            if self.factors is not None:
                v = self.coef * np.prod(atom_values[self.factors], axis=1)
                return float(v.sum()), float(np.abs(v).sum())
            v = self.coef.copy()
            for j in range(self.index.shape[1]):
                v *= np.power(atom_values[self.index[:, j]], self.power[:, j])
            return float(v.sum()), float(np.abs(v).sum())

    def at(self, moved: dict[int, float]) -> tuple[float, float]:
        """Value and scale of the polynomial with the symbols in `moved` at their new values."""
        env = dict(self.env)
        env.update(moved)
        if self.whole:
            return evaluate_with_scale(self.p, env)
        hit = {k for sym in moved for k in self.slots_of_sym.get(sym, ())}
        if not hit:
            return self.total, self.scale
        values = self.atom_values.copy()
        memo: dict = {}
        with np.errstate(all="ignore"):
            for k in hit:
                values[k] = _eval_atom(ATOM_BY_ID[self.atoms[k]], env, memo)
        return self._sum(values)


def _eval_atom(a: Atom, env, memo) -> float:
    if a.kind == "sym":
        return env[a.id]
    hit = memo.get(a.id)
    if hit is not None:
        return hit
    k, args = a.kind, a.args
    if k == "fn":
        from tv_ir.semantics.algebra import UNARY

        v = float(UNARY[args[0]](np.float64(evaluate(args[1], env, memo))))
    elif k == "inv":
        with np.errstate(all="ignore"):
            v = float(np.float64(1.0) / np.float64(evaluate(args[0], env, memo)))
    elif k in ("max", "min"):
        vals = [evaluate(x, env, memo) for x in args[0]]
        v = max(vals) if k == "max" else min(vals)
    elif k == "select":
        v = evaluate(args[1] if _eval_bool(args[0], env, memo) else args[2], env, memo)
    elif k == "pow":
        with np.errstate(all="ignore"):
            v = float(
                np.power(
                    np.float64(evaluate(args[0], env, memo)),
                    np.float64(evaluate(args[1], env, memo)),
                )
            )
    elif k == "atan2":
        v = math.atan2(evaluate(args[0], env, memo), evaluate(args[1], env, memo))
    elif k == "opaque":
        v = _eval_opaque(args[1], [evaluate(x, env, memo) for x in args[2]])
    elif k == "wrap":
        v = float(_eval_wrap(a, env, memo))
    elif k == "apply":
        v = _eval_opaque_element(a, env, memo)
    else:
        raise Unsupported(f"cannot evaluate atom kind {k}")
    memo[a.id] = v
    return v


def _eval_bool(b: Bool, env, memo) -> bool:
    k, args = b.kind, b.args
    if k == "const":
        return bool(args[0])
    if k == "cmp":
        v = evaluate(args[1], env, memo)
        return v > 0 if args[0] == ">" else v >= 0 if args[0] == ">=" else v == 0
    if k == "not":
        return not _eval_bool(args[0], env, memo)
    if k == "opaque":  # what the float operation gives (for simulation-guided heuristics)
        vals = [evaluate(x, env, memo) for x in args[2]]
        if args[1] in ("fin", "is_finite"):
            return bool(np.isfinite(vals[0]))
        return bool(_eval_opaque(args[1], vals))
    if k == "finite_at" and args[0] == "integer":
        v = evaluate(args[1], env, memo)
        return bool(np.isfinite(v) and float(v).is_integer())
    if k == "finite_at" and args[0] == "apply":
        return bool(np.isfinite(evaluate(args[1], env, memo)))
    if k == "finite_at":
        from tv_ir.semantics.algebra import UNARY

        with np.errstate(all="ignore"):
            return bool(np.isfinite(UNARY[args[0]](np.float64(evaluate(args[1], env, memo)))))
    vals = [_eval_bool(x, env, memo) for x in args[0]]
    if k == "and":
        return all(vals)
    if k == "or":
        return any(vals)
    if k == "xor":
        return sum(vals) % 2 == 1
    raise Unsupported(f"cannot evaluate boolean kind {k}")


def _eval_opaque(what: str, vals: list):
    """The float operation an opaque value stands for, on float arguments."""
    from tv_ir.semantics.algebra import UNARY

    with np.errstate(all="ignore"):
        x = [np.float64(v) for v in vals]
        if what == "inv":
            return float(np.float64(1.0) / x[0])
        if what in ("max", "min"):
            return float(np.max(x) if what == "max" else np.min(x))
        if what.startswith("compare "):
            return bool(_CMP[what.split()[1]](x[0], x[1]))
        if what == "pow":
            return float(np.power(x[0], x[1]))
        if what == "atan2":
            return float(np.arctan2(x[0], x[1]))
        return float(UNARY[what](x[0]))


def size(p, cap: int = 100_000) -> int:
    """A rough node count (definedness conditions included), for budgets."""
    if isinstance(p, Bool):
        return _bool_size(p, cap)
    n = sum(len(m) + 1 for m in p.terms)
    if p.dom is not TRUE:
        n += _bool_size(p.dom, cap)
    return n


def _bool_size(b: Bool, cap: int) -> int:
    """Nodes of a boolean term and the polynomials it compares (counted up to `cap`)."""
    n, stack, seen = 0, [b], set()
    while stack and n < cap:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        n += 1
        if isinstance(x, Poly):
            n += sum(len(m) + 1 for m in x.terms)
        elif x.kind in ("and", "or", "xor"):
            stack.extend(x.args[0])
        elif x.kind == "not":
            stack.append(x.args[0])
        elif x.kind == "cmp":
            stack.append(x.args[1])
    return n


# -- machine integers ---------------------------------------------------------------------
#
# An integer tensor element is a polynomial with integer coefficients over integer-valued
# atoms. `wrap(p, bits, signed)` is p reduced modulo 2**bits into the type's range (two's
# complement), as XLA computes every integer op. Reduction modulo 2**bits is a ring
# homomorphism, so a ring op may wrap once at its end, and a wrap inside a ring position of
# another wrap of at most as many bits can be dropped: that keeps normal forms canonical
# ((a + b) - b is a, a * 2 is a + a).

_RANGES: dict[int, tuple | None] = run_table({})
_INTEGRAL: dict[int, bool] = run_table({})


def int_bounds(bits: int, signed: bool) -> tuple[int, int]:
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


def wrap_int(v: int, bits: int, signed: bool) -> int:
    """v modulo 2**bits, in the type's range."""
    lo = int_bounds(bits, signed)[0]
    return (v - lo) % (1 << bits) + lo


def wrap(p: Poly, bits: int, signed: bool) -> Poly:
    """p as a machine integer of `bits` bits: p itself when its range fits, else a wrap."""
    lo, hi = int_bounds(bits, signed)
    if p.inf:
        raise Unsupported("an infinite integer")
    if p.is_const():
        return const(_wrap_const(p.const_value(), bits, signed))
    r = int_range(p)
    if r is not None and lo <= r[0] and r[1] <= hi:
        return p
    q = _reduce_mod(p, bits)
    if q is not p:
        if q.is_const():
            return const(_wrap_const(q.const_value(), bits, signed))
        r = int_range(q)
        if r is not None and lo <= r[0] and r[1] <= hi:
            return q
    return atom_poly(Atom("wrap", (q, bits, signed)))


def _wrap_const(c: Num, bits: int, signed: bool) -> int:
    if isinstance(c, Fraction):
        raise Unsupported(f"a non-integer value {c} of an integer type")
    return wrap_int(int(c), bits, signed)


def _ring_monomial(m: Mono, c) -> bool:
    """Whether c * m is an integer-valued product (reducible modulo 2**bits)."""
    return isinstance(c, int) and all(e > 0 and _integral(ATOM_BY_ID[a]) for a, e in m)


def _integral_poly(p: Poly) -> bool:
    return not p.inf and all(_ring_monomial(m, c) for m, c in p.terms.items())


def _integral(a: Atom) -> bool:
    """Whether an atom is known to take only integer values: an integer input symbol (its
    Key's type), a wrap, or a select / max / min of integer polynomials."""
    hit = _INTEGRAL.get(a.id)
    if hit is None:
        k, args = a.kind, a.args
        if k == "sym":
            hit = isinstance(args[0], Key) and args[0].int_range is not None
        elif k == "wrap":
            hit = True
        elif k == "select":
            hit = _integral_poly(args[1]) and _integral_poly(args[2])
        elif k in ("max", "min"):
            hit = all(_integral_poly(x) for x in args[0])
        else:
            hit = False
        _INTEGRAL[a.id] = hit
    return hit


def _reduce_mod(p: Poly, bits: int) -> Poly:
    """A polynomial congruent to p modulo 2**bits: wraps of at least `bits` bits in ring
    positions replaced by their arguments, coefficients reduced to (-2**(bits-1), 2**(bits-1)]."""
    mod, half = 1 << bits, 1 << (bits - 1)

    def reduced(q: Poly) -> Poly:
        """q, its coefficients reduced (q itself when none needs it)."""
        if all(-half < c <= half for c in q.terms.values()):
            return q
        d = {}
        for m, c in q.terms.items():
            if not -half < c <= half and _ring_monomial(m, c):
                c = c % mod
                if c > half:
                    c -= mod
            if c:
                d[m] = c
        return Poly(d)

    def inlinable(m: Mono, c) -> bool:
        return any(
            ATOM_BY_ID[a].kind == "wrap" and ATOM_BY_ID[a].args[1] >= bits for a, _ in m
        ) and _ring_monomial(m, c)

    while any(inlinable(m, c) for m, c in p.terms.items()):
        out, rest = ZERO, {}
        for m, c in p.terms.items():
            if not inlinable(m, c):
                rest[m] = c
                continue
            term = Poly({(): c})
            for a, e in m:
                at = ATOM_BY_ID[a]
                base = at.args[0] if at.kind == "wrap" and at.args[1] >= bits else atom_poly(at)
                term = reduced(mul(term, power_int(base, e)))
            out = add(out, term)
        p = add(out, Poly(rest))
    return reduced(p)


def int_range(p: Poly) -> tuple | None:
    """Bounds [lo, hi] of an integer polynomial's values (None when not known)."""
    if p.inf:
        return None
    lo = hi = 0
    for m, c in p.terms.items():
        a_lo = a_hi = c
        for aid, e in m:
            r = _RANGES.get(aid, _UNKNOWN)
            if r is _UNKNOWN:
                r = _atom_range(ATOM_BY_ID[aid])
            if r is None or e < 0:
                return None
            if e != 1:
                r = _interval_pow(r, e)
            if a_lo == a_hi:  # a number times an interval
                a_lo, a_hi = (a_lo * r[0], a_lo * r[1]) if a_lo >= 0 else (a_lo * r[1], a_lo * r[0])
            else:
                cands = (a_lo * r[0], a_lo * r[1], a_hi * r[0], a_hi * r[1])
                a_lo, a_hi = min(cands), max(cands)
        lo += a_lo
        hi += a_hi
    return lo, hi


_UNKNOWN = object()


def _interval_pow(r: tuple, e: int) -> tuple:
    lo, hi = r
    if e % 2 or lo >= 0:
        return (lo**e, hi**e)  # monotone
    if hi <= 0:
        return (hi**e, lo**e)
    return (0, max(-lo, hi) ** e)


def _atom_range(a: Atom) -> tuple | None:
    if a.id in _RANGES:
        return _RANGES[a.id]
    k, args = a.kind, a.args
    r = None
    if k == "sym":
        key = args[0]
        r = key.int_range if isinstance(key, Key) else None
    elif k == "wrap":
        r = int_bounds(args[1], args[2])
    elif k == "select":
        x, y = int_range(args[1]), int_range(args[2])
        if x is not None and y is not None:
            r = (min(x[0], y[0]), max(x[1], y[1]))
    elif k in ("max", "min"):
        rs = [int_range(x) for x in args[0]]
        if all(x is not None for x in rs):
            f = max if k == "max" else min
            r = (f(x[0] for x in rs), f(x[1] for x in rs))
    _RANGES[a.id] = r
    return r


def evaluate_int(p, env: dict, memo: dict | None = None) -> int:
    """The exact value of an integer term (a Poly, Bool or number) at `env`."""
    memo = {} if memo is None else memo
    if isinstance(p, Bool):
        return int(_eval_bool(p, env, memo))
    if isinstance(p, Poly):
        return _eval_int(p, env, memo)
    return int(p)


def _eval_wrap(a: Atom, env, memo) -> int:
    p, bits, signed = a.args
    return wrap_int(_eval_int(p, env, memo), bits, signed)


def _eval_int(p: Poly, env, memo) -> int:
    """The exact integer value of an integer polynomial (float64 would lose low bits)."""
    total = 0
    for m, c in p.terms.items():
        v = c
        for aid, e in m:
            v *= _int_atom_value(ATOM_BY_ID[aid], env, memo) ** e
        total += v
    return round(total)


def _int_atom_value(a: Atom, env, memo):
    k = a.kind
    if k == "wrap":
        key = ("int", a.id)
        v = memo.get(key)
        if v is None:
            v = memo[key] = _eval_wrap(a, env, memo)
        return v
    if k == "select":
        branch = a.args[1] if _eval_bool(a.args[0], env, memo) else a.args[2]
        return _eval_int(branch, env, memo)
    if k in ("max", "min"):
        vals = [_eval_int(x, env, memo) for x in a.args[0]]
        return max(vals) if k == "max" else min(vals)
    if k == "fn" and a.args[0].startswith("bitcast_"):  # exact on 64 bits, either source
        from tv_ir.semantics.algebra import UNARY

        if a.args[0].startswith(("bitcast_i", "bitcast_ui")):
            x = _eval_int(a.args[1], env, memo)
            v = UNARY[a.args[0]](x) if isinstance(x, int) else _eval_atom(a, env, memo)
        else:  # a float's bits
            v = UNARY[a.args[0]](float(evaluate(a.args[1], env, memo)))
    else:
        v = env[a.id] if k == "sym" else _eval_atom(a, env, memo)
    if isinstance(v, (int, np.integer)):
        return int(v)
    f = float(v)
    return int(f) if f.is_integer() else Fraction(f)
