"""tv_ir: a small SSA IR that everything after import works on.

A `Module` holds `Function`s; a function has one `Block` (arguments, ops, returned values);
an `Op` has operands, results, decoded attributes and nested `Region`s (each one block).
Attributes are plain Python values (ints, tuples, numpy arrays, small dataclasses), decoded
once by the importer, so no later layer touches the MLIR bindings.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tv_ir.errors import BadInput

_ids = itertools.count()

FLOAT_DTYPES = {"f16", "bf16", "f32", "f64", "f8E4M3FN", "f8E5M2"}
NUMPY_DTYPE = {
    "i1": "bool",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "ui8": "uint8",
    "ui16": "uint16",
    "ui32": "uint32",
    "ui64": "uint64",
}


@dataclass(frozen=True)
class TensorType:
    """A ranked tensor type: static shape and element type name as MLIR spells it (f32, i1)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES or self.dtype.startswith("f")

    @property
    def is_complex(self) -> bool:
        """complex<f32> / complex<f64>: held as complex128 concretely, pairs symbolically."""
        return self.dtype.startswith("complex")

    @property
    def is_bool(self) -> bool:
        return self.dtype == "i1"

    @property
    def is_integer(self) -> bool:
        return not self.is_float and not self.is_bool and not self.is_complex

    @functools.cached_property
    def numpy_dtype(self) -> str:
        """The numpy dtype that concrete evaluation uses (floats widen to float64)."""
        if self.is_float:
            return "float64"
        if self.is_complex:
            return "complex128"
        return NUMPY_DTYPE.get(self.dtype, "int64")

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __str__(self) -> str:
        dims = "x".join(str(d) for d in self.shape)
        return f"tensor<{dims + 'x' if dims else ''}{self.dtype}>"


def storage_dtype(t: TensorType):
    """The numpy dtype holding t's elements at their true width (f32 -> float32, ...)."""
    if not t.is_float:
        return np.dtype(t.numpy_dtype)
    import ml_dtypes

    names = {"f64": "float64", "f32": "float32", "f16": "float16"}
    if t.dtype in names:
        return np.dtype(names[t.dtype])
    extra = {"bf16": "bfloat16", "f8E4M3FN": "float8_e4m3fn", "f8E5M2": "float8_e5m2"}
    return np.dtype(getattr(ml_dtypes, extra[t.dtype]))


@dataclass(frozen=True)
class TokenType:
    """`!stablehlo.token`: carries ordering only."""

    def __str__(self) -> str:
        return "!stablehlo.token"


@dataclass(frozen=True)
class TupleType:
    elements: tuple[Any, ...]

    def __str__(self) -> str:
        return "tuple<" + ", ".join(str(e) for e in self.elements) + ">"


Type = TensorType | TokenType | TupleType


@dataclass(frozen=True)
class Location:
    """Where an op came from: a source file:line when known, and the JAX name stack."""

    file: str | None = None
    line: int | None = None
    name: str | None = None  # e.g. "jit(block)/dot_general"
    function: str | None = None  # the Python function at the innermost frame

    def __str__(self) -> str:
        parts = []
        if self.file:
            parts.append(f"{self.file}:{self.line}")
        if self.name:
            parts.append(self.name)
        return " ".join(parts) if parts else "<unknown location>"


UNKNOWN_LOC = Location()


class Value:
    """An SSA value: defined by an op result or a block argument."""

    __slots__ = ("id", "type", "name", "owner", "index")

    def __init__(self, type: Type, name: str | None = None, owner: Op | None = None, index=0):
        self.id = next(_ids)
        self.type = type
        self.name = name
        self.owner = owner  # the defining op, None for block arguments
        self.index = index

    def __repr__(self) -> str:
        return f"%{self.name or self.id}:{self.type}"


@dataclass(eq=False)
class Block:
    args: list[Value]
    ops: list[Op]
    results: list[Value]  # operands of the terminator (return)


@dataclass(eq=False)
class Region:
    block: Block


@dataclass(eq=False)
class Op:
    name: str  # full MLIR name, e.g. "stablehlo.add"
    operands: list[Value]
    results: list[Value]
    attrs: dict[str, Any] = field(default_factory=dict)
    regions: list[Region] = field(default_factory=list)
    loc: Location = UNKNOWN_LOC

    @property
    def short_name(self) -> str:
        return self.name.split(".", 1)[-1]

    def __repr__(self) -> str:
        res = ", ".join(repr(r) for r in self.results)
        ops = ", ".join(f"%{v.name or v.id}" for v in self.operands)
        return f"{res} = {self.name}({ops})"


@dataclass(eq=False)
class Function:
    name: str
    body: Block
    result_types: list[Type]
    arg_attrs: list[dict[str, Any]] = field(default_factory=list)
    res_attrs: list[dict[str, Any]] = field(default_factory=list)
    arg_names: list[str | None] = field(default_factory=list)
    visibility: str = "public"

    @property
    def args(self) -> list[Value]:
        return self.body.args

    @property
    def arg_types(self) -> list[Type]:
        return [a.type for a in self.body.args]


