"""Conformance of the op table with XLA on CPU.

Every op registered in `tv_ir.semantics.ops.registry.OPS` has at least one conformance record: a
builder that draws (with hypothesis) a small StableHLO program around the op and random
inputs for it. The test runs our interpreter and XLA:CPU on the same program text and the
same inputs and compares the results: integers and booleans exactly, floats within a
tolerance (our interpreter computes floats in float64, XLA in the program's precision).

Set TV_CONFORMANCE_SCALE=N to run N times as many examples per record.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jax import lax
from xla_oracle import arr, dense2d, lower, module, run_xla, ttype

import tv_ir
from tv_ir.ir.importer import parse_mlir
from tv_ir.ir.program import walk
from tv_ir.semantics.interpreters.interp import evaluate
from tv_ir.semantics.ops.registry import OPS

Draw = Callable[[st.SearchStrategy], Any]

NP = {
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "i1": np.dtype(np.bool_),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "ui8": np.dtype(np.uint8),
    "ui16": np.dtype(np.uint16),
    "ui32": np.dtype(np.uint32),
    "ui64": np.dtype(np.uint64),
}
FLOAT_NAMES = {"float16", "bfloat16", "float32", "float64"}
FLOATS = {"f32", "f64", "f16", "bf16"}
F = ["f32", "f32", "f32", "f64", "f16", "bf16"]  # f32 weighted up
F_WIDE = ["f32", "f32", "f64"]  # for ops that would overflow in half precision
SINT = ["i8", "i16", "i32", "i64"]
UINT = ["ui8", "ui32", "ui64"]
INT = SINT + UINT
BOOL = ["i1"]


# -- records --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One program and its inputs (numpy arrays of the program's argument types).

    `xla_text`, for ops XLA:CPU cannot translate (quantized types), is the same computation
    written with the spec's definition in ops XLA runs: the reference the op is checked
    against."""

    text: str
    args: list[np.ndarray]
    xla_text: str | None = None


@dataclass(frozen=True)
class Record:
    """A conformance record: `build(draw)` draws a program containing every op of `ops`."""

    name: str
    ops: frozenset[str]
    build: Callable[[Draw], Case]
    rtol: float = 1e-4
    atol: float = 1e-5
    examples: int = 10


RECORDS: list[Record] = []


def record(*ops: str, name: str | None = None, **kw: Any) -> Callable:
    """Register `build` as the conformance record for `ops`."""

    def register(build: Callable[[Draw], Case]) -> Callable[[Draw], Case]:
        RECORDS.append(Record(name or build.__name__, frozenset(ops), build, **kw))
        return build

    return register


# -- drawing shapes and values --------------------------------------------------------------


def shape(draw: Draw, min_rank: int = 0, max_rank: int = 3, lo: int = 1, hi: int = 4) -> tuple:
    """A small shape."""
    return tuple(draw(st.lists(st.integers(lo, hi), min_size=min_rank, max_size=max_rank)))


def rng(draw: Draw) -> np.random.Generator:
    """A numpy generator seeded by hypothesis (array contents are not shrunk element-wise)."""
    return np.random.default_rng(draw(st.integers(0, 2**32 - 1)))


SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0])


def values(
    draw: Draw,
    shp: tuple,
    et: str,
    lo: float = -4.0,
    hi: float = 4.0,
    special: bool | None = None,
) -> np.ndarray:
    """Random values of MLIR element type `et`.

    Floats: uniform in [lo, hi], some halves (rounding ties, exact integers), and, when
    `special`, some NaN/inf/signed zeros. Integers: mostly small, some anywhere in range,
    some extremes (min, max, 0, +-1). Booleans: fair coins.
    """
    r = rng(draw)
    dt = NP[et]
    if et == "i1":
        return r.random(shp) < 0.5
    pick = r.random(shp)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        small = r.integers(max(int(info.min), -8), min(int(info.max), 8), size=shp, endpoint=True)
        full = r.integers(info.min, info.max, size=shp, dtype=dt, endpoint=True)
        edges = [info.min, info.max, 0, 1] + ([-1] if dt.kind == "i" else [])
        edge = r.choice(np.array(edges, dtype=dt), size=shp)
        out = np.where(pick < 0.6, small.astype(dt), np.where(pick < 0.85, full, edge))
        return np.asarray(out, dtype=dt)
    if special is None:
        special = draw(st.booleans())
    x = r.uniform(lo, hi, shp)
    hlo, hhi = max(lo, -1e6), min(hi, 1e6)
    halves = r.integers(math.ceil(2 * hlo), math.floor(2 * hhi), size=shp, endpoint=True) / 2
    x = np.where(pick < 0.2, halves, x)
    if special:
        x = np.where(r.random(shp) < 0.25, r.choice(SPECIALS, size=shp), x)
    return np.asarray(x).astype(dt)


def ints(draw: Draw, shp: tuple, et: str, lo: int, hi: int) -> np.ndarray:
    """Uniform integers in [lo, hi] of element type `et`."""
    return rng(draw).integers(lo, hi, size=shp, endpoint=True).astype(NP[et])


def like(draw: Draw, x: np.ndarray, et: str, **kw: Any) -> np.ndarray:
    """Values shaped like `x`, equal to `x` at about a third of the positions (ties)."""
    y = values(draw, x.shape, et, **kw)
    same = rng(draw).random(x.shape) < 0.3
    return np.where(same, x, y).astype(x.dtype)


def et_of(a: np.ndarray) -> str:
    return ttype((), np.asarray(a).dtype)[len("tensor<") : -1]


def one_op(name: str, args: list[np.ndarray], result: str, attrs: str = "") -> str:
    """A module whose main applies op `name` (generic syntax) to its arguments."""
    ops = ", ".join(f"%a{i}" for i in range(len(args)))
    types = ", ".join(ttype(np.shape(a), np.asarray(a).dtype) for a in args)
    attrs = f" {{{attrs}}}" if attrs else ""
    body = f'    %0 = "{name}"({ops}){attrs} : ({types}) -> {result}\n    return %0 : {result}'
    return module(args, [result], body)


# -- comparison -------------------------------------------------------------------------------


def _widen(a: np.ndarray) -> np.ndarray:
    """Inputs as our interpreter takes them: floats in float64."""
    a = np.asarray(a)
    return a.astype(np.float64) if a.dtype.name in FLOAT_NAMES else a


def _tolerance(dtype: np.dtype, rtol: float, atol: float) -> tuple[float, float]:
    if dtype.name == "float16":
        return max(rtol, 2e-3), max(atol, 1e-3)
    if dtype.name == "bfloat16":
        return max(rtol, 1.6e-2), max(atol, 1e-2)
    return rtol, atol


def check(rec: Record, case: Case) -> None:
    """Run `case` on XLA and on our interpreter; the results must agree."""
    mod = tv_ir.load(case.text)
    present = {op.name for f in mod.functions.values() for op in walk(f.body)}
    missing = rec.ops - present
    assert not missing, f"record {rec.name} claims {sorted(missing)}, absent from:\n{case.text}"
    expected = run_xla(case.xla_text or case.text, case.args)
    got = evaluate(mod, [_widen(a) for a in case.args])
    context = f"\n--- program ---\n{case.text}--- inputs ---\n" + "\n".join(
        f"a{i} = {a!r}" for i, a in enumerate(case.args)
    )
    assert len(got) == len(expected), context
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        g = np.asarray(g)
        msg = f"result {i}: ours\n{g!r}\nXLA\n{e!r}{context}"
        assert g.shape == e.shape, msg
        if e.dtype.name in FLOAT_NAMES:
            rtol, atol = _tolerance(e.dtype, rec.rtol, rec.atol)
            np.testing.assert_allclose(
                g.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol, err_msg=msg
            )
        else:
            assert g.dtype == e.dtype, msg
            np.testing.assert_array_equal(g, e, err_msg=msg)


SCALE = int(os.environ.get("TV_CONFORMANCE_SCALE", "1"))


@pytest.mark.parametrize("rec", RECORDS, ids=lambda r: r.name)
def test_conformance(rec: Record) -> None:
    @settings(
        max_examples=rec.examples * SCALE,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.data())
    def run(data: st.DataObject) -> None:
        check(rec, rec.build(data.draw))

    run()


def test_every_registered_op_has_a_record() -> None:
    covered = set().union(*(r.ops for r in RECORDS))
    assert not covered - set(OPS), f"records name unregistered ops: {sorted(covered - set(OPS))}"
    missing = sorted(set(OPS) - covered)
    assert not missing, f"registered ops without a conformance record: {missing}"


# ==============================================================================================
# Element-wise ops
# ==============================================================================================

# op -> (element types, value range, rtol)
UNARY = {
    "stablehlo.abs": (F + SINT, (-4, 4), 1e-4),
    "stablehlo.negate": (F + INT, (-4, 4), 1e-4),
    "stablehlo.sign": (F + SINT, (-4, 4), 1e-4),
    "stablehlo.exponential": (F, (-8, 8), 1e-4),
    "stablehlo.exponential_minus_one": (F, (-8, 8), 1e-4),
    "stablehlo.log": (F, (-1, 10), 1e-4),
    "stablehlo.log_plus_one": (F, (-1.5, 10), 1e-4),
    "stablehlo.logistic": (F, (-10, 10), 1e-4),
    "stablehlo.tanh": (F, (-5, 5), 1e-4),
    "stablehlo.sqrt": (F, (-1, 10), 1e-4),
    "stablehlo.rsqrt": (F, (-1, 10), 1e-4),
    "stablehlo.cbrt": (F, (-10, 10), 1e-4),
    "stablehlo.sine": (F, (-10, 10), 1e-4),
    "stablehlo.cosine": (F, (-10, 10), 1e-4),
    "stablehlo.tan": (F, (-3, 3), 1e-3),
    "chlo.tan": (F, (-3, 3), 1e-3),
    "chlo.erf": (F, (-3, 3), 1e-4),
    "chlo.lgamma": (F, (-4.5, 8), 1e-3),
    "chlo.erf_inv": (F, (-1.1, 1.1), 1e-3),
    "chlo.digamma": (F, (-4.5, 8), 1e-3),
    "stablehlo.floor": (F, (-4, 4), 1e-4),
    "stablehlo.ceil": (F, (-4, 4), 1e-4),
    "stablehlo.round_nearest_afz": (F, (-4, 4), 1e-4),
    "stablehlo.round_nearest_even": (F, (-4, 4), 1e-4),
    "stablehlo.real": (F, (-4, 4), 1e-4),
    "stablehlo.not": (BOOL + INT, (-4, 4), 0),
    "stablehlo.popcnt": (INT, (-4, 4), 0),
    "stablehlo.count_leading_zeros": (INT, (-4, 4), 0),
}


def _unary_case(name: str, draw: Draw) -> Case:
    ets, (lo, hi), _ = UNARY[name]
    et = draw(st.sampled_from(ets))
    x = values(draw, shape(draw), et, lo=lo, hi=hi)
    return Case(one_op(name, [x], ttype(x.shape, et)), [x])


for _name, (_ets, _range, _rtol) in UNARY.items():
    record(_name, name=_name, rtol=_rtol, atol=max(_rtol / 10, 1e-5))(partial(_unary_case, _name))


# CHLO ops the importer decomposes into StableHLO (chlo-legalize-to-stablehlo): no evaluator
# of their own, but the decomposition must agree with XLA too. op -> value range
CHLO_LEGALIZED = {
    "chlo.asinh": (-5, 5),
    "chlo.acosh": (0.5, 5),
    "chlo.atanh": (-1.2, 1.2),
    "chlo.asin": (-1.2, 1.2),
    "chlo.acos": (-1.2, 1.2),
    "chlo.atan": (-5, 5),
    "chlo.sinh": (-5, 5),
    "chlo.cosh": (-5, 5),
    "chlo.erfc": (-3, 3),
    "chlo.bessel_i1e": (-5, 5),
}


@record(rtol=1e-3, atol=1e-4)  # no registered op: checks the importer's legalization
def chlo_legalized(draw: Draw) -> Case:
    name = draw(st.sampled_from(sorted(CHLO_LEGALIZED)))
    lo, hi = CHLO_LEGALIZED[name]
    x = values(draw, shape(draw), "f32", lo=lo, hi=hi)
    return Case(one_op(name, [x], ttype(x.shape, "f32")), [x])


