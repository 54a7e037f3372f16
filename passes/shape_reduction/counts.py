"""Counts compared: a class whose size bounds a value that a comparison reads keeps its size.

A sum over n positions of values that lie in a fixed range whatever the input (a
comparison's 0 / 1, `sigmoid`, `tanh`, a select between constants) lies in n times that
range: the number of pad tokens in a row of 8 is 0 to 8, in a row of 2 only 0 to 2. The
argument that equality at reduced sizes carries over (docs/equivalence.md, "Why it carries
over") holds for such a sum where it is only computed with (`sum(l * m) / sum(m)`, a loss
normalised by its token count), not where a comparison reads it: `where(count(tok == PAD) >
2, 0, s)` drops a row with 3 pad tokens at 8 positions, and never does at 2, so the reduced
pair is equal where the real one is not. Random inputs do not find it either (no random
float equals 1.0; few random rows hold 3 pad tokens), so the concrete confirmations would
not catch the reduction's mistake.

So each program is walked once beside the shape rules, keeping for each value the least and
greatest element it can hold whatever the inputs (ranges.py: a comparison's 0 / 1,
`sigmoid`, constants, and what arithmetic and data movement make of bounded operands; the
relations between operands that bound a value, `x / sum(x)`, are followed here). A
sum of values bounded at both ends over a class (a `reduce` adding, a `dot_general`
contracting two bounded operands) is a *count* of that class, and so is everything computed
from a count; a count reaching an op whose result is not a smooth function of it
(`COMPARING`: a comparison, a clamp, a maximum, a floor, an index, a reduce other than a
sum, ...) keeps the classes it counts. A sum of values >= 0 (`exp`) is not a count: over
any number of positions it can be any positive number; one bounded at the far side of 0
(`x * x - 1`) is (`grows`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import numpy as np

from tv_ir.ir.program import Op, Value

from .classes import DimClasses, Key
from .ranges import (
    MOVING,
    SOME_CONSTANT,
    UNBOUNDED,
    boolean,
    data_operands,
    element_range,
    grows,
    infinite,
    integer,
    narrow,
    numpy_dtype,
    products,
    signed_sum,
    sums,
    zeros_and_ones,
)
from .windows import cumulative, whole_window

# elementwise ops without attributes: two with the same operands are the same value
SAME_FORM = {
    "stablehlo." + n
    for n in "add subtract multiply divide negate abs exponential sqrt rsqrt logistic tanh".split()
}
# the addends of a sum of adds followed (a denominator `a + b + c + eps`), at most
MAX_ADDENDS = 8
# collectives adding over devices
SUMMING = ("stablehlo.all_reduce", "stablehlo.reduce_scatter")
# ops whose results are not smooth functions of their operands: a count reaching one keeps
# its classes (`AGAINST` ops only where they meet something that is no count)
COMPARING = {
    "stablehlo." + n
    for n in (
        "floor ceil round_nearest_afz round_nearest_even remainder sort while case if "
        "custom_call bitcast_convert and or xor not shift_left shift_right_logical "
        "shift_right_arithmetic popcnt count_leading_zeros reduce_window select_and_scatter"
    ).split()
}
# ops that index with some operands: a count reaching one as an index (not as data) keeps
# its classes; op -> its data operands
INDEXING = {
    "stablehlo.dynamic_slice": (0,),
    "stablehlo.dynamic_update_slice": (0, 1),
    "stablehlo.gather": (0,),
    "stablehlo.scatter": None,  # operands, then indices, then updates: `_scatter_data`
}
# a count compared with a constant (or any other value that is no count): `count > 2`; two
# counts compared with each other (`count_a > count_b`, a softmax's scores less their max)
# compare sums that both grow with the class
AGAINST = {"stablehlo." + n for n in "compare clamp maximum minimum".split()}


class Counts:
    """The range of each value's elements and the counts of one program, met op by op
    (`step`, in program order). What a count counts is a key: a dimension class here
    (`ClassCounts`), a mesh axis for mesh reduction (its collectives sum over devices)."""

    def __init__(self, keep: Callable[[Hashable, str], None]) -> None:
        self.keep = keep  # (key, why): the key keeps its size
        self.ranges: dict[int, tuple[float, float]] = {}  # value id -> (least, greatest)
        self.counts: dict[int, tuple[tuple, str]] = {}  # value id -> (keys, where)
        self.indicators: set[int] = set()  # values whose elements are 0 or 1
        self.raw: set[int] = set()  # counts of indicators, not yet computed with
        self.maxima: dict[int, int] = {}  # a max (min) of values, and its copies -> the values
        self.origin: dict[int, int] = {}  # a copy (broadcast, reshape, convert) -> its value
        self.sum_of: dict[int, int] = {}  # a sum (and its copies) -> the value it sums
        self.negated: dict[int, int] = {}  # -x -> x
        self.squared: dict[int, int] = {}  # x * x -> x
        self.norm_of: dict[int, int] = {}  # sqrt(sum(x * x)) (and copies) -> x
        self.inverse_norm_of: dict[int, int] = {}  # rsqrt(sum(x * x)) (and copies) -> x
        self.nan_tests: set[int] = set()  # x != x
        self.extents: dict[int, float] = {}  # an integer value -> the largest |element|
        self.forms: dict[tuple, int] = {}  # (op, operands' origins) -> the first such value
        self.addends: dict[int, tuple] = {}  # a sum of adds -> the origins of its addends
        self.roots: dict[tuple[str, int], int] = {}  # (sqrt | rsqrt, its origin) -> s's

    def summed(self, op: Op) -> tuple:
        """The keys `op` sums bounded values over (making a count of them)."""
        return ()

    def local_sum(self, op: Op) -> tuple[float, float] | None:
        """The range of a sum `op` makes that is no count (None: no bound)."""
        return None

    def step(self, op: Op, independent: set[int] = frozenset(), tables: dict | None = None) -> None:
        counted = [self.counts[v.id] for v in op.operands if v.id in self.counts]
        if counted and _compares(op, self.counts, self.ranges) and not self._exempt(op):
            for keys, where in counted:
                for k in keys:
                    self.keep(k, f"its count ({where}) is compared by {op.short_name} at {op.loc}")
        r = element_range(op, [self.range(v) for v in op.operands], tables)
        if r is UNBOUNDED and op.name == "stablehlo.reduce" and sums(op):
            r = self.local_sum(op) or signed_sum(self.range(op.operands[0]))
        r = self._related(op) or r
        if r is None and op.results and all(v.id in independent for v in op.results):
            r = SOME_CONSTANT
        if r is not None and r != UNBOUNDED:
            for v in op.results:
                self.ranges[v.id] = r
        self._indicate(op)
        keys = tuple(k for ks, _ in counted for k in ks)
        summed = self.summed(op)
        self._wraps(op, keys + summed)
        if keys or summed:
            where = counted[0][1] if counted else f"{op.short_name} at {op.loc}"
            for v in op.results:
                self.counts[v.id] = (tuple(dict.fromkeys(keys + summed)), where)
                if narrow(v):  # a count in 8 or 16 bits wraps past 127 (32767): a threshold
                    for k in keys + summed:
                        self.keep(k, f"its count ({where}) wraps in {v.type.dtype} at {op.loc}")

    def _related(self, op: Op) -> tuple[float, float] | None:
        """Ranges that follow from how operands relate, not from their ranges alone: a
        softmax's `x / sum(x)` (x >= 0) in [0, 1], `-x * x` <= 0 (an RBF kernel's
        exponent), `x / sqrt(sum(x * x))` and `x * rsqrt(sum(x * x))` in [-1, 1], and a
        NaN guard's `select(x != x, x, f(x))` (jax.nn.softplus) in f's range: over the
        reals x != x never holds."""
        name, ids = op.name, [v.id for v in op.operands]
        if name == "stablehlo.select" and ids[0] in self.nan_tests:
            return self.range(op.operands[2])
        if name == "stablehlo.divide":
            x, by = ids
            if self.sum_of.get(by) == x and self.range(op.operands[0])[0] >= 0:
                return (0.0, 1.0)
            if self.norm_of.get(by) == x:
                return (-1.0, 1.0)
            return self._share(op.operands[0], by, "sqrt")
        if name == "stablehlo.multiply":
            a, b = ids
            if self.negated.get(a) == b or self.negated.get(b) == a:
                return (-np.inf, 0.0)
            if self.inverse_norm_of.get(b) == a or self.inverse_norm_of.get(a) == b:
                return (-1.0, 1.0)
            return self._share(op.operands[0], b, "rsqrt", divides=False) or self._share(
                op.operands[1], a, "rsqrt", divides=False
            )
        return None

    def _share(self, x: Value, by: int, root: str, divides: bool = True):
        """The range of `x / by` (`x * by` with `by` an rsqrt) where `by` is a sum of values
        >= 0 one of which bounds x: `x / (|x| + 1)` (soft_sign) in [-1, 1], `x * x / (1 + x
        * x)` and `exp(x) / (exp(x) + exp(-x))` in [0, 1] (x >= 0 among the addends), and
        `x / sqrt(x * x + 1)` (or `x * rsqrt(x * x + 1)`) in [-1, 1]. Values are matched by
        form: the same op on the same values (JAX writes `exp(x)` twice, once for each)."""
        ox = self._origin(x.id)
        leaves = self._addends(self._origin(by)) if divides else ()
        if self._rest_nonnegative(leaves, ox) and self.range(x)[0] >= 0:
            return (0.0, 1.0)
        if self._rest_nonnegative(leaves, self.forms.get(("stablehlo.abs", (ox,)))):
            return (-1.0, 1.0)
        s = self.roots.get((root, self._origin(by)))
        square = self.forms.get(("stablehlo.multiply", (ox, ox)))
        if s is not None and self._rest_nonnegative(self._addends(s), square):
            return (-1.0, 1.0)
        return None

    def _rest_nonnegative(self, leaves: tuple, leaf: int | None) -> bool:
        """Is `leaf` one of `leaves`, and every other one >= 0?"""
        if leaf is None or leaf not in leaves:
            return False
        rest = list(leaves)
        rest.remove(leaf)
        return all(self.ranges.get(v, UNBOUNDED)[0] >= 0 for v in rest)

    def _addends(self, vid: int) -> tuple:
        return self.addends.get(vid) or (vid,)

    def _indicate(self, op: Op) -> None:
        """Track indicators (0 / 1 elements) and the raw counts of them, maxima, and sums."""
        name = op.name
        out = op.results[0].id if op.results else None
        if name in SAME_FORM and len(op.results) == 1:
            form = (name, tuple(self._origin(v.id) for v in op.operands))
            self.origin[out] = self.forms.setdefault(form, out)
            if name == "stablehlo.add":
                a, b = (self._origin(v.id) for v in op.operands)
                addends = self._addends(a) + self._addends(b)
                if len(addends) <= MAX_ADDENDS:  # a residual stream's chain of adds: not followed
                    self.addends[self._origin(out)] = addends
            elif name in ("stablehlo.sqrt", "stablehlo.rsqrt"):
                root = name[len("stablehlo.") :]
                self.roots[(root, self._origin(out))] = self._origin(op.operands[0].id)
        if name == "stablehlo.reduce":
            if sums(op):
                self.sum_of[out] = op.operands[0].id
            else:
                of = self._origin(op.operands[0].id)
                self.maxima.update((v.id, of) for v in op.results)
        elif name == "stablehlo.negate":
            self.negated[out] = op.operands[0].id
        elif name == "stablehlo.compare" and op.operands[0] is op.operands[1]:
            if str(op.attrs.get("comparison_direction")) == "NE":
                self.nan_tests.add(out)
        elif name == "stablehlo.multiply" and op.operands[0] is op.operands[1]:
            self.squared[out] = op.operands[0].id
        elif name in ("stablehlo.sqrt", "stablehlo.rsqrt"):
            x = self.squared.get(self.sum_of.get(op.operands[0].id, -1))
            if x is not None:
                (self.norm_of if name == "stablehlo.sqrt" else self.inverse_norm_of)[out] = x
        elif name in MOVING and op.operands and name != "stablehlo.select":
            first = op.operands[0].id
            if len(data_operands(op)) == 1:
                self.origin[out] = self._origin(first)
            if first in self.maxima:
                self.maxima.update((v.id, self.maxima[first]) for v in op.results)
            for follows in (self.sum_of, self.norm_of, self.inverse_norm_of):
                if first in follows:
                    follows[out] = follows[first]
        data = [op.operands[i] for i in data_operands(op)] if name in MOVING else list(op.operands)
        if (
            name == "stablehlo.compare"
            or (op.results and all(boolean(v) for v in op.results))
            or (name == "stablehlo.constant" and zeros_and_ones(op))
            or (name in MOVING or name == "stablehlo.multiply")
            and data
            and all(v.id in self.indicators or boolean(v) for v in data)
        ):
            self.indicators.update(v.id for v in op.results)
        if name == "stablehlo.reduce" and sums(op) and op.operands[0].id in self.indicators:
            self.raw.update(v.id for v in op.results)
        elif name in MOVING and name != "stablehlo.select" and data and data[0].id in self.raw:
            self.raw.update(v.id for v in op.results)

    def _exempt(self, op: Op) -> bool:
        """A comparison that does not keep what its counts count: thresholds of at most 1 on
        raw counts (`_at_most_one`), a count against its own maximum (`x == max(x)`, the
        gradient of a max: both grow with the class; not against the maximum of another
        value, `max(load) > mean(load) + 10`), `abs` or `sign` of a raw count (>= 0)."""
        if op.name in ("stablehlo.abs", "stablehlo.sign"):
            return op.operands[0].id in self.raw
        if op.name == "stablehlo.compare" and all(v.id in self.counts for v in op.operands):
            a, b = (v.id for v in op.operands)
            return self.maxima.get(b) == self._origin(a) or self.maxima.get(a) == self._origin(b)
        return self._at_most_one(op)

    def _wraps(self, op: Op, summed: tuple) -> None:
        """Follow the largest |element| of integer values at the real sizes (a sum of n
        values up to m holds up to n * m, over devices too); a sum that may pass its type's
        range keeps what it counts (`summed`): uint8 pixels of 256 images of 224 x 224 x 3
        summed in int32 wrap, 2 of them never do."""
        if not op.results or not integer(op.results[0]):
            return
        extent = self._extent(op)
        for v in op.results:
            self.extents[v.id] = extent
        adds = sums(op) and op.name in ("stablehlo.reduce", *SUMMING)
        if (
            not summed
            or not np.isfinite(extent)
            or not (adds or op.name == "stablehlo.dot_general")
        ):
            return
        info = np.iinfo(numpy_dtype(op.results[0].type.dtype))
        if extent > info.max:
            for k in summed:
                self.keep(k, f"its sum ({op.short_name} at {op.loc}) can pass the "
                          f"{op.results[0].type.dtype} range ({extent:.3g})")  # fmt: skip

    def _extent(self, op: Op) -> float:
        """The largest |element| of `op`'s integer results, at the real sizes."""
        name, ext = op.name, [self.extent(v) for v in op.operands]
        if name == "stablehlo.reduce" and sums(op):
            shape = op.operands[0].type.shape
            return ext[0] * float(np.prod([shape[a] for a in op.attrs["dimensions"]]))
        if name in SUMMING and sums(op):
            groups = np.asarray(op.attrs.get("replica_groups", ()))
            return ext[0] * groups.shape[-1] if groups.ndim == 2 and groups.size else np.inf
        if name == "stablehlo.dot_general":
            shape = op.operands[0].type.shape
            contract = op.attrs["dot_dimension_numbers"].lhs_contract
            return ext[0] * ext[1] * float(np.prod([shape[a] for a in contract]))
        with np.errstate(all="ignore"):
            if name in ("stablehlo.add", "stablehlo.subtract"):
                return ext[0] + ext[1]
            if name == "stablehlo.multiply":
                return ext[0] * ext[1]
            if name in ("stablehlo.negate", "stablehlo.abs", "stablehlo.convert"):
                return ext[0]
            if name in MOVING:
                return max((ext[i] for i in data_operands(op)), default=np.inf)
        return max(abs(x) for x in self.range(op.results[0]))

    def extent(self, v: Value) -> float:
        found = self.extents.get(v.id)
        if found is not None:
            return found
        lo, hi = self.range(v)
        return max(abs(lo), abs(hi))

    def _origin(self, vid: int) -> int:
        return self.origin.get(vid, vid)

    def _at_most_one(self, op: Op) -> bool:
        """A raw count met by thresholds of at most 1 (`maximum(count, 1)`, `count > 0`):
        they ask only whether it is 0, 1 or more, which 2 positions show as the real size
        does. A larger threshold (or a normalised count: `mean(mask) > 0.3`) keeps the
        class; so would a count compared at 1 and at 2, the second keeping it."""
        if op.name not in AGAINST:
            return False
        for v in op.operands:
            if v.id in self.counts:
                if v.id not in self.raw:
                    return False
            elif not self.range(v)[1] <= 1:
                return False
        return True

    def range(self, v: Value) -> tuple[float, float]:
        r = self.ranges.get(v.id)
        if r is None:  # an argument, a loop's carried value: what its type holds
            if boolean(v):
                return (0.0, 1.0)
            if narrow(v):  # uint8 pixels: their sum over 512 wraps a uint16
                dtype = v.type.dtype
                info = np.iinfo(numpy_dtype(dtype))
                return (float(info.min), float(info.max))
            return UNBOUNDED
        return r

    def counted(self, v: Value) -> bool:
        return grows(self.range(v)) or v.id in self.counts