@dataclass(eq=False)
class Module:
    functions: dict[str, Function]
    attrs: dict[str, Any] = field(default_factory=dict)
    source: str = "<module>"
    other_ops: list[str] = field(default_factory=list)  # top-level ops we keep by name (sdy.mesh)
    entry: str | None = None  # the function checked, when it is not @main

    @property
    def main(self) -> Function:
        if self.entry is not None:
            return self.functions[self.entry]
        if "main" in self.functions:
            return self.functions["main"]
        public = [f for f in self.functions.values() if f.visibility == "public"]
        return public[0] if public else next(iter(self.functions.values()))

    def with_entry(self, name: str) -> Module:
        """The same module, checked at function @name."""
        if name not in self.functions:
            known = ", ".join("@" + f for f in self.functions)
            raise BadInput(f"{self.source}: no function @{name} (it has {known})")
        return dataclasses.replace(self, entry=name)


def holds_integers(t: Type, lo: int, hi: int) -> bool:
    """Whether every integer in [lo, hi] is held by `t`'s elements, so that a convert to `t`
    and integer arithmetic in `t` do not wrap there. A float type holds them all: tv reads
    floats as reals (docs/equivalence.md), and a bf16 position is the position."""
    if not isinstance(t, TensorType) or t.is_bool or t.is_complex:
        return False
    if t.is_float:
        return True
    name = NUMPY_DTYPE.get(t.dtype)
    if name is None:
        return False
    info = np.iinfo(name)
    return int(info.min) <= lo and hi <= int(info.max)


def _zero_constant(v: Value) -> bool:
    op = v.owner
    if op is None or op.name not in ("stablehlo.constant", "stablehlo.broadcast_in_dim"):
        return False
    if op.name == "stablehlo.broadcast_in_dim":
        return _zero_constant(op.operands[0])
    value = np.asarray(op.attrs.get("value"))
    return value.size > 0 and not value.any()


def read_operands(op: Op) -> list[Value]:
    """The operands op's result depends on (over the reals): all of them but where its
    arithmetic ignores some. `x * 0`, `x - x`, `x ^ x`, `x == x` and `is_finite(x)` read
    none; `select(p, a, a)`, `max(a, a)` and `clamp(c, x, c)` read `a` (`c`) alone. A sum
    over devices of `x * 0 + 1` counts them as one of `1` does."""
    ops = list(op.operands)
    name = op.name
    if name == "stablehlo.multiply" and len(ops) == 2 and any(_zero_constant(v) for v in ops):
        return []
    if name == "stablehlo.is_finite":  # true of every real (a mask of finite losses)
        return []
    if len(ops) == 2 and ops[0] is ops[1]:
        if name in ("stablehlo.subtract", "stablehlo.xor", "stablehlo.compare"):
            return []  # 0, or a real compared with itself: true (==, <=, >=) or false
        if name in ("stablehlo.maximum", "stablehlo.minimum", "stablehlo.and", "stablehlo.or"):
            return ops[:1]
    if name == "stablehlo.select" and len(ops) == 3 and ops[1] is ops[2]:
        return ops[1:2]
    if name == "stablehlo.clamp" and len(ops) == 3 and _same_constant(ops[0], ops[2]):
        return ops[:1]
    return ops


def _same_constant(a: Value, b: Value) -> bool:
    if a is b:
        return True
    ca, cb = a.owner, b.owner
    if ca is None or cb is None:
        return False
    if ca.name != "stablehlo.constant" or cb.name != "stablehlo.constant":
        return False
    x, y = np.asarray(ca.attrs.get("value")), np.asarray(cb.attrs.get("value"))
    return x.shape == y.shape and bool(np.array_equal(x, y))


def elements(m: Module) -> int:
    """How many tensor elements the values of `m`'s checked function hold, arguments
    included (what evaluating it concretely costs)."""
    fn = m.main
    vals = list(fn.args) + [r for op in walk(fn.body) for r in op.results]
    return sum(v.type.size for v in vals if isinstance(v.type, TensorType))


def walk(block: Block):
    """Every op in a block, nested regions included, in program order."""
    for op in block.ops:
        yield op
        for region in op.regions:
            yield from walk(region.block)


def captured(op: Op) -> list[Value]:
    """Values `op`'s regions read that are defined outside them (a `case` branch's or a
    `while` body's use of an outer value, which StableHLO allows without passing it in)."""
    if not op.regions:
        return []
    inside: set[int] = set()
    read: list[Value] = []
    for region in op.regions:
        inside.update(a.id for a in region.block.args)
        for inner in walk(region.block):
            inside.update(r.id for r in inner.results)
            inside.update(a.id for reg in inner.regions for a in reg.block.args)
            read += inner.operands
        read += region.block.results
    out: dict[int, Value] = {}
    for v in read:
        if v.id not in inside:
            out.setdefault(v.id, v)
    return list(out.values())


def integer_constant(v: Value) -> int | None:
    """The integer a one-element integer `stablehlo.constant` holds, else None."""
    op = v.owner
    if op is None or op.name != "stablehlo.constant":
        return None
    a = np.asarray(op.attrs.get("value"))
    if a.size != 1 or a.dtype.kind not in "iu":
        return None
    return int(a.reshape(-1)[0])