ROUNDING_EDGES = [0.5, 1.5, 2.5, 0.49999999999999994, 0.49999997, 2.0**52 + 1, 2.0**23 + 1, 1e300]


@record(
    "stablehlo.round_nearest_afz",
    "stablehlo.round_nearest_even",
    "stablehlo.floor",
    "stablehlo.ceil",
)
def rounding_edges(draw: Draw) -> Case:
    # values next to rounding ties and at the end of the fraction bits
    et = draw(st.sampled_from(["f32", "f64"]))
    shp = (draw(st.integers(1, 8)),)
    edges = np.array(ROUNDING_EDGES) * rng(draw).choice([-1.0, 1.0], size=len(ROUNDING_EDGES))
    x = np.where(rng(draw).random(shp) < 0.7, rng(draw).choice(edges, shp), values(draw, shp, et))
    with np.errstate(over="ignore"):
        x = x.astype(NP[et])  # 1e300 is inf in f32
    t = ttype(shp, et)
    body = "".join(
        f'    %{k} = "stablehlo.{op}"(%a0) : ({t}) -> {t}\n'
        for k, op in enumerate(["round_nearest_afz", "round_nearest_even", "floor", "ceil"])
    )
    return Case(module([x], [t] * 4, body + f"    return %0, %1, %2, %3 : {t}, {t}, {t}, {t}"), [x])


@record("stablehlo.is_finite")
def is_finite(draw: Draw) -> Case:
    et = draw(st.sampled_from(F))
    x = values(draw, shape(draw), et, special=True)
    return Case(one_op("stablehlo.is_finite", [x], ttype(x.shape, "i1")), [x])


# op -> (element types, value range of the second operand)
BINARY = {
    "stablehlo.add": (F + INT + BOOL, None),
    "stablehlo.subtract": (F + INT, None),
    "stablehlo.multiply": (F + INT + BOOL, None),
    "stablehlo.divide": (F + INT, None),
    "stablehlo.remainder": (F + INT, None),
    "stablehlo.power": (F_WIDE + INT, (-3, 4)),
    "stablehlo.maximum": (F + INT + BOOL, None),
    "stablehlo.minimum": (F + INT + BOOL, None),
    "stablehlo.atan2": (F, None),
    "stablehlo.and": (BOOL + INT, None),
    "stablehlo.or": (BOOL + INT, None),
    "stablehlo.xor": (BOOL + INT, None),
    "stablehlo.shift_left": (INT, "shift"),
    "stablehlo.shift_right_logical": (INT, "shift"),
    "stablehlo.shift_right_arithmetic": (INT, "shift"),
}


def _binary_case(name: str, draw: Draw) -> Case:
    ets, rhs = BINARY[name]
    et = draw(st.sampled_from(ets))
    shp = shape(draw)
    x = values(draw, shp, et)
    if rhs == "shift":
        bits = NP[et].itemsize * 8
        lo = -2 if NP[et].kind == "i" else 0
        y = np.where(
            rng(draw).random(shp) < 0.8,
            ints(draw, shp, et, 0, bits - 1),
            ints(draw, shp, et, lo, bits + 2),
        ).astype(NP[et])
    elif rhs is not None and et in FLOATS:
        y = values(draw, shp, et, lo=rhs[0], hi=rhs[1])
    else:
        y = like(draw, x, et)
    return Case(one_op(name, [x, y], ttype(shp, et)), [x, y])


for _name in BINARY:
    record(_name, name=_name)(partial(_binary_case, _name))


@record("stablehlo.atan2", name="atan2_specials")
def atan2_specials(draw: Draw) -> Case:
    shp = shape(draw)
    x, y = values(draw, shp, "f32", special=True), values(draw, shp, "f32", special=True)
    return Case(one_op("stablehlo.atan2", [x, y], ttype(shp, "f32")), [x, y])


COMPARE_TYPE = {"f": "FLOAT", "i": "SIGNED", "u": "UNSIGNED", "b": "UNSIGNED"}


def _compare_case(direction: str, draw: Draw) -> Case:
    et = draw(st.sampled_from(F + INT + BOOL))
    shp = shape(draw)
    x = values(draw, shp, et, special=True)
    y = like(draw, x, et, special=True)
    kind = COMPARE_TYPE["f" if et in FLOATS else NP[et].kind]
    if kind == "FLOAT":
        kind = draw(st.sampled_from(["FLOAT", "TOTALORDER"]))
    attrs = (
        f"comparison_direction = #stablehlo<comparison_direction {direction}>, "
        f"compare_type = #stablehlo<comparison_type {kind}>"
    )
    return Case(one_op("stablehlo.compare", [x, y], ttype(shp, "i1"), attrs), [x, y])


for _dir in ["EQ", "NE", "LT", "LE", "GT", "GE"]:
    record("stablehlo.compare", name=f"compare_{_dir}", examples=12)(partial(_compare_case, _dir))


@record("stablehlo.select")
def select(draw: Draw) -> Case:
    et = draw(st.sampled_from(F + INT + BOOL))
    shp = shape(draw)
    scalar_pred = draw(st.booleans())
    p = values(draw, () if scalar_pred else shp, "i1")
    x, y = values(draw, shp, et), values(draw, shp, et)
    return Case(one_op("stablehlo.select", [p, x, y], ttype(shp, et)), [p, x, y])


@record("stablehlo.clamp")
def clamp(draw: Draw) -> Case:
    et = draw(st.sampled_from(F + INT))
    shp = shape(draw)
    x = values(draw, shp, et)
    lo = values(draw, () if draw(st.booleans()) else shp, et)
    hi = values(draw, () if draw(st.booleans()) else shp, et)
    return Case(one_op("stablehlo.clamp", [lo, x, hi], ttype(shp, et)), [lo, x, hi])


CONVERT_TYPES = "f32 f64 f16 bf16 i1 i8 i16 i32 i64 ui8 ui32 ui64".split()


@record("stablehlo.convert", examples=30)
def convert(draw: Draw) -> Case:
    src = draw(st.sampled_from(CONVERT_TYPES))
    dst = draw(st.sampled_from(CONVERT_TYPES))
    shp = shape(draw, max_rank=2, hi=6)
    if src in FLOATS and dst not in FLOATS and dst != "i1":
        # float -> int: values out of the destination's range, NaN and inf (saturation)
        info = np.iinfo(NP[dst])
        bound = min(float(info.max) * 1.5, 6e4 if src == "f16" else 1e30)
        x = values(draw, shp, src, lo=-bound, hi=bound)
        x = np.where(rng(draw).random(shp) < 0.5, values(draw, shp, src, lo=-300, hi=300), x)
        x = x.astype(NP[src])
    elif src in FLOATS:
        x = values(draw, shp, src, lo=-1000, hi=1000)
    elif dst == "f16":
        x = values(draw, shp, src)  # large integers would overflow half precision
        x = np.where(np.abs(x.astype(np.float64)) < 6e4, x, 7).astype(NP[src])
    else:
        x = values(draw, shp, src)
    return Case(one_op("stablehlo.convert", [x], ttype(shp, dst)), [x])


BITCAST_PAIRS = [
    ("i32", "ui32"), ("ui32", "i32"), ("i8", "ui8"), ("i64", "ui64"), ("ui16", "i16"),
    ("f32", "i32"), ("i32", "f32"), ("ui32", "f32"), ("f64", "i64"), ("i64", "f64"),
    ("f16", "i16"), ("ui16", "f16"), ("bf16", "ui16"), ("i16", "bf16"),
    ("i32", "i8"), ("i8", "i32"), ("ui64", "ui16"), ("f32", "ui8"), ("ui8", "f32"),
]  # fmt: skip


@record("stablehlo.bitcast_convert", examples=20)
def bitcast_convert(draw: Draw) -> Case:
    src, dst = draw(st.sampled_from(BITCAST_PAIRS))
    ratio = NP[src].itemsize / NP[dst].itemsize
    shp = shape(draw, max_rank=2)
    if ratio < 1:
        shp = shp + (int(1 / ratio),)
    out = shp + (int(ratio),) if ratio > 1 else shp[:-1] if ratio < 1 else shp
    if src in FLOATS:
        bound = 6e4 if src == "f16" else 1e6
        x = values(draw, shp, src, lo=-bound, hi=bound)
    else:
        x = values(draw, shp, src)
    return Case(one_op("stablehlo.bitcast_convert", [x], ttype(out, dst)), [x])


@record("stablehlo.reduce_precision", rtol=1e-2, atol=1e-4)
def reduce_precision(draw: Draw) -> Case:
    # floats are reals in tv: reduce_precision is the identity, so compare within the
    # precision of the reduced format (exactly for f32's own format)
    e, m = draw(st.sampled_from([(8, 23), (5, 10), (8, 7), (11, 52)]))
    x = values(draw, shape(draw), "f32", lo=-100, hi=100)
    attrs = f"exponent_bits = {e} : i32, mantissa_bits = {m} : i32"
    return Case(one_op("stablehlo.reduce_precision", [x], ttype(x.shape, "f32"), attrs), [x])


# ==============================================================================================
# Shape and data-movement ops
# ==============================================================================================


def _any_values(draw: Draw, shp: tuple, ets: list[str] | None = None) -> np.ndarray:
    return values(draw, shp, draw(st.sampled_from(ets or ["f32", "i32", "i1", "ui8", "f16"])))


@record("stablehlo.constant")
def constant(draw: Draw) -> Case:
    et = draw(st.sampled_from(["f32", "i32", "i1", "ui8", "i8"]))
    shp = shape(draw)
    c = values(draw, shp, et, special=False)
    if draw(st.booleans()):
        c = np.full(shp, c.reshape(-1)[0] if c.size else 0, dtype=c.dtype)  # a splat constant
    x = values(draw, shp, et)
    if et == "i1":
        return Case(lower(lambda x: x ^ c, x), [x])
    return Case(lower(lambda x: x + c, x), [x])


@record("stablehlo.iota")
def iota(draw: Draw) -> Case:
    et = draw(st.sampled_from(["f32", "i32", "ui8", "i64", "f16"]))
    shp = shape(draw, min_rank=1, lo=0)
    dim = draw(st.integers(0, len(shp) - 1))
    body = (
        f"    %0 = stablehlo.iota dim = {dim} : {ttype(shp, et)}\n    return %0 : {ttype(shp, et)}"
    )
    return Case(module([], [ttype(shp, et)], body), [])


@record("stablehlo.broadcast_in_dim")
def broadcast_in_dim(draw: Draw) -> Case:
    out = shape(draw, max_rank=4)
    rank = draw(st.integers(0, len(out)))
    dims = draw(st.permutations(range(len(out))))[:rank]
    if draw(st.booleans()):
        dims = sorted(dims)  # what jax emits
    operand = tuple(out[d] if draw(st.booleans()) else 1 for d in dims)
    x = _any_values(draw, operand)
    return Case(
        one_op(
            "stablehlo.broadcast_in_dim",
            [x],
            ttype(out, x.dtype),
            f"broadcast_dimensions = {arr(dims)}",
        ),
        [x],
    )


def _factor(draw: Draw, n: int) -> tuple:
    """A random shape with `n` elements."""
    dims = []
    while n > 1:
        divisors = [d for d in range(2, n + 1) if n % d == 0]
        d = draw(st.sampled_from(divisors))
        dims.append(d)
        n //= d
    dims += [1] * draw(st.integers(0, 1))
    return tuple(draw(st.permutations(dims)))


@record("stablehlo.reshape")
def reshape(draw: Draw) -> Case:
    x = _any_values(draw, shape(draw, max_rank=4))
    out = _factor(draw, x.size)
    return Case(one_op("stablehlo.reshape", [x], ttype(out, x.dtype)), [x])


@record("stablehlo.transpose")
def transpose(draw: Draw) -> Case:
    x = _any_values(draw, shape(draw, max_rank=4))
    perm = draw(st.permutations(range(x.ndim)))
    out = tuple(x.shape[p] for p in perm)
    return Case(
        one_op("stablehlo.transpose", [x], ttype(out, x.dtype), f"permutation = {arr(perm)}"), [x]
    )