class ClassCounts(Counts):
    """Counts of dimension classes: a `reduce` adding, a `dot_general` contracting two
    bounded operands."""

    def __init__(self, d: DimClasses, keys: Callable[[Value], list[Key]]) -> None:
        super().__init__(d.keep)
        self.keys = keys  # Value -> its dimensions' keys (the shape rules')

    def summed(self, op: Op) -> tuple:
        if op.name == "stablehlo.reduce" and sums(op) and self.counted(op.operands[0]):
            kx = self.keys(op.operands[0])
            return tuple(kx[a] for a in op.attrs["dimensions"])
        if op.name == "stablehlo.reduce_window" and sums(op) and self.counted(op.operands[0]):
            # a running count (`cumsum` of a mask, or XLA's partitioned form of it): it
            # counts along each dimension its windows fold whole
            kx = self.keys(op.operands[0])
            return tuple(kx[a] for a in range(len(kx)) if cumulative(op, a) or whole_window(op, a))
        if op.name == "stablehlo.dot_general":
            lhs, rhs = op.operands[0], op.operands[1]
            if grows(products(self.range(lhs), self.range(rhs))):
                kl = self.keys(lhs)
                return tuple(kl[i] for i in op.attrs["dot_dimension_numbers"].lhs_contract)
        return ()


def _compares(op: Op, counts: dict, ranges: dict) -> bool:
    """Is `op`'s result a function of its operands that is not smooth where a count reaches
    it (the count then keeps what it counts)? A reduce other than a sum (a max) passes an
    operand's element on, and `abs` and `sign` keep a count's own threshold (0)."""
    name = op.name
    if name in COMPARING:
        return True
    if name in INDEXING:
        data = INDEXING[name]
        if data is None:  # scatter: its one index operand follows the operands
            data = tuple(k for k in range(len(op.operands)) if k != len(op.operands) // 2)
        return any(v.id in counts for k, v in enumerate(op.operands) if k not in data)
    if name in AGAINST:  # a constant +-inf (`jnp.max`'s initial value) is no threshold
        return all(v.id in counts or not infinite(ranges.get(v.id)) for v in op.operands)
    if name in ("stablehlo.abs", "stablehlo.sign"):  # a kink at 0: `abs(count - 12)`
        return True
    if name == "stablehlo.divide":  # an integer division floors
        return integer(op.results[0])
    # a float count rounded to an integer
    return name == "stablehlo.convert" and integer(op.results[0]) and not integer(op.operands[0])
