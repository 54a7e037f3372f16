"""Quantized element types (`!quant.uniform<...>`) in StableHLO text, which jaxlib's MLIR
bindings cannot parse (they do not carry the quant dialect).

`lower_quantized_types(text)` rewrites a program before parsing: each quantized type becomes
its storage integer type, `uniform_quantize` / `uniform_dequantize` become custom calls
(`QUANTIZE_TARGET`, `DEQUANTIZE_TARGET`) carrying the quantization parameters, and the
importer names them back. Values of quantized types hold their storage integers, as the
spec's `bitcast_convert(x, storage_type(x))` does. Every other op on a quantized type means
"dequantize, compute, quantize" in the spec, which storage integers would not model:
such programs are refused (`Unsupported`), never read as integer programs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tv_ir.errors import Unsupported

QUANTIZE_TARGET = "tv.quant.uniform_quantize"
DEQUANTIZE_TARGET = "tv.quant.uniform_dequantize"
OPERAND_ATTR, RESULT_ATTR = "tv.operand_quant", "tv.result_quant"
_PREFIX = "!quant.uniform<"
# ops whose meaning on quantized types is their meaning on the storage integers
_STORAGE_OPS = (
    "func.func",
    "func.return",
    "return",
    "stablehlo.bitcast_convert",
)


@dataclass(frozen=True)
class UniformQuantization:
    """A `!quant.uniform` type: storage integers [lo, hi] standing for
    (q - zero_point) * scale of the expressed float type, per tensor (axis None) or per
    index along `axis`."""

    storage: str  # i8, ui8, i4, ...
    lo: int
    hi: int
    expressed: str  # f32, bf16, ...
    axis: int | None
    scales: tuple[float, ...]
    zero_points: tuple[int, ...]

    def to_attr(self) -> str:
        """As an MLIR dictionary attribute (the custom call's)."""
        scales = ", ".join(repr(float(s)) for s in self.scales)
        zps = ", ".join(str(z) for z in self.zero_points)
        return (
            f'{{storage = "{self.storage}", lo = {self.lo} : i64, hi = {self.hi} : i64, '
            f'expressed = "{self.expressed}", axis = {-1 if self.axis is None else self.axis} '
            f": i64, scales = array<f64: {scales}>, zero_points = array<i64: {zps}>}}"
        )

    @staticmethod
    def from_attr(d: dict) -> UniformQuantization:
        axis = int(d["axis"])
        return UniformQuantization(
            str(d["storage"]),
            int(d["lo"]),
            int(d["hi"]),
            str(d["expressed"]),
            None if axis < 0 else axis,
            tuple(float(s) for s in d["scales"]),
            tuple(int(z) for z in d["zero_points"]),
        )


def _type_end(text: str, start: int) -> int:
    """The index just past the `>` closing the `<` at `start + len(_PREFIX) - 1`."""
    depth, i = 0, start + len(_PREFIX) - 1
    while i < len(text):
        if text[i] == "<":
            depth += 1
        elif text[i] == ">":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise Unsupported(f"unterminated quantized type {text[start : start + 60]}")


_STORAGE = re.compile(r"^(u?i)(\d+)(?:<\s*(-?\d+)\s*:\s*(-?\d+)\s*>)?$")
_SCALE_ZP = re.compile(r"^\s*([-+0-9.eE]+)\s*(?::\s*(-?\d+))?\s*$")


def parse_quantized_type(body: str) -> UniformQuantization:
    """`storage[<lo:hi>]:expressed[:axis], scale[:zp]` or `..., {scale:zp, ...}`."""
    head, _, params = body.partition(",")
    head = head.strip()
    m = re.match(r"^(u?i\d+(?:<[^>]*>)?)\s*:\s*(\w+)\s*(?::\s*(\d+))?$", head)
    if m is None:
        raise Unsupported(f"quantized type !quant.uniform<{body}>: form not understood")
    storage, expressed, axis = m.group(1), m.group(2), m.group(3)
    s = _STORAGE.match(storage.replace(" ", ""))
    if s is None:
        raise Unsupported(f"quantized storage type {storage}")
    signed, bits = s.group(1) == "i", int(s.group(2))
    lo = int(s.group(3)) if s.group(3) else (-(2 ** (bits - 1)) if signed else 0)
    hi = int(s.group(4)) if s.group(4) else (2 ** (bits - 1) - 1 if signed else 2**bits - 1)
    params = params.strip().strip("{}")
    scales, zps = [], []
    for item in params.split(","):
        p = _SCALE_ZP.match(item)
        if p is None:
            raise Unsupported(f"quantization parameters {params}: form not understood")
        scales.append(float(p.group(1)))
        zps.append(int(p.group(2) or 0))
    return UniformQuantization(
        f"{s.group(1)}{bits}",
        lo,
        hi,
        expressed,
        int(axis) if axis is not None else None,
        tuple(scales),
        tuple(zps),
    )


def _quantized_types(line: str) -> list[tuple[int, int, UniformQuantization]]:
    """(start, end, type) of each quantized type in a line."""
    out, i = [], line.find(_PREFIX)
    while i >= 0:
        end = _type_end(line, i)
        out.append((i, end, parse_quantized_type(line[i + len(_PREFIX) : end - 1])))
        i = line.find(_PREFIX, end)
    return out


_QUANT_OP = re.compile(
    r'^(?P<lead>\s*%[\w#.$-]+\s*=\s*)"?stablehlo\.uniform_(?P<kind>quantize|dequantize)"?'
    r"\s*\(?(?P<operand>%[\w#.$-]+)\)?\s*:\s*(?P<types>.*?)(?P<loc>\s+loc\(.*\))?\s*$"
)


def _op_name(line: str) -> str | None:
    m = re.match(r'^\s*(?:%[\w#.$:, -]+=\s*)?"?([a-z_]+\.[\w.]+|return)\b', line)
    return m.group(1) if m else None


def lower_quantized_types(text: str) -> str:
    """The program with quantized types as storage integers and the quantize ops as custom
    calls carrying their parameters; unchanged when it has no quantized type."""
    if _PREFIX not in text:
        return text
    lines = text.split("\n")
    for n, line in enumerate(lines):
        found = _quantized_types(line) if _PREFIX in line else []
        if not found:
            continue
        m = _QUANT_OP.match(line)
        if m is not None:
            lines[n] = _custom_call(m, line)
            continue
        name = _op_name(line)
        if name not in _STORAGE_OPS:
            raise Unsupported(
                f"{name or 'an op'} on quantized types (line {n + 1}): only uniform_quantize, "
                "uniform_dequantize and bitcast_convert have their meaning on storage integers",
                op=name,
            )
        lines[n] = _storage_types(line, found)
    return "\n".join(lines)


def _storage_types(line: str, found) -> str:
    out, last = [], 0
    for start, end, q in found:
        out.append(line[last:start] + q.storage)
        last = end
    return "".join(out) + line[last:]


def _custom_call(m: re.Match, line: str) -> str:
    types = m.group("types")
    arrow = types.rfind("->")
    if arrow < 0:
        raise Unsupported(f"uniform_{m.group('kind')}: type signature {types} not understood")
    operand_t, result_t = types[:arrow].strip().strip("()").strip(), types[arrow + 2 :].strip()
    attrs = []
    for key, t in ((OPERAND_ATTR, operand_t), (RESULT_ATTR, result_t)):
        q = _quantized_types(t)
        if q:
            attrs.append(f"{key} = {q[0][2].to_attr()}")
    target = QUANTIZE_TARGET if m.group("kind") == "quantize" else DEQUANTIZE_TARGET
    operand_t = _storage_types(operand_t, _quantized_types(operand_t))
    result_t = _storage_types(result_t, _quantized_types(result_t))
    return (
        f"{m.group('lead')}stablehlo.custom_call @{target}({m.group('operand')}) "
        f"{{{', '.join(attrs)}}} : ({operand_t}) -> {result_t}{m.group('loc') or ''}"
    )
