"""The least and greatest element each value can hold whatever the inputs: an
over-approximation, op by op, that reads what it cannot follow as unbounded (`UNBOUNDED`).
Counts (counts.py) are the sums of values it bounds; the relations between operands that
bound a value its operands' ranges alone do not (`x / (|x| + 1)`) are followed there."""

from __future__ import annotations

import numpy as np

from tv_ir.ir.program import Op, TensorType, Value

# results in a fixed range whatever their operands
RANGES = {
    "stablehlo." + n: r
    for names, r in (
        ("compare is_finite logistic", (0.0, 1.0)),
        ("tanh sine cosine sign", (-1.0, 1.0)),
        ("atan2", (-np.pi, np.pi)),
    )
    for n in names.split()
} | {"chlo.erf": (-1.0, 1.0)}
# increasing functions: the range of the result is the function of the operand's ends
INCREASING = {
    "stablehlo.log_plus_one": np.log1p,
    "stablehlo.log": np.log,
    "stablehlo.exponential_minus_one": np.expm1,
    "stablehlo.cbrt": np.cbrt,
    "stablehlo.sqrt": np.sqrt,
}
# where each is defined: the least operand it takes
DOMAIN = {"stablehlo.log_plus_one": -1.0, "stablehlo.log": 0.0, "stablehlo.sqrt": 0.0}
# results whose elements are some operand's (the data operands: `_data`)
MOVING = {
    "stablehlo." + n
    for n in (
        "convert broadcast_in_dim reshape transpose slice concatenate reverse pad copy "
        "dynamic_slice dynamic_update_slice gather optimization_barrier all_gather all_to_all "
        "collective_permute collective_broadcast select"
    ).split()
} | {"mhlo.copy"}
ROUNDING = {"stablehlo." + n for n in "floor ceil round_nearest_afz round_nearest_even".split()}
UNBOUNDED = (-np.inf, np.inf)
# an interval for values computed from constants alone that no rule below follows (finite)
SOME_CONSTANT = (-1e30, 1e30)


def element_range(
    op: Op, ranges: list[tuple[float, float]], tables: dict | None
) -> tuple[float, float] | None:
    """The least and greatest element `op`'s results can hold, given its operands' (None:
    no rule; UNBOUNDED: any)."""
    name = op.name
    if name in RANGES:
        return RANGES[name]
    if op.results and all(boolean(v) for v in op.results):
        return (0.0, 1.0)
    if name == "stablehlo.constant":
        if op.results[0].id in (tables or {}):  # a table proved for every value it could hold
            return UNBOUNDED
        value = np.asarray(op.attrs.get("value"))
        if value.size == 0 or value.dtype.kind not in "fiub":
            return None
        value = value.astype(np.float64)
        return None if np.isnan(value).any() else (float(np.min(value)), float(np.max(value)))
    if name == "stablehlo.iota":
        return (0.0, float(max(op.results[0].type.shape or (1,)) - 1))
    if name in MOVING:
        return union([ranges[i] for i in data_operands(op)])
    if name == "stablehlo.reduce" and not sums(op):  # max, min, argmax: an operand's element
        return union(ranges[: len(ranges) // 2])  # not the initial values (-inf for a max)
    if not ranges:
        return None
    with np.errstate(all="ignore"):
        if name == "stablehlo.negate":
            lo, hi = ranges[0]
            return (-hi, -lo)
        if name == "stablehlo.add":
            return _clean(ranges[0][0] + ranges[1][0], ranges[0][1] + ranges[1][1])
        if name == "stablehlo.subtract":
            return _clean(ranges[0][0] - ranges[1][1], ranges[0][1] - ranges[1][0])
        if name == "stablehlo.multiply":
            if op.operands[0] is op.operands[1]:  # a square
                lo, hi = ranges[0]
                least = 0.0 if lo <= 0 <= hi else min(lo * lo, hi * hi)
                return (least, max(lo * lo, hi * hi))
            return products(ranges[0], ranges[1])
        if name == "stablehlo.divide" and (ranges[1][0] > 0 or ranges[1][1] < 0):
            lo, hi = ranges[1]
            return products(ranges[0], (1 / hi, 1 / lo))
        if name in ("stablehlo.maximum", "stablehlo.minimum"):
            pick = max if name == "stablehlo.maximum" else min
            return (pick(ranges[0][0], ranges[1][0]), pick(ranges[0][1], ranges[1][1]))
        if name == "stablehlo.clamp":  # clamp(low, x, high) = min(max(x, low), high)
            low, x, high = ranges
            raised = (max(x[0], low[0]), max(x[1], low[1]))
            return (min(raised[0], high[0]), min(raised[1], high[1]))
        if name == "stablehlo.abs":
            lo, hi = ranges[0]
            return (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi)), max(abs(lo), abs(hi)))
        if name == "stablehlo.exponential":
            return (0.0, float(np.exp(ranges[0][1])))
        if name in ROUNDING:
            lo, hi = ranges[0]
            return (float(np.floor(lo)), float(np.ceil(hi)))
        if name in INCREASING and ranges[0][0] >= DOMAIN.get(name, -np.inf):
            f = INCREASING[name]
            return (float(f(ranges[0][0])), float(f(ranges[0][1])))
        if name == "stablehlo.rsqrt" and ranges[0][0] >= 0:
            return (float(1 / np.sqrt(ranges[0][1])), float(1 / np.sqrt(ranges[0][0])))
    return UNBOUNDED