@record("stablehlo.reverse")
def reverse(draw: Draw) -> Case:
    x = _any_values(draw, shape(draw, max_rank=4))
    dims = sorted(draw(st.sets(st.integers(0, max(x.ndim - 1, 0)), max_size=x.ndim)))
    return Case(lower(lambda x: lax.rev(x, dims), x), [x])


@record("stablehlo.slice")
def slice_(draw: Draw) -> Case:
    x = _any_values(draw, shape(draw, lo=0, hi=6))
    starts, limits, strides = [], [], []
    for n in x.shape:
        s = draw(st.integers(0, n))
        starts.append(s)
        limits.append(draw(st.integers(s, n)))
        strides.append(draw(st.integers(1, 3)))
    out = tuple(max(0, -(-(e - s) // k)) for s, e, k in zip(starts, limits, strides, strict=True))
    attrs = (
        f"start_indices = {arr(starts)}, limit_indices = {arr(limits)}, strides = {arr(strides)}"
    )
    return Case(one_op("stablehlo.slice", [x], ttype(out, x.dtype), attrs), [x])


@record("stablehlo.concatenate")
def concatenate(draw: Draw) -> Case:
    base = shape(draw, min_rank=1)
    dim = draw(st.integers(0, len(base) - 1))
    et = draw(st.sampled_from(["f32", "i32", "i1"]))
    xs = []
    for _ in range(draw(st.integers(1, 3))):
        shp = list(base)
        shp[dim] = draw(st.integers(0, 3))
        xs.append(values(draw, tuple(shp), et))
    out = list(base)
    out[dim] = sum(x.shape[dim] for x in xs)
    return Case(
        one_op("stablehlo.concatenate", xs, ttype(out, NP[et]), f"dimension = {dim} : i64"), xs
    )


@record("stablehlo.pad", examples=15)
def pad(draw: Draw) -> Case:
    x = _any_values(draw, shape(draw, lo=0), ["f32", "i32", "i1"])
    lo, hi, interior = [], [], []
    for n in x.shape:
        i = draw(st.integers(0, 2))
        inner = n + max(n - 1, 0) * i
        a = draw(st.integers(-3, 3))
        b = draw(st.integers(max(-3, -inner - a), 3))
        lo.append(a)
        hi.append(b)
        interior.append(i)
    v = values(draw, (), et_of(x))
    return Case(
        lower(lambda x, v: lax.pad(x, v, list(zip(lo, hi, interior, strict=True))), x, v), [x, v]
    )


def _scalar_index(draw: Draw, et: str, n: int) -> np.ndarray:
    lo = 0 if et.startswith("u") else -n - 2
    return ints(draw, (), et, lo, n + 2)


@record("stablehlo.dynamic_slice")
def dynamic_slice(draw: Draw) -> Case:
    x = _any_values(draw, shape(draw, min_rank=1))
    sizes = [draw(st.integers(0, n)) for n in x.shape]
    et = draw(st.sampled_from(["i32", "i64", "ui32"]))  # XLA:CPU aborts on 8-bit rng
    idx = [_scalar_index(draw, et, n) for n in x.shape]
    attrs = f"slice_sizes = {arr(sizes)}"
    return Case(
        one_op("stablehlo.dynamic_slice", [x, *idx], ttype(sizes, x.dtype), attrs), [x, *idx]
    )


@record("stablehlo.dynamic_update_slice")
def dynamic_update_slice(draw: Draw) -> Case:
    et = draw(st.sampled_from(["f32", "i32", "i1"]))
    x = values(draw, shape(draw, min_rank=1), et)
    u = values(draw, tuple(draw(st.integers(0, n)) for n in x.shape), et)
    it = draw(st.sampled_from(["i32", "i64", "ui32"]))
    idx = [_scalar_index(draw, it, n) for n in x.shape]
    return Case(
        one_op("stablehlo.dynamic_update_slice", [x, u, *idx], ttype(x.shape, et)), [x, u, *idx]
    )


@record("stablehlo.get_dimension_size")
def get_dimension_size(draw: Draw) -> Case:
    x = _any_values(draw, shape(draw, min_rank=1, lo=0))
    dim = draw(st.integers(0, x.ndim - 1))
    return Case(
        one_op("stablehlo.get_dimension_size", [x], "tensor<i32>", f"dimension = {dim} : i64"), [x]
    )


@record("mhlo.copy")
def copy(draw: Draw) -> Case:
    et = draw(st.sampled_from(F + INT))
    shp = shape(draw)
    x = values(draw, shp, et)
    t = ttype(shp, NP[et])
    body = f'%0 = "mhlo.copy"(%a0) : ({t}) -> {t}\n    return %0 : {t}'
    return Case(module([x], [t], body), [x])


@record("stablehlo.optimization_barrier")
def optimization_barrier(draw: Draw) -> Case:
    x = values(draw, shape(draw), "f32")
    n = values(draw, (), "i32")
    return Case(lower(lambda x, n: lax.optimization_barrier((x * 2, n + 1)), x, n), [x, n])


@record("stablehlo.tuple", "stablehlo.get_tuple_element")
def tuple_(draw: Draw) -> Case:
    x, y = _any_values(draw, shape(draw)), _any_values(draw, shape(draw))
    tx, ty = ttype(x.shape, x.dtype), ttype(y.shape, y.dtype)
    k = draw(st.integers(0, 1))
    out = [tx, ty][k]
    body = (
        f'    %t = "stablehlo.tuple"(%a0, %a1) : ({tx}, {ty}) -> tuple<{tx}, {ty}>\n'
        f'    %0 = "stablehlo.get_tuple_element"(%t) {{index = {k} : i32}}'
        f" : (tuple<{tx}, {ty}>) -> {out}\n"
        f"    return %0 : {out}"
    )
    return Case(module([x, y], [out], body), [x, y])


@record("stablehlo.custom_call")
def custom_call_sharding(draw: Draw) -> Case:
    x = _any_values(draw, shape(draw))
    t = ttype(x.shape, x.dtype)
    body = (
        f'    %0 = stablehlo.custom_call @Sharding(%a0) {{mhlo.sharding = "{{replicated}}"}}'
        f" : ({t}) -> {t}\n    return %0 : {t}"
    )
    return Case(module([x], [t], body), [x])


# ==============================================================================================
# gather and scatter
# ==============================================================================================


@dataclass
class _IndexedDims:
    """Random dimension numbers shared by gather and scatter (spec names of gather)."""

    operand: tuple
    batching: list  # operand_batching_dims (sorted)
    idx_batching: list  # start_indices_batching_dims
    index_map: list  # start_index_map
    collapsed: list  # collapsed_slice_dims (sorted)
    slice_sizes: list
    idx_shape: tuple  # start_indices shape
    index_vector_dim: int
    batch_shape: tuple  # start_indices shape without the index vector dim

    @property
    def window_dims(self) -> list:
        return [d for d in range(len(self.operand)) if d not in self.collapsed + self.batching]


def _indexed_dims(draw: Draw, min_index: int = 0) -> _IndexedDims:
    operand = shape(draw, min_rank=1, max_rank=3, lo=1, hi=4)
    r = len(operand)
    dims = list(range(r))
    batching = sorted(draw(st.sets(st.sampled_from(dims), max_size=min(2, r - min_index))))
    free = [d for d in dims if d not in batching]
    index_map = list(draw(st.permutations(free)))[: draw(st.integers(min_index, len(free)))]
    collapsible = [d for d in free if d in index_map or draw(st.booleans())]
    collapsed = sorted(d for d in collapsible if draw(st.booleans()))
    slice_sizes = [
        1 if d in batching or d in collapsed else draw(st.integers(1, operand[d])) for d in dims
    ]
    # start indices: the batching dims somewhere among a few other batch dims
    n_other = draw(st.integers(0, 2))
    n_batch = len(batching) + n_other
    positions = list(draw(st.permutations(range(n_batch))))
    batch_shape = [draw(st.integers(1, 3)) for _ in range(n_batch)]
    for k, d in enumerate(batching):
        batch_shape[positions[k]] = operand[d]
    k = len(index_map)
    implicit = k == 1 and draw(st.booleans())
    ivd = n_batch if implicit else draw(st.integers(0, n_batch))
    idx_shape = list(batch_shape)
    if not implicit:
        idx_shape.insert(ivd, k)
    idx_batching = [p if p < ivd else p + 1 for p in positions[: len(batching)]]
    return _IndexedDims(
        tuple(operand),
        batching,
        idx_batching,
        index_map,
        collapsed,
        slice_sizes,
        tuple(idx_shape),
        ivd,
        tuple(batch_shape),
    )


def _start_indices(draw: Draw, g: _IndexedDims, et: str, in_range: bool) -> np.ndarray:
    """Index values for each start_index_map entry; out of range unless `in_range`."""
    r = rng(draw)
    out = np.zeros(g.idx_shape, dtype=NP[et])
    ivd = g.index_vector_dim
    for k, d in enumerate(g.index_map):
        top = g.operand[d] - g.slice_sizes[d]
        lo, hi = (0, top) if in_range else (-2, g.operand[d] + 1)
        if et.startswith("u"):
            lo = max(lo, 0)
        vals = r.integers(lo, hi, size=g.batch_shape, endpoint=True)
        if len(g.idx_shape) == len(g.batch_shape):  # implicit index vector dim
            out[...] = vals
        else:
            sl = [slice(None)] * len(g.idx_shape)
            sl[ivd] = k
            out[tuple(sl)] = vals
    return out


@record("stablehlo.gather", examples=40)
def gather(draw: Draw) -> Case:
    g = _indexed_dims(draw)
    out_rank = len(g.batch_shape) + len(g.window_dims)
    offset_dims = sorted(draw(st.permutations(range(out_rank)))[: len(g.window_dims)])
    out = [0] * out_rank
    batch_pos = [d for d in range(out_rank) if d not in offset_dims]
    for p, n in zip(batch_pos, g.batch_shape, strict=True):
        out[p] = n
    for p, d in zip(offset_dims, g.window_dims, strict=True):
        out[p] = g.slice_sizes[d]
    et = draw(st.sampled_from(["f32", "i32", "i1"]))
    x = values(draw, g.operand, et)
    it = draw(st.sampled_from(["i32", "i64", "ui32", "i8"]))
    idx = _start_indices(draw, g, it, in_range=False)
    attrs = (
        f"dimension_numbers = #stablehlo.gather<offset_dims = {list(offset_dims)}, "
        f"collapsed_slice_dims = {g.collapsed}, operand_batching_dims = {g.batching}, "
        f"start_indices_batching_dims = {g.idx_batching}, start_index_map = {g.index_map}, "
        f"index_vector_dim = {g.index_vector_dim}>, indices_are_sorted = false, "
        f"slice_sizes = {arr(g.slice_sizes)}"
    )
    return Case(one_op("stablehlo.gather", [x, idx], ttype(out, NP[et]), attrs), [x, idx])


@record("stablehlo.gather", name="gather_jax", examples=12)
def gather_jax(draw: Draw) -> Case:
    x = values(draw, shape(draw, min_rank=2, max_rank=3), "f32")
    n = x.shape[1]
    i = ints(draw, (x.shape[0], draw(st.integers(1, 4))), "i32", -n - 1, n + 1)
    mode = draw(st.sampled_from(["clip", "fill", "promise_in_bounds"]))
    return Case(
        lower(lambda x, i: jax.vmap(lambda a, b: a.at[b].get(mode=mode))(x, i), x, i), [x, i]
    )


# scatter update computations: name -> the op combining old and update values
SCATTER_BODIES = {
    "replace": None,
    "add": "stablehlo.add",
    "max": "stablehlo.maximum",
    "min": "stablehlo.minimum",
    "mul": "stablehlo.multiply",
}


def _region(
    ets: list[str], lines: list[str], results: list[str], rets: list[str] | None = None
) -> str:
    """A region ({ ^bb0(%r0, ...): lines; return results }) with scalar arguments."""
    args = ", ".join(f"%r{i}: tensor<{e}>" for i, e in enumerate(ets))
    rtypes = ", ".join(f"tensor<{e}>" for e in (rets or ets[: len(results)]))
    body = "".join(f"      {ln}\n" for ln in lines)
    ret = f"stablehlo.return {', '.join(results)} : {rtypes}"
    return f"{{\n    ^bb0({args}):\n{body}      {ret}\n    }}"


def _scatter_text(x: list, idx, upd: list, attrs: str, region: str) -> str:
    args = x + [idx] + upd
    types = ", ".join(ttype(a.shape, a.dtype) for a in args)
    outs = [ttype(a.shape, a.dtype) for a in x]
    names = ", ".join(f"%a{i}" for i in range(len(args)))
    res = ", ".join(f"%0#{i}" for i in range(len(x))) if len(x) > 1 else "%0"
    lhs = f"%0:{len(x)}" if len(x) > 1 else "%0"
    body = (
        f'    {lhs} = "stablehlo.scatter"({names}) ({region}) {{{attrs}}}'
        f" : ({types}) -> ({', '.join(outs)})\n    return {res} : {', '.join(outs)}"
    )
    return module(args, outs, body)


@record("stablehlo.scatter", examples=40)
def scatter(draw: Draw) -> Case:
    # XLA ignores scatters whose index vectors are empty (zero-element scatter_indices):
    # keep at least one scattered dim
    g = _indexed_dims(draw, min_index=1)
    kind = draw(st.sampled_from(list(SCATTER_BODIES)))
    variadic = draw(st.booleans())
    upd_rank = len(g.batch_shape) + len(g.window_dims)
    window_pos = sorted(draw(st.permutations(range(upd_rank)))[: len(g.window_dims)])
    upd_shape = [0] * upd_rank
    scatter_pos = [d for d in range(upd_rank) if d not in window_pos]
    for p, n in zip(scatter_pos, g.batch_shape, strict=True):
        upd_shape[p] = n
    for p, d in zip(window_pos, g.window_dims, strict=True):
        upd_shape[p] = draw(st.integers(1, g.operand[d]))
    # scatter has no slice_sizes: a window's extent is the update's window dims
    g.slice_sizes = [1] * len(g.operand)
    for p, d in zip(window_pos, g.window_dims, strict=True):
        g.slice_sizes[d] = upd_shape[p]
    et = draw(st.sampled_from(["f32", "i32"] + (["i1"] if kind in ("replace", "max") else [])))
    it = draw(st.sampled_from(["i32", "i64", "ui32"]))
    in_range = draw(st.booleans())
    idx = _start_indices(draw, g, it, in_range)
    x = [values(draw, g.operand, et)]
    upd = [values(draw, tuple(upd_shape), et)]
    if variadic:
        x.append(values(draw, g.operand, "i32"))
        upd.append(values(draw, tuple(upd_shape), "i32"))
    # the order of updates to one element is unspecified: colliding replacements must agree
    unique = _dedup_scatter(g, idx, upd, window_pos, replace=kind == "replace")
    unique = unique and draw(st.booleans())
    ets = [et_of(a) for a in x] * 2
    n = len(x)
    if kind == "replace":
        region = _region(ets, [], [f"%r{n + i}" for i in range(n)])
    else:
        op = SCATTER_BODIES[kind]
        if et == "i1" and kind == "max":
            op = "stablehlo.or"
        lines = [f"%s{i} = {op} %r{i}, %r{n + i} : tensor<{ets[i]}>" for i in range(n)]
        region = _region(ets, lines, [f"%s{i}" for i in range(n)])
    attrs = (
        f"scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = {window_pos}, "
        f"inserted_window_dims = {g.collapsed}, input_batching_dims = {g.batching}, "
        f"scatter_indices_batching_dims = {g.idx_batching}, "
        f"scatter_dims_to_operand_dims = {g.index_map}, index_vector_dim = {g.index_vector_dim}>, "
        f"indices_are_sorted = false, unique_indices = {str(unique).lower()}"
    )
    return Case(_scatter_text(x, idx, upd, attrs, region), x + [idx] + upd)


def _dedup_scatter(
    g: _IndexedDims, idx: np.ndarray, upd: list, window_pos: list, replace: bool
) -> bool:
    """Whether all update targets are distinct; if `replace`, make colliding updates agree.

    Computes each update element's target index (spec formula, without bounds checks); with
    `replace`, every update element sharing a target with an earlier one gets its value.
    """
    starts = idx if len(g.idx_shape) != len(g.batch_shape) else idx[..., None]
    starts = (
        np.moveaxis(starts, g.index_vector_dim, -1) if starts.ndim > len(g.batch_shape) else starts
    )
    unique = True
    scatter_pos = [d for d in range(upd[0].ndim) if d not in window_pos]
    idx_batch = [p if p < g.index_vector_dim else p - 1 for p in g.idx_batching]
    first: dict = {}
    for ui in np.ndindex(*upd[0].shape):
        si = tuple(ui[d] for d in scatter_pos)
        vec = starts[si]
        target = []
        for d in range(len(g.operand)):
            t = 0
            if d in g.index_map:
                t += int(vec[g.index_map.index(d)])
            if d in g.batching:
                t += si[idx_batch[g.batching.index(d)]]
            if d in g.window_dims:
                t += ui[window_pos[g.window_dims.index(d)]]
            target.append(t)
        t = tuple(target)
        if t in first:
            unique = False
            for u in upd if replace else []:
                u[ui] = u[first[t]]
        else:
            first[t] = ui
    return unique


@record("stablehlo.scatter", name="scatter_jax", examples=12)
def scatter_jax(draw: Draw) -> Case:
    x = values(draw, shape(draw, min_rank=1, max_rank=3), "f32")
    n = x.shape[0]
    i = ints(draw, (draw(st.integers(1, 5)),), "i32", -n - 2, n + 1)
    u = values(draw, i.shape + x.shape[1:], "f32")
    how = draw(st.sampled_from(["add", "max", "min", "mul"]))
    mode = draw(st.sampled_from(["clip", "drop", "promise_in_bounds"]))

    def f(x, i, u):
        return getattr(x.at[i], how)(u, mode=mode)

    return Case(lower(f, x, i, u), [x, i, u])


# ==============================================================================================
# Reductions and contractions
# ==============================================================================================


@record("stablehlo.reduce", examples=20)
def reduce_fast(draw: Draw) -> Case:
    how = draw(st.sampled_from(["sum", "prod", "max", "min", "all", "any"]))
    et = "i1" if how in ("all", "any") else draw(st.sampled_from(["f32", "i32", "ui8", "i8"]))
    x = values(draw, shape(draw, lo=0), et, lo=-2, hi=2)
    axes = tuple(sorted(draw(st.sets(st.integers(0, max(x.ndim - 1, 0)), max_size=x.ndim))))
    init = {"sum": 0, "prod": 1, "all": True, "any": False}.get(how)
    if init is None:
        if et == "f32":
            init = -np.inf if how == "max" else np.inf
        else:
            info = np.iinfo(NP[et])
            init = info.min if how == "max" else info.max
    comp = {
        "sum": lax.add,
        "prod": lax.mul,
        "max": lax.max,
        "min": lax.min,
        "all": lax.bitwise_and,
        "any": lax.bitwise_or,
    }[how]
    init = np.asarray(init, dtype=NP[et])
    return Case(lower(lambda x: lax.reduce(x, init, comp, axes), x), [x])


@record("stablehlo.reduce", name="reduce_argmax", examples=15)
def reduce_argmax(draw: Draw) -> Case:
    et = draw(st.sampled_from(["f32", "i32"]))
    # small integers (ties) that never equal the init (XLA may use it any number of times)
    x = ints(draw, shape(draw, min_rank=1), et, -3, 3)
    axes = tuple(sorted(draw(st.sets(st.integers(0, x.ndim - 1), min_size=1))))
    largest = draw(st.booleans())

    def body(a, b):
        va, ia = a
        vb, ib = b
        better = (va > vb) if largest else (va < vb)
        pick_a = better | ((va == vb) & (ia < ib))
        return lax.select(pick_a, va, vb), lax.select(pick_a, ia, ib)

    init_v = (
        np.asarray(-np.inf if largest else np.inf, np.float32)
        if et == "f32"
        else np.asarray(np.iinfo(np.int32).min if largest else np.iinfo(np.int32).max, np.int32)
    )

    def f(x):
        return lax.reduce(
            (x, lax.broadcasted_iota(np.int32, x.shape, axes[-1])),
            (init_v, np.int32(0)),
            body,
            axes,
        )

    return Case(lower(f, x), [x])


@record("stablehlo.reduce", name="reduce_select_body")
def reduce_select_body(draw: Draw) -> Case:
    # a single-operand reducer the fast path does not recognise (init: its identity, as
    # XLA may use the init any number of times)
    x = values(draw, shape(draw, min_rank=1), "i32")
    axes = tuple(sorted(draw(st.sets(st.integers(0, x.ndim - 1), min_size=1))))
    init = np.int32(np.iinfo(np.int32).min)
    return Case(
        lower(lambda x: lax.reduce(x, init, lambda a, b: lax.select(a > b, a, b), axes), x), [x]
    )


def _window_params(draw: Draw, rank: int) -> dict:
    return {
        "window_dimensions": [draw(st.integers(1, 3)) for _ in range(rank)],
        "window_strides": [draw(st.integers(1, 2)) for _ in range(rank)],
        "padding": [(draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(rank)],
        "base_dilation": [draw(st.integers(1, 2)) for _ in range(rank)],
        "window_dilation": [draw(st.integers(1, 2)) for _ in range(rank)],
    }


@record("stablehlo.reduce_window", examples=20)
def reduce_window(draw: Draw) -> Case:
    how = draw(st.sampled_from(["add", "max", "min", "mul"]))
    et = draw(st.sampled_from(["f32", "i32"]))
    x = values(draw, shape(draw, min_rank=1, hi=5), et, lo=-2, hi=2, special=False)
    p = _window_params(draw, x.ndim)
    # the init must be the identity: XLA may use it any number of times (spec: unspecified)
    big = np.inf if et == "f32" else np.iinfo(np.int32).max
    init = np.asarray({"add": 0, "max": -big, "min": big, "mul": 1}[how], dtype=NP[et])
    comp = {"add": lax.add, "max": lax.max, "min": lax.min, "mul": lax.mul}[how]
    return Case(lower(lambda x, v: lax.reduce_window(x, v, comp, **p), x, init), [x, init])


@record("stablehlo.reduce_window", name="reduce_window_variadic", examples=12)
def reduce_window_variadic(draw: Draw) -> Case:
    x = values(draw, shape(draw, min_rank=1, hi=5), "f32", special=False)
    y = values(draw, x.shape, "i32")
    p = _window_params(draw, x.ndim)

    def comp(a, b):
        return lax.max(a[0], b[0]), a[1] + b[1]

    def f(x, y):
        return lax.reduce_window((x, y), (np.float32(-np.inf), np.int32(0)), comp, **p)

    return Case(lower(f, x, y), [x, y])


@record("stablehlo.dot_general", examples=25)
def dot_general(draw: Draw) -> Case:
    nb, nc, nl, nr = (draw(st.integers(0, 2)) for _ in range(4))
    sizes = lambda n: [draw(st.integers(1, 3)) for _ in range(n)]  # noqa: E731
    b, c, fl, fr = sizes(nb), sizes(nc), sizes(nl), sizes(nr)
    lperm = list(draw(st.permutations(range(nb + nc + nl))))
    rperm = list(draw(st.permutations(range(nb + nc + nr))))
    lshape = [0] * len(lperm)
    rshape = [0] * len(rperm)
    # canonical lhs order: batch, contract, free; lperm[k] = position of canonical dim k
    for k, n in enumerate(b + c + fl):
        lshape[lperm[k]] = n
    for k, n in enumerate(b + c + fr):
        rshape[rperm[k]] = n
    dims = (
        ([lperm[nb + k] for k in range(nc)], [rperm[nb + k] for k in range(nc)]),
        ([lperm[k] for k in range(nb)], [rperm[k] for k in range(nb)]),
    )
    kind = draw(st.sampled_from(["f32", "i32", "i8->i32", "f16->f32", "i1"]))
    src, _, dst = kind.partition("->")
    x, y = (
        values(draw, tuple(lshape), src, lo=-2, hi=2),
        values(draw, tuple(rshape), src, lo=-2, hi=2),
    )
    pref = NP[dst] if dst else None
    return Case(
        lower(lambda x, y: lax.dot_general(x, y, dims, preferred_element_type=pref), x, y), [x, y]
    )


@record("stablehlo.sort", examples=20)
def sort(draw: Draw) -> Case:
    x = values(
        draw,
        shape(draw, min_rank=1, hi=5),
        draw(st.sampled_from(["f32", "i32", "ui8"])),
        lo=-2,
        hi=2,
    )
    if x.dtype == np.float32:
        x = np.where(np.isfinite(x), np.round(x), x).astype(np.float32)  # ties, NaN, -0.0
    y = values(draw, x.shape, "i32", lo=-2, hi=2)
    z = np.arange(x.size, dtype=np.int32).reshape(x.shape)  # the original position
    dim = draw(st.integers(-x.ndim, x.ndim - 1))
    num_keys = draw(st.integers(1, 2))
    return Case(
        lower(
            lambda x, y, z: lax.sort((x, y, z), dimension=dim, is_stable=True, num_keys=num_keys),
            x,
            y,
            z,
        ),
        [x, y, z],
    )


@record("stablehlo.sort", name="sort_descending")
def sort_descending(draw: Draw) -> Case:
    et = draw(st.sampled_from(["i32", "f32"]))
    x = values(draw, shape(draw, min_rank=1, hi=5), et, special=False)
    z = np.arange(x.size, dtype=np.int32).reshape(x.shape)
    dim = draw(st.integers(0, x.ndim - 1))
    t, tz = ttype(x.shape, x.dtype), ttype(z.shape, z.dtype)
    kind = "FLOAT" if et == "f32" else "SIGNED"
    scalars = f"(tensor<{et}>, tensor<{et}>)"
    region = _region(
        [et, et, "i32", "i32"],
        [f"%c = stablehlo.compare GT, %r0, %r1, {kind} : {scalars} -> tensor<i1>"],
        ["%c"],
        ["i1"],
    )
    body = (
        f'    %0:2 = "stablehlo.sort"(%a0, %a1) ({region}) {{dimension = {dim} : i64, '
        f"is_stable = true}} : ({t}, {tz}) -> ({t}, {tz})\n"
        f"    return %0#0, %0#1 : {t}, {tz}"
    )
    return Case(module([x, z], [t, tz], body), [x, z])


@record("stablehlo.convolution", examples=25)
def convolution(draw: Draw) -> Case:
    nsp = draw(st.integers(1, 2))
    g_f, g_b = draw(st.sampled_from([(1, 1), (1, 1), (2, 1), (3, 1), (1, 2)]))
    n = g_b * draw(st.integers(1, 2))
    c = g_f * draw(st.integers(1, 2))
    o = g_f * g_b * draw(st.integers(1, 2))
    spatial = [draw(st.integers(1, 5)) for _ in range(nsp)]
    kernel = [draw(st.integers(1, 3)) for _ in range(nsp)]
    lhs_spec = list(draw(st.permutations(range(nsp + 2))))  # (batch, feature, spatial...)
    rhs_spec = list(draw(st.permutations(range(nsp + 2))))  # (out feature, in feature, ...)
    out_spec = list(draw(st.permutations(range(nsp + 2))))
    lshape, rshape = [0] * (nsp + 2), [0] * (nsp + 2)
    for d, size in zip(lhs_spec, [n, c, *spatial], strict=True):
        lshape[d] = size
    for d, size in zip(rhs_spec, [o, c // g_f, *kernel], strict=True):
        rshape[d] = size
    params = {
        "window_strides": [draw(st.integers(1, 2)) for _ in range(nsp)],
        "padding": [(draw(st.integers(-1, 2)), draw(st.integers(0, 2))) for _ in range(nsp)],
        "lhs_dilation": [draw(st.integers(1, 2)) for _ in range(nsp)],
        "rhs_dilation": [draw(st.integers(1, 2)) for _ in range(nsp)],
        "dimension_numbers": lax.ConvDimensionNumbers(
            tuple(lhs_spec), tuple(rhs_spec), tuple(out_spec)
        ),
        "feature_group_count": g_f,
        "batch_group_count": g_b,
    }
    et = draw(st.sampled_from(["f32", "f32", "i32"]))
    x = values(draw, tuple(lshape), et, lo=-2, hi=2, special=False)
    k = values(draw, tuple(rshape), et, lo=-2, hi=2, special=False)
    try:
        text = lower(lambda x, k: lax.conv_general_dilated(x, k, **params), x, k)
    except (TypeError, ValueError) as e:  # e.g. padding that leaves no output
        assume(False, str(e))
    # window reversal (jax never sets it): flip the flags in the printed op
    flags = [draw(st.booleans()) for _ in range(nsp)]
    old = "reverse = [" + ", ".join(["false"] * nsp) + "]"
    new = "reverse = [" + ", ".join(str(f).lower() for f in flags) + "]"
    return Case(text.replace(old, new), [x, k])


def _distinct(draw: Draw, shp: tuple, dtype: type) -> np.ndarray:
    """Distinct values: which of equal elements a window selects is implementation-defined
    (XLA's choice among ties depends on the padding), so windows must not hold ties."""
    n = int(np.prod(shp))
    return (rng(draw).permutation(n) - n // 2).astype(dtype).reshape(shp)


@record("stablehlo.select_and_scatter", examples=15)
def select_and_scatter_jax(draw: Draw) -> Case:
    # the gradient of max (or min) pooling
    x = _distinct(draw, shape(draw, min_rank=1, hi=5), np.float32)
    dims = [draw(st.integers(1, 3)) for _ in range(x.ndim)]
    strides = [draw(st.integers(1, 2)) for _ in range(x.ndim)]
    padding = [(draw(st.integers(0, 1)), draw(st.integers(0, 1))) for _ in range(x.ndim)]
    biggest = draw(st.booleans())

    def pool(y):
        init, comp = (-np.inf, lax.max) if biggest else (np.inf, lax.min)
        return lax.reduce_window(y, np.float32(init), comp, dims, strides, padding)

    def f(x, g):
        return jax.vjp(pool, x)[1](g)[0]

    g = values(draw, jax.eval_shape(pool, x).shape, "f32", special=False)
    return Case(lower(f, x, g), [x, g])


@record("stablehlo.select_and_scatter", name="select_and_scatter_text", examples=15)
def select_and_scatter_text(draw: Draw) -> Case:
    x = _distinct(draw, shape(draw, min_rank=1, hi=5), np.int32)
    rank = x.ndim
    dims = [draw(st.integers(1, 3)) for _ in range(rank)]
    strides = [draw(st.integers(1, 2)) for _ in range(rank)]
    padding = [[draw(st.integers(0, 1)), draw(st.integers(0, 1))] for _ in range(rank)]
    src_shape = tuple(
        max(0, (x.shape[d] + sum(padding[d]) - dims[d]) // strides[d] + 1) for d in range(rank)
    )
    src = values(draw, src_shape, "i32", lo=-3, hi=3)
    init = values(draw, (), "i32")
    direction = draw(st.sampled_from(["GE", "GT", "LE", "LT"]))
    combine = draw(st.sampled_from(["add", "maximum"]))
    t, ts = ttype(x.shape, "i32"), ttype(src_shape, "i32")
    body = (
        f'    %0 = "stablehlo.select_and_scatter"(%a0, %a1, %a2) ({{\n'
        f"    ^bb0(%p: tensor<i32>, %q: tensor<i32>):\n"
        f"      %c = stablehlo.compare {direction}, %p, %q, SIGNED"
        f" : (tensor<i32>, tensor<i32>) -> tensor<i1>\n"
        f"      stablehlo.return %c : tensor<i1>\n    }}, {{\n"
        f"    ^bb0(%p: tensor<i32>, %q: tensor<i32>):\n"
        f"      %s = stablehlo.{combine} %p, %q : tensor<i32>\n"
        f"      stablehlo.return %s : tensor<i32>\n    }}) {{window_dimensions = {arr(dims)}, "
        f"window_strides = {arr(strides)}, padding = {dense2d(padding)}}}"
        f" : ({t}, {ts}, tensor<i32>) -> {t}\n    return %0 : {t}"
    )
    return Case(module([x, src, init], [t], body), [x, src, init])


# ==============================================================================================
# Control flow and calls
# ==============================================================================================


@record("stablehlo.while")
def while_(draw: Draw) -> Case:
    n = ints(draw, (), "i32", -2, 6)
    x = values(draw, shape(draw), "f32", lo=-1, hi=1, special=False)

    def f(n, x):
        def body(c):
            i, acc, y = c
            return i + 1, acc * 0.5 + y, y + 1

        return lax.while_loop(lambda c: c[0] < n, body, (np.int32(0), x, x))

    return Case(lower(f, n, x), [n, x])


@record("stablehlo.case", examples=12)
def case(draw: Draw) -> Case:
    x = values(draw, shape(draw), "f32")
    branches = [lambda x: x + 1, lambda x: x * 2, lambda x: x - 3, jnp.sin][
        : draw(st.integers(2, 4))
    ]
    if draw(st.booleans()):  # lax.switch clamps the index itself
        i = ints(draw, (), "i32", -2, 5)
        return Case(lower(lambda i, x: lax.switch(i, branches, x), i, x), [i, x])
    # raw stablehlo.case: an out-of-range index runs the last branch
    i = ints(draw, (), "i32", -3, 5)
    t = ttype(x.shape, x.dtype)
    regions = []
    for k in range(draw(st.integers(1, 3))):
        regions.append(
            f"{{\n      %c = stablehlo.constant dense<{k + 1}.0> : {t}\n"
            f"      %y = stablehlo.multiply %a1, %c : {t}\n      stablehlo.return %y : {t}\n    }}"
        )
    body = (
        f'    %0 = "stablehlo.case"(%a0) ({", ".join(regions)}) : (tensor<i32>) -> {t}\n'
        f"    return %0 : {t}"
    )
    return Case(module([i, x], [t], body), [i, x])


@record("stablehlo.if")
def if_(draw: Draw) -> Case:
    p = values(draw, (), "i1")
    x = values(draw, shape(draw), "f32")
    t = ttype(x.shape, x.dtype)
    body = (
        f'    %0 = "stablehlo.if"(%a0) ({{\n      %y = stablehlo.add %a1, %a1 : {t}\n'
        f"      stablehlo.return %y : {t}\n    }}, {{\n      %y = stablehlo.negate %a1 : {t}\n"
        f"      stablehlo.return %y : {t}\n    }}) : (tensor<i1>) -> {t}\n    return %0 : {t}"
    )
    return Case(module([p, x], [t], body), [p, x])


@record("func.call")
def call(draw: Draw) -> Case:
    x = values(draw, shape(draw), "f32")

    @jax.jit
    def inner(y):
        return y * 3 + 1

    return Case(lower(lambda x: inner(x) - inner(-x), x), [x])


@record("stablehlo.composite")
def composite(draw: Draw) -> Case:
    x = values(draw, shape(draw), "f32")
    t = ttype(x.shape, x.dtype)
    text = (
        "module {\n"
        f"  func.func public @main(%a0: {t}) -> ({t}) {{\n"
        f'    %0 = "stablehlo.composite"(%a0) {{name = "tv.twice_plus_one", '
        f"decomposition = @twice_plus_one, composite_attributes = {{k = 2 : i64}}, "
        f"version = 1 : i32}} : ({t}) -> {t}\n"
        f"    return %0 : {t}\n  }}\n"
        f"  func.func private @twice_plus_one(%x: {t}) -> {t} {{\n"
        f"    %c = stablehlo.constant dense<1.0> : {t}\n"
        f"    %y = stablehlo.add %x, %x : {t}\n"
        f"    %z = stablehlo.add %y, %c : {t}\n"
        f"    return %z : {t}\n  }}\n}}\n"
    )
    return Case(text, [x])


# ==============================================================================================
# Normalization
# ==============================================================================================


def _batch_norm_case(draw: Draw, kind: str) -> Case:
    et = draw(st.sampled_from(["f32", "f32", "f64"]))  # f16 rounds intermediates visibly
    shp = shape(draw, min_rank=1, max_rank=4)
    fi = draw(st.integers(0, len(shp) - 1))
    c = shp[fi]
    x = values(draw, shp, et, lo=-3, hi=3, special=False)
    scale = values(draw, (c,), et, lo=-2, hi=2, special=False)
    offset = values(draw, (c,), et, lo=-2, hi=2, special=False)
    mean = values(draw, (c,), et, lo=-1, hi=1, special=False)
    var = values(draw, (c,), et, lo=0.25, hi=3, special=False)
    eps = draw(st.sampled_from(["1.000000e-05", "1.000000e-03", "0.000000e+00", "1.000000e-01"]))
    if eps.startswith("0") and kind != "inference":
        assume(len(shp) > 1 and int(np.prod(shp)) > c)  # a variance of one element is 0
    t, tc = ttype(shp, et), ttype((c,), et)
    attrs = f"epsilon = {eps} : f32, feature_index = {fi} : i64"
    if kind == "training":
        args = [x, scale, offset]
        body = (
            f'    %0:3 = "stablehlo.batch_norm_training"(%a0, %a1, %a2) {{{attrs}}}'
            f" : ({t}, {tc}, {tc}) -> ({t}, {tc}, {tc})\n"
            f"    return %0#0, %0#1, %0#2 : {t}, {tc}, {tc}"
        )
        return Case(module(args, [t, tc, tc], body), args)
    if kind == "inference":
        args = [x, scale, offset, mean, var]
        body = (
            f'    %0 = "stablehlo.batch_norm_inference"(%a0, %a1, %a2, %a3, %a4) {{{attrs}}}'
            f" : ({t}, {tc}, {tc}, {tc}, {tc}) -> {t}\n    return %0 : {t}"
        )
        return Case(module(args, [t], body), args)
    g = values(draw, shp, et, lo=-2, hi=2, special=False)
    args = [x, scale, mean, var, g]
    body = (
        f'    %0:3 = "stablehlo.batch_norm_grad"(%a0, %a1, %a2, %a3, %a4) {{{attrs}}}'
        f" : ({t}, {tc}, {tc}, {tc}, {t}) -> ({t}, {tc}, {tc})\n"
        f"    return %0#0, %0#1, %0#2 : {t}, {tc}, {tc}"
    )
    return Case(module(args, [t, tc, tc], body), args)


for _kind in ["training", "inference", "grad"]:
    record(f"stablehlo.batch_norm_{_kind}", name=f"batch_norm_{_kind}", rtol=2e-3, atol=2e-3)(
        partial(_batch_norm_case, kind=_kind)
    )


@record(rtol=1e-3, atol=1e-4)  # no registered op: the importer rewrites them to CHLO
def mhlo_custom_calls(draw: Draw) -> Case:
    # what XLA's HLO -> StableHLO conversion (torch_xla's export) writes for HLO math ops
    # StableHLO lacks: `custom_call @mhlo.erf` is exact GELU's erf
    name = draw(st.sampled_from(["erf", "tan", "asin", "acos", "acosh", "asinh", "atanh", "sinh"]))
    lo, hi = CHLO_LEGALIZED.get(f"chlo.{name}", (-3, 3))
    et = draw(st.sampled_from(["f32", "f64"]))
    x = values(draw, shape(draw), et, lo=lo, hi=hi)
    t = ttype(x.shape, et)
    body = (
        f"    %0 = stablehlo.custom_call @mhlo.{name}(%a0) {{mhlo.attributes = {{}}, "
        f"mhlo.version = 1 : i64}} : ({t}) -> {t}\n    return %0 : {t}"
    )
    return Case(module([x], [t], body), [x])


def _topk_operand(draw: Draw, ets=("f32", "f32", "f64", "i32", "i64", "ui8", "bf16")) -> np.ndarray:
    et = draw(st.sampled_from(ets))
    x = values(draw, shape(draw, min_rank=1, hi=6), et, lo=-3, hi=3)
    if et in FLOATS:  # ties, -0.0, NaN, infinities
        x = np.where(np.isfinite(x), np.round(x), x).astype(NP[et])
    return x


@record("mhlo.topk", examples=25)
def mhlo_topk(draw: Draw) -> Case:
    # HLO's TopK as torch_xla's export writes it (the importer makes it `mhlo.topk`)
    x = _topk_operand(draw)
    k = draw(st.integers(0, x.shape[-1]))
    largest = draw(st.sampled_from(["", ", largest = true"]))  # XLA:CPU cannot run false
    out = x.shape[:-1] + (k,)
    t, tv, ti = ttype(x.shape, x.dtype), ttype(out, x.dtype), ttype(out, "i32")
    body = (
        f"    %0:2 = stablehlo.custom_call @mhlo.topk(%a0) {{mhlo.attributes = "
        f"{{k = {k} : i64{largest}}}, mhlo.version = 1 : i64}} : ({t}) -> ({tv}, {ti})\n"
        f"    return %0#0, %0#1 : {tv}, {ti}"
    )
    return Case(module([x], [tv, ti], body), [x])


@record(examples=15)  # no registered op: chlo-legalize-to-stablehlo's sort and slices
def chlo_top_k(draw: Draw) -> Case:
    x = _topk_operand(draw, ("f32", "i32", "bf16"))  # lower() traces without x64
    k = draw(st.integers(0, x.shape[-1]))
    return Case(lower(lambda x: lax.top_k(x, k), x), [x])


# ==============================================================================================
# Random bits
# ==============================================================================================


@record("stablehlo.rng_bit_generator", examples=25)
def rng_bit_generator(draw: Draw) -> Case:
    # XLA's generators bit for bit: DEFAULT (Philox on CPU), PHILOX with a 2- or 3-word
    # state, THREE_FRY; counters next to 2**64 (carries); 8 to 64-bit results
    algorithm = draw(st.sampled_from(["DEFAULT", "PHILOX", "THREE_FRY"]))
    words = 2 if algorithm == "THREE_FRY" else draw(st.sampled_from([2, 3]))
    state = rng(draw).integers(0, 2**64, size=words, dtype=np.uint64, endpoint=False)
    if draw(st.booleans()):
        state[1] = np.uint64(2**64 - draw(st.integers(1, 3)))
    et = draw(st.sampled_from(["ui32", "ui32", "ui64", "ui8", "ui16"]))
    shp = shape(draw, max_rank=3, hi=5)
    ts, t = ttype((words,), "ui64"), ttype(shp, et)
    body = (
        f"    %0, %1 = stablehlo.rng_bit_generator %a0, algorithm = {algorithm}"
        f" : ({ts}) -> ({ts}, {t})\n    return %0, %1 : {ts}, {t}"
    )
    return Case(module([state], [ts, t], body), [state])


@record("stablehlo.rng_bit_generator", name="rng_uniform_jax", examples=10)
def rng_uniform_jax(draw: Draw) -> Case:
    # jax.random with the "rbg" implementation: rng_bit_generator under uniform floats
    shp = shape(draw, min_rank=1, hi=5)
    seed = draw(st.integers(0, 2**31 - 1))

    def f(x):
        key = jax.random.key(seed, impl="rbg")
        return x * jax.random.uniform(key, x.shape) + jax.random.bernoulli(key, 0.3, x.shape)

    x = values(draw, shp, "f32", special=False)
    return Case(lower(f, x), [x])


# ==============================================================================================
# Dynamic-shape ops with known shapes, and map
# ==============================================================================================


def _i64s(name: str, vals, it: str = "i64") -> str:
    v = ", ".join(str(int(x)) for x in vals)
    return f"    %{name} = stablehlo.constant dense<[{v}]> : tensor<{len(vals)}x{it}>\n"


@record("stablehlo.dynamic_iota", "stablehlo.dynamic_reshape", "stablehlo.dynamic_broadcast_in_dim")
def dynamic_shapes(draw: Draw) -> Case:
    et = draw(st.sampled_from(["f32", "i32"]))
    it = draw(st.sampled_from(["i64", "i32"]))
    shp = shape(draw, min_rank=1)
    x = values(draw, shp, et, special=False)
    t = ttype(shp, et)
    dim = draw(st.integers(0, len(shp) - 1))
    flat = ttype((x.size,), et)
    lead = draw(st.integers(1, 3))
    big = ttype((lead, x.size), et)
    body = (
        _i64s("s", shp, it)
        + _i64s("f", [x.size], it)
        + _i64s("b", [lead, x.size], it)
        + f"    %0 = stablehlo.dynamic_iota %s, dim = {dim} : (tensor<{len(shp)}x{it}>) -> {t}\n"
        f"    %1 = stablehlo.add %0, %a0 : {t}\n"
        f"    %2 = stablehlo.dynamic_reshape %1, %f : ({t}, tensor<1x{it}>) -> {flat}\n"
        f"    %3 = stablehlo.dynamic_broadcast_in_dim %2, %b, dims = [1]"
        f" : ({flat}, tensor<2x{it}>) -> {big}\n"
        f"    return %3 : {big}"
    )
    return Case(module([x], [big], body), [x])


@record("stablehlo.dynamic_pad")
def dynamic_pad(draw: Draw) -> Case:
    et = draw(st.sampled_from(["f32", "i32"]))
    x = values(draw, shape(draw, min_rank=1), et, special=False)
    v = values(draw, (), et, special=False)
    lo = [draw(st.integers(-1, 2)) for _ in x.shape]
    hi = [draw(st.integers(-1, 2)) for _ in x.shape]
    interior = [draw(st.integers(0, 2)) for _ in x.shape]
    out = [
        n + max(n - 1, 0) * i + a + b for n, a, b, i in zip(x.shape, lo, hi, interior, strict=True)
    ]
    assume(all(o >= 0 for o in out))
    t, to, tp = ttype(x.shape, et), ttype(out, et), f"tensor<{x.ndim}xi64>"
    body = (
        _i64s("l", lo)
        + _i64s("h", hi)
        + _i64s("i", interior)
        + f"    %0 = stablehlo.dynamic_pad %a0, %a1, %l, %h, %i"
        f" : ({t}, tensor<{et}>, {tp}, {tp}, {tp}) -> {to}\n    return %0 : {to}"
    )
    return Case(module([x, v], [to], body), [x, v])


@record("stablehlo.dynamic_gather", examples=20)
def dynamic_gather(draw: Draw) -> Case:
    # the gather record's programs, slice sizes as an operand
    case = gather(draw)
    m = re.search(r"slice_sizes = array<i64: ([\d, ]*)>", case.text)
    sizes = [int(s) for s in m.group(1).split(",")] if m.group(1).strip() else []
    text = case.text.replace(", " + m.group(0), "")
    text = text.replace('"stablehlo.gather"(%a0, %a1)', '"stablehlo.dynamic_gather"(%a0, %a1, %ss)')
    text = re.sub(
        r"\) -> (tensor<[^>]*>)\n", rf", tensor<{len(sizes)}xi64>) -> \1\n", text, count=1
    )
    text = text.replace("    %0 = ", _i64s("ss", sizes) + "    %0 = ", 1)
    return Case(text, case.args)


@record("stablehlo.map")
def map_(draw: Draw) -> Case:
    et = draw(st.sampled_from(["f32", "i32"]))
    shp = shape(draw)
    x, y = values(draw, shp, et, special=False), values(draw, shp, et, special=False)
    t, s = ttype(shp, et), f"tensor<{et}>"
    combine = draw(st.sampled_from(["multiply", "maximum", "subtract"]))
    body = (
        f'    %0 = "stablehlo.map"(%a0, %a1) ({{\n'
        f"    ^bb0(%x: {s}, %y: {s}):\n"
        f"      %m = stablehlo.{combine} %x, %y : {s}\n"
        f"      %r = stablehlo.add %m, %x : {s}\n"
        f"      stablehlo.return %r : {s}\n"
        f"    }}) {{dimensions = {arr(range(len(shp)))}}} : ({t}, {t}) -> {t}\n"
        f"    return %0 : {t}"
    )
    return Case(module([x, y], [t], body), [x, y])


# ==============================================================================================
# Linear algebra
# ==============================================================================================


@record("stablehlo.cholesky", rtol=1e-3, atol=1e-3)
def cholesky(draw: Draw) -> Case:
    n = draw(st.integers(1, 4))
    batch = shape(draw, max_rank=2, hi=2)
    m = values(draw, (*batch, n, n), "f64", lo=-1, hi=1, special=False)
    spd = m @ np.swapaxes(m, -1, -2) + n * np.eye(n)  # well conditioned
    kind = draw(st.sampled_from(["spd", "spd", "raw"]))  # raw: often not positive definite
    x = (spd if kind == "spd" else m * 3).astype(np.float32)
    lower = draw(st.booleans())
    t = ttype(x.shape, "f32")
    body = (
        f'    %0 = "stablehlo.cholesky"(%a0) {{lower = {str(lower).lower()}}} : ({t}) -> {t}\n'
        f"    return %0 : {t}"
    )
    return Case(module([x], [t], body), [x])


@record("stablehlo.triangular_solve", rtol=1e-3, atol=1e-3, examples=20)
def triangular_solve(draw: Draw) -> Case:
    n, k = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    batch = shape(draw, max_rank=1, hi=2)
    left = draw(st.booleans())
    a = values(draw, (*batch, n, n), "f32", lo=-1, hi=1, special=False)
    a = (a + np.eye(n, dtype=np.float32) * 3 * rng(draw).choice([-1, 1], size=n)).astype(np.float32)
    b = values(draw, (*batch, n, k) if left else (*batch, k, n), "f32", special=False)
    lower, unit = draw(st.booleans()), draw(st.booleans())
    tr = draw(st.sampled_from(["NO_TRANSPOSE", "TRANSPOSE", "ADJOINT"]))
    ta, tb = ttype(a.shape, "f32"), ttype(b.shape, "f32")
    body = (
        f'    %0 = "stablehlo.triangular_solve"(%a0, %a1) {{left_side = {str(left).lower()}, '
        f"lower = {str(lower).lower()}, unit_diagonal = {str(unit).lower()}, "
        f"transpose_a = #stablehlo<transpose {tr}>}} : ({ta}, {tb}) -> {tb}\n"
        f"    return %0 : {tb}"
    )
    return Case(module([a, b], [tb], body), [a, b])


# ==============================================================================================
# Complex numbers
# ==============================================================================================

CT = {"f32": "complex<f32>", "f64": "complex<f64>"}


def _complex_arg(shp: tuple, et: str, name: str, a: str, b: str) -> str:
    """`%name = complex(%a, %b)` of two real arguments."""
    return f"    %{name} = stablehlo.complex %{a}, %{b} : {ttype(shp, CT[et])}\n"


def _parts(value: str, shp: tuple, et: str) -> tuple[str, list[str]]:
    """real and imag of a complex value, returned: results as reals (tests compare reals)."""
    t, c = ttype(shp, et), ttype(shp, CT[et])
    text = (
        f"    %re = stablehlo.real %{value} : ({c}) -> {t}\n"
        f"    %im = stablehlo.imag %{value} : ({c}) -> {t}\n"
        f"    return %re, %im : {t}, {t}"
    )
    return text, [t, t]


@record("stablehlo.complex", "stablehlo.real", "stablehlo.imag", examples=20)
def complex_arithmetic(draw: Draw) -> Case:
    # complex operands through the element-wise ops that know them, a complex constant,
    # and converts between complex widths and from reals
    et = draw(st.sampled_from(["f32", "f64"]))
    shp = shape(draw, hi=3)
    args = [values(draw, shp, et, special=False) for _ in range(4)]
    t, c = ttype(shp, et), ttype(shp, CT[et])
    body = _complex_arg(shp, et, "x", "a0", "a1") + _complex_arg(shp, et, "y", "a2", "a3")
    names = ["add", "subtract", "multiply", "divide", "negate", "exponential", "abs", "select"]
    name = draw(st.sampled_from(names))
    if name in ("negate", "exponential"):
        body += f"    %z = stablehlo.{name} %x : {c}\n"
    elif name == "abs":  # a real result
        body += f"    %z0 = stablehlo.abs %x : ({c}) -> {t}\n"
        body += f"    %z = stablehlo.convert %z0 : ({t}) -> {c}\n"
    elif name == "select":
        body += f"    %p = stablehlo.compare GT, %a0, %a2 : ({t}, {t}) -> {ttype(shp, 'i1')}\n"
        body += f"    %z = stablehlo.select %p, %x, %y : {ttype(shp, 'i1')}, {c}\n"
    else:
        body += f"    %z = stablehlo.{name} %x, %y : {c}\n"
    re, im = (float(v) for v in rng(draw).uniform(-2, 2, 2))
    body += f"    %k = stablehlo.constant dense<({re!r}, {im!r})> : {c}\n"
    body += f"    %w = stablehlo.add %z, %k : {c}\n"
    if draw(st.booleans()):  # to the other width and back, and a real number as complex
        other = "f64" if et == "f32" else "f32"
        body += f"    %v = stablehlo.convert %w : ({c}) -> {ttype(shp, CT[other])}\n"
        body += f"    %u = stablehlo.convert %v : ({ttype(shp, CT[other])}) -> {c}\n"
        body += f"    %r = stablehlo.convert %a3 : ({t}) -> {c}\n"
        body += f"    %s = stablehlo.multiply %u, %r : {c}\n"
    else:
        body += f"    %s = stablehlo.add %w, %w : {c}\n"
    text, results = _parts("s", shp, et)
    return Case(module(args, results, body + text), args)


@record("stablehlo.imag", name="imag_of_real")
def imag_of_real(draw: Draw) -> Case:
    # the imaginary part of a real number: zero
    x = values(draw, shape(draw), draw(st.sampled_from(["f32", "f64"])), special=False)
    return Case(one_op("stablehlo.imag", [x], ttype(x.shape, et_of(x))), [x])


@record("stablehlo.fft", examples=40, rtol=1e-4, atol=1e-4)
def fft(draw: Draw) -> Case:
    # FFT / IFFT / RFFT / IRFFT over 1 to 3 trailing dimensions of lengths 1 to 8
    et = draw(st.sampled_from(["f32", "f32", "f64"]))
    kind = draw(st.sampled_from(["FFT", "IFFT", "RFFT", "IRFFT"]))
    lengths = [draw(st.integers(1, 8)) for _ in range(draw(st.integers(1, 3)))]
    batch = list(shape(draw, max_rank=1, hi=3))
    full = tuple(batch + lengths)
    half = tuple(batch + lengths[:-1] + [lengths[-1] // 2 + 1])
    in_shape, out_shape = {
        "FFT": (full, full),
        "IFFT": (full, full),
        "RFFT": (full, half),
        "IRFFT": (half, full),
    }[kind]
    attrs = f"fft_type = #stablehlo<fft_type {kind}>, fft_length = {arr(lengths)}"
    if kind == "RFFT":
        args = [values(draw, in_shape, et, special=False)]
        body = ""
        src, in_t = "a0", ttype(in_shape, et)
    else:
        args = [values(draw, in_shape, et, special=False) for _ in range(2)]
        body = _complex_arg(in_shape, et, "x", "a0", "a1")
        src, in_t = "x", ttype(in_shape, CT[et])
    out_t = ttype(out_shape, et if kind == "IRFFT" else CT[et])
    body += f'    %f = "stablehlo.fft"(%{src}) {{{attrs}}} : ({in_t}) -> {out_t}\n'
    if kind == "IRFFT":
        return Case(module(args, [out_t], body + f"    return %f : {out_t}"), args)
    text, results = _parts("f", out_shape, et)
    return Case(module(args, results, body + text), args)


@record("stablehlo.fft", name="fft_jax", examples=10, rtol=1e-4, atol=1e-4)
def fft_jax(draw: Draw) -> Case:
    # jnp.fft as users write it: a spectral product (a circular convolution), normalised
    shp = (draw(st.integers(1, 2)), draw(st.integers(1, 6)))
    x, k = values(draw, shp, "f32", special=False), values(draw, shp, "f32", special=False)

    def conv(x, k):
        y = jnp.fft.irfft(jnp.fft.rfft(x) * jnp.fft.rfft(k), n=x.shape[-1])
        z = jnp.fft.ifft2(jnp.fft.fft2(x) * (1 + jnp.abs(k)))
        return y, z.real, z.imag

    return Case(lower(conv, x, k), [x, k])


# ==============================================================================================
# Quantized types: XLA:CPU cannot translate uniform_quantize / uniform_dequantize, so the
# reference is XLA running the spec's `quantize` / `dequantize` written in plain ops
# ==============================================================================================


def _quant_type(storage: str, lo: int, hi: int, axis, scales, zps) -> str:
    bits = storage.lstrip("ui")
    full = (-(2 ** (int(bits) - 1)), 2 ** (int(bits) - 1) - 1) if storage[0] == "i" else None
    full = full or (0, 2 ** int(bits) - 1)
    st = storage if (lo, hi) == full else f"{storage}<{lo}:{hi}>"
    pairs = [f"{float(s)!r}:{int(z)}" for s, z in zip(scales, zps, strict=True)]
    if axis is None:
        return f"!quant.uniform<{st}:f32, {pairs[0]}>"
    return f"!quant.uniform<{st}:f32:{axis}, {{{', '.join(pairs)}}}>"


def _draw_quantization(draw: Draw, shp: tuple) -> dict:
    storage = draw(st.sampled_from(["i8", "ui8", "i16"]))
    bits = int(storage.lstrip("ui"))
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if storage[0] == "i" else (0, 2**bits - 1)
    if draw(st.booleans()):  # a narrow storage range
        lo, hi = lo + draw(st.integers(0, 3)), hi - draw(st.integers(0, 3))
    axis = draw(st.sampled_from([None] + list(range(len(shp)))))
    n = 1 if axis is None else shp[axis]
    r = rng(draw)
    scales = [float(np.float32(v)) for v in r.uniform(0.02, 2.0, n)]
    zps = [int(z) for z in r.integers(max(lo, -40), min(hi, 40), size=n, endpoint=True)]
    return dict(storage=storage, lo=lo, hi=hi, axis=axis, scales=scales, zps=zps)


def _per_axis(q: dict, name: str, values, shp: tuple, et: str) -> str:
    """`%name`: a quantization parameter broadcast to `shp` (XLA's reference program)."""
    n = len(values)
    vals = ", ".join(repr(float(v)) for v in values)
    dims = "[]" if q["axis"] is None else f"[{q['axis']}]"
    src = f"tensor<{et}>" if q["axis"] is None else f"tensor<{n}x{et}>"
    lit = f"dense<{vals}>" if q["axis"] is None else f"dense<[{vals}]>"
    return (
        f"    %{name}0 = stablehlo.constant {lit} : {src}\n"
        f"    %{name} = stablehlo.broadcast_in_dim %{name}0, dims = {dims}"
        f" : ({src}) -> {ttype(shp, et)}\n"
    )


def _spec_quantize(q: dict, x: str, out: str, shp: tuple) -> str:
    """The spec's quantize(x) in ops XLA runs."""
    t = ttype(shp, "f32")
    return (
        _per_axis(q, f"{out}s", q["scales"], shp, "f32")
        + _per_axis(q, f"{out}z", q["zps"], shp, "f32")
        + f"    %{out}lo = stablehlo.constant dense<{float(q['lo'])!r}> : tensor<f32>\n"
        f"    %{out}hi = stablehlo.constant dense<{float(q['hi'])!r}> : tensor<f32>\n"
        f"    %{out}d = stablehlo.divide %{x}, %{out}s : {t}\n"
        f"    %{out}a = stablehlo.add %{out}d, %{out}z : {t}\n"
        f"    %{out}c = stablehlo.clamp %{out}lo, %{out}a, %{out}hi"
        f" : (tensor<f32>, {t}, tensor<f32>) -> {t}\n"
        f"    %{out}r = stablehlo.round_nearest_even %{out}c : {t}\n"
        f"    %{out} = stablehlo.convert %{out}r : ({t}) -> {ttype(shp, q['storage'])}\n"
    )


def _spec_dequantize(q: dict, x: str, out: str, shp: tuple) -> str:
    """The spec's dequantize(x) in ops XLA runs (the difference taken in f32: exact)."""
    t = ttype(shp, "f32")
    return (
        _per_axis(q, f"{out}s", q["scales"], shp, "f32")
        + _per_axis(q, f"{out}z", q["zps"], shp, "f32")
        + f"    %{out}f = stablehlo.convert %{x} : ({ttype(shp, q['storage'])}) -> {t}\n"
        f"    %{out}m = stablehlo.subtract %{out}f, %{out}z : {t}\n"
        f"    %{out} = stablehlo.multiply %{out}m, %{out}s : {t}\n"
    )


def _far_from_ties(x: np.ndarray, q: dict) -> bool:
    """x / scale + zero_point is not within 1e-3 of a rounding tie (f32 vs float64)."""
    shp = x.shape
    s = np.asarray(q["scales"], np.float64)
    z = np.asarray(q["zps"], np.float64)
    if q["axis"] is not None:
        idx = [1] * len(shp)
        idx[q["axis"]] = shp[q["axis"]]
        s, z = s.reshape(idx), z.reshape(idx)
    v = x.astype(np.float64) / s + z
    return bool(np.all(np.abs(v - np.floor(v) - 0.5) > 1e-3))


STEP = float(np.float32(0.0937))  # the quantized floats: integers times this f32 constant


@record("stablehlo.uniform_quantize", "stablehlo.uniform_dequantize", examples=30)
def uniform_quantization(draw: Draw) -> Case:
    # quantize a float tensor, dequantize a tensor of storage integers, and requantize it
    # to another quantized type; per tensor and per axis, full and narrow storage ranges.
    # The float operand is an integer argument times STEP: quantize of an input-dependent
    # float is unsupported symbolically (rounding to integers), so tests/test_symbolic.py
    # evaluates it with that argument known and the storage integers as symbols.
    shp = shape(draw, min_rank=1, max_rank=2, hi=3)
    q1, q2 = _draw_quantization(draw, shp), _draw_quantization(draw, shp)
    steps = ints(draw, shp, "i32", -64, 64)
    storage = ints(draw, shp, q1["storage"], q1["lo"], q1["hi"])
    assume(_far_from_ties(steps * STEP, q1))
    idx = [1] * len(shp)
    if q1["axis"] is not None:
        idx[q1["axis"]] = shp[q1["axis"]]
    scales, zps = np.reshape(q1["scales"], idx), np.reshape(q1["zps"], idx)
    assume(_far_from_ties((storage.astype(np.float64) - zps) * scales, q2))
    t, ti, ts, t2 = (ttype(shp, e) for e in ("f32", "i32", q1["storage"], q2["storage"]))
    dims = "".join(f"{d}x" for d in shp)
    ty1, ty2 = (f"tensor<{dims}{_quant_type(**q)}>" for q in (q1, q2))
    floats = (
        f"    %f = stablehlo.convert %a0 : ({ti}) -> {t}\n"
        f"    %k = stablehlo.constant dense<{STEP!r}> : {t}\n"
        f"    %x = stablehlo.multiply %f, %k : {t}\n"
    )
    body = floats + (
        f"    %q = stablehlo.uniform_quantize %x : ({t}) -> {ty1}\n"
        f"    %qs = stablehlo.bitcast_convert %q : ({ty1}) -> {ts}\n"
        f"    %b = stablehlo.bitcast_convert %a1 : ({ts}) -> {ty1}\n"
        f"    %d = stablehlo.uniform_dequantize %b : ({ty1}) -> {t}\n"
        f"    %r = stablehlo.uniform_quantize %b : ({ty1}) -> {ty2}\n"
        f"    %rs = stablehlo.bitcast_convert %r : ({ty2}) -> {t2}\n"
        f"    return %qs, %d, %rs : {ts}, {t}, {t2}"
    )
    reference = (
        floats
        + _spec_quantize(q1, "x", "qs", shp)
        + _spec_dequantize(q1, "a1", "d", shp)
        + _spec_quantize(q2, "d", "rs", shp)
        + f"    return %qs, %d, %rs : {ts}, {t}, {t2}"
    )
    args = [steps, storage]
    return Case(module(args, [ts, t, t2], body), args, module(args, [ts, t, t2], reference))


@record("stablehlo.uniform_dequantize", name="uniform_dequantize_alone", examples=20)
def uniform_dequantize_alone(draw: Draw) -> Case:
    # dequantize alone: its storage integers are symbols in tests/test_symbolic.py
    shp = shape(draw, min_rank=1, max_rank=3, hi=3)
    q = _draw_quantization(draw, shp)
    storage = ints(draw, shp, q["storage"], q["lo"], q["hi"])
    t, ts = ttype(shp, "f32"), ttype(shp, q["storage"])
    ty = f"tensor<{''.join(f'{d}x' for d in shp)}{_quant_type(**q)}>"
    body = (
        f"    %b = stablehlo.bitcast_convert %a0 : ({ts}) -> {ty}\n"
        f"    %d = stablehlo.uniform_dequantize %b : ({ty}) -> {t}\n"
        f"    return %d : {t}"
    )
    reference = _spec_dequantize(q, "a0", "d", shp) + f"    return %d : {t}"
    return Case(module([storage], [t], body), [storage], module([storage], [t], reference))


# ==============================================================================================
# Tokens, asynchronous ops, rng, dynamic_conv
# ==============================================================================================


@record("stablehlo.after_all")
def after_all(draw: Draw) -> Case:
    # tokens from create_token (legalised to after_all) and after_all, ordered by a barrier
    x = values(draw, shape(draw), draw(st.sampled_from(F)), special=False)
    t = ttype(x.shape, et_of(x))
    joined = ", ".join(f"%t{i}" for i in range(draw(st.integers(0, 2))))
    body = (
        "    %t0 = stablehlo.create_token : !stablehlo.token\n"
        "    %t1 = stablehlo.after_all : !stablehlo.token\n"
        f"    %t = stablehlo.after_all {joined} : !stablehlo.token\n"
        f"    %r:2 = stablehlo.optimization_barrier %a0, %t : {t}, !stablehlo.token\n"
        f"    return %r#0 : {t}"
    )
    return Case(module([x], [t], body), [x])


@record("stablehlo.rng")
def rng_one_value(draw: Draw) -> Case:
    # the one case the spec determines: a UNIFORM integer interval [a, a + 1)
    et = draw(st.sampled_from(["i32", "i64", "ui32"]))  # XLA:CPU aborts on 8-bit rng
    info = np.iinfo(NP[et])
    a = draw(st.integers(int(info.min), int(info.max) - 1))
    shp = shape(draw, hi=3)
    dims = ", ".join(str(d) for d in shp)
    s, t = f"tensor<{len(shp)}xi64>", ttype(shp, et)
    body = (
        f"    %a = stablehlo.constant dense<{a}> : tensor<{et}>\n"
        f"    %b = stablehlo.constant dense<{a + 1}> : tensor<{et}>\n"
        f"    %s = stablehlo.constant dense<[{dims}]> : {s}\n"
        f"    %r = stablehlo.rng %a, %b, %s, distribution = UNIFORM"
        f" : (tensor<{et}>, tensor<{et}>, {s}) -> {t}\n"
        f"    return %r : {t}"
    )
    x = values(draw, (), "f32", special=False)
    return Case(module([x], [t], body), [x])


_GENERIC_CONV = re.compile(
    r'(?P<lead>\s*%\S+ = )"stablehlo\.convolution"\((?P<ops>[^)]*)\) <\{(?P<attrs>.*)\}> : '
    r"\((?P<types>[^)]*)\) -> (?P<result>\S+)(?P<rest>.*)"
)


@record("stablehlo.dynamic_conv", examples=20)
def dynamic_conv(draw: Draw) -> Case:
    # the convolution record's programs with the padding as an operand; XLA cannot translate
    # dynamic_conv, so the reference is XLA running the convolution itself
    case = convolution(draw)
    generic = parse_mlir(case.text)[0].operation.get_asm(print_generic_op_form=True)
    lines = generic.split("\n")
    for i, line in enumerate(lines):
        m = _GENERIC_CONV.match(line)
        if m is None:
            continue
        attrs = m.group("attrs")
        pad = re.search(r"padding = (dense<[^>]*> : (tensor<\w+>))(, )?", attrs)
        if pad is None:  # no padding attribute: zero padding
            nsp = len(re.search(r"window_strides = array<i64: ([^>]*)>", attrs).group(1).split(","))
            value, ptype = f"dense<0> : tensor<{nsp}x2xi64>", f"tensor<{nsp}x2xi64>"
        else:
            value, ptype = pad.group(1), pad.group(2)
            attrs = attrs.replace(pad.group(0), "").rstrip(", ")
        indent = m.group("lead")[: len(m.group("lead")) - len(m.group("lead").lstrip())]
        lines[i] = (
            f'{indent}%tv_padding = "stablehlo.constant"() <{{value = {value}}}> : () -> {ptype}\n'
            f'{m.group("lead")}"stablehlo.dynamic_conv"({m.group("ops")}, %tv_padding) '
            f"<{{{attrs}}}> : ({m.group('types')}, {ptype}) -> {m.group('result')}{m.group('rest')}"
        )
        break
    else:
        raise AssertionError(f"no convolution in\n{generic}")
    return Case("\n".join(lines), case.args, case.text)


_ASYNC_BODIES = {
    "all_gather": 'all_gather"(%x) {all_gather_dim = 0 : i64, replica_groups = '
    "dense<[[0]]> : tensor<1x1xi64>}",
    "collective_permute": 'collective_permute"(%x) {source_target_pairs = '
    "dense<[[0, 0]]> : tensor<1x2xi64>}",
}


@record("stablehlo.async_start", "stablehlo.async_done")
def async_collective(draw: Draw) -> Case:
    # a collective started and awaited (on one process: XLA runs these with one device)
    x = values(draw, shape(draw, min_rank=1), draw(st.sampled_from(["f32", "i32"])), special=False)
    t = ttype(x.shape, et_of(x))
    op = _ASYNC_BODIES[draw(st.sampled_from(sorted(_ASYNC_BODIES)))]
    body = (
        '    %0 = "stablehlo.async_start"(%a0) ({\n'
        f"    ^bb0(%x: {t}):\n"
        f'      %1 = "stablehlo.{op} : ({t}) -> {t}\n'
        f'      "stablehlo.return"(%1) : ({t}) -> ()\n'
        f"    }}) : ({t}) -> !stablehlo.future<{t}>\n"
        f'    %2 = "stablehlo.async_done"(%0) : (!stablehlo.future<{t}>) -> {t}\n'
        f"    %3 = stablehlo.add %2, %a0 : {t}\n"
        f"    return %3 : {t}"
    )
    return Case(module([x], [t], body), [x])


@record("stablehlo.dot_general", name="dot_general_complex", examples=12)
def dot_general_complex(draw: Draw) -> Case:
    # complex operands (one may come from a real tensor): batched products of pairs of parts
    et = draw(st.sampled_from(["f32", "f64"]))
    b, m, k, n = (draw(st.integers(1, 3)) for _ in range(4))
    lhs = [values(draw, (b, m, k), et, special=False) for _ in range(2)]
    rhs = [values(draw, (b, k, n), et, special=False) for _ in range(2)]
    real_rhs = draw(st.booleans())
    tl, tr, to = ttype((b, m, k), CT[et]), ttype((b, k, n), CT[et]), ttype((b, m, n), CT[et])
    body = _complex_arg((b, m, k), et, "x", "a0", "a1")
    if real_rhs:
        tr = ttype((b, k, n), et)
        body += f"    %y = stablehlo.convert %a2 : ({tr}) -> {ttype((b, k, n), CT[et])}\n"
    else:
        body += _complex_arg((b, k, n), et, "y", "a2", "a3")
    tr = ttype((b, k, n), CT[et])
    body += (
        "    %z = stablehlo.dot_general %x, %y, batching_dims = [0] x [0], "
        f"contracting_dims = [2] x [1] : ({tl}, {tr}) -> {to}\n"
    )
    text, results = _parts("z", (b, m, n), et)
    args = lhs + rhs
    return Case(module(args, results, body + text), args)


@record("stablehlo.reduce", name="reduce_complex", examples=12)
def reduce_complex(draw: Draw) -> Case:
    # sums (the parts' sums) and products (the body op by op) of complex numbers
    shp = shape(draw, min_rank=1, hi=3)
    x, y = (values(draw, shp, "f32", lo=-1.5, hi=1.5, special=False) for _ in range(2))
    axis = draw(st.integers(0, len(shp) - 1))
    reduce = draw(st.sampled_from([jnp.sum, jnp.prod]))

    def f(x, y):
        r = reduce(lax.complex(x, y), axis=axis)
        return r.real, r.imag

    return Case(lower(f, x, y), [x, y])
