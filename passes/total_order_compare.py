"""total-order-compare: XLA's float total-order comparison by bit casts, as one `compare`.

XLA (and TensorFlow's TopK) compares floats in IEEE-754 totalOrder through their bits:

    b   = bitcast_convert(x) : f32 -> i32
    u   = bitcast_convert(x) : f32 -> ui32
    neg = bitcast_convert(0x7fffffff - u) : ui32 -> i32      (a negative float's bits flipped)
    key = select(b < 0, neg, b)
    ... compare(key(x), key(y), GT) ...

`key` is an integer that orders like totalOrder (-NaN < -inf < ... < -0 < +0 < ... < +NaN;
equal keys are equal bit patterns), so a signed compare of two keys is
`compare(x, y, compare_type = TOTALORDER)`, which is what this pass writes. The meaning is
unchanged for every float value (NaNs and signed zeros included: `compare_total`), and it
gives the comparison a symbolic meaning: a term has no bit pattern, but over the reals
(symbolic values) totalOrder is the ordinary order. Without it a sort whose comparator
reads bits (`SortAlongNonPartitionedDimension`, the TopK tests) cannot be proved.

Only the exact idiom is rewritten: the constant must be 2^(w-1) - 1 of an unsigned type of
the float's width, the sign test `b < 0` (or `0 > b`) signed, the outer compare signed. A
bit cast that feeds anything else stays (and stays concrete-only). The bit casts and
constants the rewrite leaves unused are removed.
"""

from __future__ import annotations

from tv_ir.ir.attrs import EnumAttr
from tv_ir.ir.program import Block, Module, Op, TensorType, Value, integer_constant

name = "total-order-compare"

FLOAT_BITS = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64}
# ops the idiom is made of: removed when the rewrite leaves them unused (all pure)
IDIOM_OPS = {
    "stablehlo.bitcast_convert",
    "stablehlo.constant",
    "stablehlo.compare",
    "stablehlo.subtract",
    "stablehlo.select",
}


def run(module: Module) -> Module:
    for fn in module.functions.values():
        _rewrite_block(fn.body)
    return module


def _rewrite_block(block: Block) -> None:
    rewrote = False
    for i, op in enumerate(block.ops):
        for region in op.regions:
            _rewrite_block(region.block)
        if op.name != "stablehlo.compare" or not _signed_compare(op):
            continue
        xs = [total_order_key_of(v) for v in op.operands]
        if xs[0] is None or xs[1] is None or xs[0].type != xs[1].type:
            continue
        attrs = {k: v for k, v in op.attrs.items() if k != "compare_type"}
        attrs["compare_type"] = EnumAttr("ComparisonTypeAttr", "TOTALORDER")
        block.ops[i] = Op("stablehlo.compare", xs, op.results, attrs, [], op.loc)
        for r in op.results:
            r.owner = block.ops[i]
        rewrote = True
    if rewrote:
        _remove_unused(block)


def total_order_key_of(key: Value) -> Value | None:
    """The float x when `key` is XLA's total-order key of x (module docstring), else None."""
    sel = key.owner
    if sel is None or sel.name != "stablehlo.select" or not _scalar_int(key, signed=True):
        return None
    test, neg, pos = sel.operands
    x = _bitcast_of_float(pos, key.type.dtype)
    if x is None or _sign_test_of(test) is not x:
        return None
    bits = FLOAT_BITS[x.type.dtype]
    flip = neg.owner
    if flip is None or flip.name != "stablehlo.bitcast_convert":
        return None
    sub = flip.operands[0].owner
    if sub is None or sub.name != "stablehlo.subtract":
        return None
    c, u = sub.operands
    if integer_constant(c) != 2 ** (bits - 1) - 1 or not _scalar_int(c, signed=False):
        return None
    if _bitcast_of_float(u, c.type.dtype) is not x:
        return None
    return x


def _sign_test_of(test: Value) -> Value | None:
    """x when `test` is `bitcast(x) < 0` (or `0 > bitcast(x)`), signed."""
    op = test.owner
    if op is None or op.name != "stablehlo.compare" or not _signed_compare(op):
        return None
    a, b = op.operands
    direction = str(op.attrs.get("comparison_direction"))
    if direction == "GT":
        a, b = b, a
    elif direction != "LT":
        return None
    if integer_constant(b) != 0:
        return None
    return _bitcast_of_float(a, a.type.dtype) if _scalar_int(a, signed=True) else None


def _bitcast_of_float(v: Value, int_dtype: str) -> Value | None:
    """x when v = bitcast_convert(x) from a scalar float of int_dtype's width, else None."""
    op = v.owner
    if op is None or op.name != "stablehlo.bitcast_convert" or v.type.dtype != int_dtype:
        return None
    x = op.operands[0]
    if not isinstance(x.type, TensorType) or x.type.shape != ():
        return None
    bits = FLOAT_BITS.get(x.type.dtype)
    if bits is None or bits != _int_bits(int_dtype):
        return None
    return x


def _signed_compare(op: Op) -> bool:
    a = op.operands[0]
    kind = str(op.attrs.get("compare_type", "") or "")
    if not _scalar_int(a, signed=True):
        return False
    return kind in ("", "SIGNED", "None")


def _scalar_int(v: Value, signed: bool) -> bool:
    t = v.type
    if not isinstance(t, TensorType) or t.shape != () or not t.is_integer:
        return False
    return t.dtype.startswith("ui") != signed


def _int_bits(dtype: str) -> int | None:
    digits = dtype.removeprefix("ui").removeprefix("i")
    return int(digits) if digits.isdigit() else None


def _remove_unused(block: Block) -> None:
    """Drop idiom ops whose results nothing reads any more (last to first)."""
    used = {v.id for v in block.results}
    kept = []
    for op in reversed(block.ops):
        if op.name in IDIOM_OPS and not op.regions and all(r.id not in used for r in op.results):
            continue
        kept.append(op)
        used.update(v.id for v in op.operands)
        for region in op.regions:
            used.update(_outer_uses(region.block))
    block.ops = kept[::-1]


def _outer_uses(block: Block) -> set[int]:
    """Ids of every value a nested block reads (its own included; a superset is enough)."""
    ids = {v.id for v in block.results}
    for op in block.ops:
        ids.update(v.id for v in op.operands)
        for region in op.regions:
            ids |= _outer_uses(region.block)
    return ids