def data_operands(op: Op) -> list[int]:
    """The operands whose elements a moving op's results hold."""
    name = op.name
    if name == "stablehlo.select":
        return [1, 2]
    if name in ("stablehlo.dynamic_slice", "stablehlo.gather"):
        return [0]
    if name in ("stablehlo.pad", "stablehlo.dynamic_update_slice"):
        return [0, 1]
    return list(range(len(op.operands)))


def union(ranges: list[tuple[float, float]]) -> tuple[float, float]:
    if not ranges:
        return UNBOUNDED
    return (min(r[0] for r in ranges), max(r[1] for r in ranges))


def products(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    ends = [x * y for x in a for y in b]
    if any(np.isnan(e) for e in ends):  # 0 x inf: no bound
        return UNBOUNDED
    return (min(ends), max(ends))


def _clean(lo: float, hi: float) -> tuple[float, float]:
    return UNBOUNDED if np.isnan(lo) or np.isnan(hi) else (lo, hi)


def infinite(r: tuple[float, float] | None) -> bool:
    """One infinite value (a constant -inf)."""
    return r is not None and r[0] == r[1] and bool(np.isinf(r[0]))


def bounded(r: tuple[float, float]) -> bool:
    """Both ends finite, and not one value (a sum of a constant is a count of its own kind:
    rules.py keeps it)."""
    return bool(np.isfinite(r[0]) and np.isfinite(r[1]) and r[0] < r[1])


def grows(r: tuple[float, float]) -> bool:
    """Does a sum of values in `r` reach, over more positions, values that 2 positions do
    not? Both ends finite (a count), or one end finite on the far side of 0: 16 values of
    `x * x - 1` (>= -1) sum to -16, 2 of them to no less than -2. A sum of values >= 0
    (`exp`, a square) is any value >= 0 over any number of positions."""
    lo, hi = r
    return bounded(r) or (np.isfinite(lo) and lo < 0) or (np.isfinite(hi) and hi > 0)


def sums(op: Op) -> bool:
    """A reduce whose body adds its two arguments."""
    ops = op.regions[0].block.ops if op.regions else []
    return len(ops) == 1 and ops[0].name == "stablehlo.add"


def signed_sum(r: tuple[float, float]) -> tuple[float, float]:
    """The range of a sum of any number of values in `r`, from its sign alone."""
    if r[0] >= 0:
        return (0.0, np.inf)
    if r[1] <= 0:
        return (-np.inf, 0.0)
    return UNBOUNDED


def zeros_and_ones(op: Op) -> bool:
    value = np.asarray(op.attrs.get("value"))
    return value.size > 0 and value.dtype.kind in "fiub" and bool(np.isin(value, (0, 1)).all())


def boolean(v: Value) -> bool:
    t = v.type
    return isinstance(t, TensorType) and t.dtype == "i1"


def narrow(v: Value) -> bool:
    """An integer type of fewer than 32 bits (a count of 2^31 positions is no tensor)."""
    t = v.type
    if not isinstance(t, TensorType) or not t.dtype.startswith(("i", "ui")) or t.dtype == "i1":
        return False
    return int(t.dtype.lstrip("ui")) < 32


def numpy_dtype(dtype: str) -> str:
    """numpy's name of an integer type of the IR (`i32` -> int32, `ui8` -> uint8)."""
    return f"uint{dtype[2:]}" if dtype.startswith("ui") else f"int{dtype[1:]}"


def integer(v: Value) -> bool:
    t = v.type
    return isinstance(t, TensorType) and t.dtype.startswith(("i", "ui")) and t.dtype != "i1"
