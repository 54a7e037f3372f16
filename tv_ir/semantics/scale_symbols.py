"""A scalar scale standing for any positive number, in both programs alike.

Shape reduction marks a constant whose value may or may not be a dimension's size (an
attention scale `1/sqrt(256) = 1/16` beside 16 heads, passes/shape_reduction) with a key
instead of keeping that dimension: the proof then holds for every positive value of it,
its own and a count's at the reduced size. Concrete runs read the constant's own value.
"""

from __future__ import annotations

# the key (the constant's TABLE_ATTR) `scale:B^e*sign` is the constant sign * B**e, read by
# `SymbolicAlgebra.table` as sign * s**e with s > 0 one symbol named by B in both programs.
# e is -1 only where the constant is exactly 1/B (`x / 16` and `x * 0.0625` read the same s;
# `x * 0.0833...`, which is not 1/12, reads a symbol of its own)
SCALE_KEY = "scale:"
SCALE_KIND = "scale"  # the kind of the symbols' Keys (terms.Key): positive reals


def scale_key(c: float) -> str:
    """The key of the non-zero scalar constant c standing for a positive symbol."""
    a = abs(float(c))
    n = round(1 / a) if a < 1 else 0
    base, e = (n, -1) if n >= 2 and 1.0 / n == a else (a, 1)
    return f"{SCALE_KEY}{float(base).hex()}^{e}*{'-' if c < 0 else '+'}"


def parse_scale_key(key: str) -> tuple[float, int, int]:
    """(B, e, sign) of a `scale_key`: the constant is sign * B**e."""
    base, rest = key[len(SCALE_KEY) :].split("^")
    e, sign = rest.split("*")
    return float.fromhex(base), int(e), -1 if sign == "-" else 1


def symbol_value(key: str) -> float:
    """The constant a `scale_key` stands for: its own value."""
    base, e, sign = parse_scale_key(key)
    return sign * base**e
