"""rng_bit_generator: XLA's generators bit for bit (xla/hlo/builder/lib/prng.cc, expanded by
xla/service/rng_bit_generator_expander.cc), so a program's random bits are the numbers
XLA:CPU draws.

The spec leaves the bits implementation-defined; tv reads them as XLA does: `PHILOX`
(Philox4x32-10), `THREE_FRY` (Threefry2x32, 20 rounds) and `DEFAULT`, which XLA:CPU (and
GPU) expand to Philox. A proof that depends on the bits therefore holds for XLA:CPU's
generator (a TPU may choose another for DEFAULT). The state must be known (a constant
seed, as torch_xla's dropout has): bits of an input-dependent state are unsupported.
"""

from __future__ import annotations

import numpy as np

from tv_ir.semantics.ops.registry import op

U32, U64 = np.uint32, np.uint64
_MASK32 = U64(0xFFFFFFFF)


def _lo_hi(x) -> tuple[np.ndarray, np.ndarray]:
    """A uint64 array as its low and high 32-bit halves."""
    x = np.asarray(x, dtype=U64)
    return (x & _MASK32).astype(U32), (x >> U64(32)).astype(U32)


def _halves(v: int) -> tuple[int, int]:
    return v & 0xFFFFFFFF, v >> 32


def _u64(lo, hi) -> np.ndarray:
    return np.asarray(lo, dtype=U64) | (np.asarray(hi, dtype=U64) << U64(32))


def _philox4x32(x: list, key: tuple) -> list:
    """Philox4x32 with 10 rounds on four uint32 arrays."""
    k0, k1 = U32(key[0]), U32(key[1])
    for _ in range(10):
        p0 = x[0].astype(U64) * U64(0xD2511F53)
        p1 = x[2].astype(U64) * U64(0xCD9E8D57)
        p0_lo, p0_hi = _lo_hi(p0)
        p1_lo, p1_hi = _lo_hi(p1)
        x = [p1_hi ^ x[1] ^ k0, p1_lo, p0_hi ^ x[3] ^ k1, p0_lo]
        k0, k1 = k0 + U32(0x9E3779B9), k1 + U32(0xBB67AE85)
    return x


def _philox_words(n: int, key: int, low: int, high: int) -> tuple[list, tuple[int, int]]:
    """4 * ceil(n / 4) words: Philox of the 128-bit counter (low, high) + [0, 1, ...], as
    four arrays, and the counter advanced past them."""
    m = -(-n // 4)
    i = np.arange(m, dtype=U64)
    new_low = U64(low) + i
    new_high = np.where(new_low < U64(low), U64(high) + U64(1), U64(high)).astype(U64)
    x = [*_lo_hi(new_low), *_lo_hi(new_high)]
    out = _philox4x32(x, _halves(key))
    end_low = U64(low) + U64(m)
    end_high = U64(high) + U64(1) if end_low < U64(low) else U64(high)
    return [w.reshape(-1) for w in out], (int(end_low), int(end_high))


def _philox(state: np.ndarray, shape: tuple, bits: int) -> tuple[np.ndarray, np.ndarray]:
    key = int(state[0])
    if state.size >= 3:
        low, high = int(state[1]), int(state[2])
    else:  # the expander reverses a two-word state: counter (state[1], state[0])
        low, high = int(state[1]), int(state[0])
    n = int(np.prod(shape, dtype=np.int64))
    if bits == 64:
        w, (end_low, end_high) = _philox_words(2 * n, key, low, high)
        numbers = np.stack([_u64(w[0], w[1]), _u64(w[2], w[3])], axis=1).reshape(-1)
    else:
        w, (end_low, end_high) = _philox_words(n, key, low, high)
        numbers = np.stack(w, axis=1).reshape(-1)  # round-robin over the four words
    new = [key, end_low] if state.size < 3 else [key, end_low, end_high]
    return np.array(new, dtype=U64), numbers[:n].reshape(shape)


_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)


def _rotl(v, d: int):
    return (v << U32(d)) | (v >> U32(32 - d))


def _threefry2x32(x: list, key: tuple) -> list:
    ks = [U32(key[0]), U32(key[1]), U32(0x1BD11BDA) ^ U32(key[0]) ^ U32(key[1])]
    x = [x[0] + ks[0], x[1] + ks[1]]
    for block in range(5):
        for r in _ROTATIONS[4 * (block % 2) : 4 * (block % 2) + 4]:
            x0 = x[0] + x[1]
            x = [x0, x0 ^ _rotl(x[1], r)]
        x = [x[0] + ks[(block + 1) % 3], x[1] + ks[(block + 2) % 3] + U32(block + 1)]
    return x


def _split_dim(shape: tuple) -> int:
    """SplitShapeIntoHalves: the first even dimension, else the (first) largest."""
    for d, s in enumerate(shape):
        if s % 2 == 0:
            return d
    return max(range(len(shape)), key=lambda d: (shape[d], -d))


def _threefry(state: np.ndarray, shape: tuple, bits: int) -> tuple[np.ndarray, np.ndarray]:
    key = _halves(int(state[0]))
    start = U64(state[1])
    n = int(np.prod(shape, dtype=np.int64))
    if bits == 64:
        counters = start + np.arange(n, dtype=U64)
        out = _threefry2x32(list(_lo_hi(counters)), key)
        return np.array([state[0], start + U64(n)], dtype=U64), _u64(*out).reshape(shape)
    if not shape:  # a scalar: the first word of a one-counter draw
        out = _threefry2x32(list(_lo_hi(np.array([start], dtype=U64))), key)
        return np.array([state[0], start + U64(1)], dtype=U64), out[0].reshape(())
    d = _split_dim(shape)
    half = list(shape)
    half[d] = -(-shape[d] // 2)
    m = int(np.prod(half, dtype=np.int64))
    counters = start + np.arange(m, dtype=U64)
    out = [w.reshape(half) for w in _threefry2x32(list(_lo_hi(counters)), key)]
    # the two words side by side on a new dimension after d, merged into d, cut to size
    both = np.stack(out, axis=d + 1)
    merged = both.reshape(half[:d] + [2 * half[d]] + half[d + 1 :])
    numbers = np.take(merged, np.arange(shape[d]), axis=d)
    return np.array([state[0], start + U64(m)], dtype=U64), numbers


@op("stablehlo.rng_bit_generator")
def rng_bit_generator(ctx, state):
    algorithm = ctx.attr("rng_algorithm")
    name = str(getattr(algorithm, "value", algorithm)).upper()
    name = {"0": "DEFAULT", "1": "THREE_FRY", "2": "PHILOX"}.get(name, name)
    t = ctx.result_types[1]
    if ctx.alg.is_symbolic(state):
        known = [ctx.alg.known_index(np.asarray(e)) for e in np.asarray(state).flat]
        if any(k is None for k in known):
            raise ctx.unsupported("random bits of an input-dependent state")
        state = np.array([k % 2**64 for k in known], dtype=U64)
    state = np.asarray(state).astype(U64)
    dt = np.dtype(t.numpy_dtype)
    if dt.kind != "u" or t.is_bool:
        # floats and signed integers: XLA:CPU hands back unsigned buffers for them
        raise ctx.unsupported(f"random bits of type {t.dtype}")
    bits = dt.itemsize * 8
    with np.errstate(over="ignore"):  # uint32/uint64 arithmetic wraps, as intended
        if name == "THREE_FRY":
            new_state, numbers = _threefry(state, t.shape, bits)
        elif name in ("PHILOX", "DEFAULT"):
            new_state, numbers = _philox(state, t.shape, bits)
        else:
            raise ctx.unsupported(f"rng algorithm {name}")
    numbers = numbers.astype(dt)  # narrower types keep the low bits of 32-bit words
    return [new_state.astype(ctx.result_types[0].numpy_dtype), numbers]


@op("stablehlo.rng")
def rng(ctx, a, b, shape_operand):
    """The spec leaves rng's numbers to the implementation (hidden state, or none): tv
    gives it meaning only where the spec fixes every number, a UNIFORM draw from an integer
    interval [a, a + 1) holding one value. Anything else is unsupported, never a guess
    that the spec and the implementation draw the same numbers."""
    t = ctx.result_type
    distribution = str(getattr(ctx.attr("rng_distribution"), "value", ""))
    if distribution != "UNIFORM" or t.is_float or t.is_complex:
        raise ctx.unsupported(
            f"{distribution} numbers of {t.dtype} (implementation-defined: only a UNIFORM "
            "integer interval holding one value is determined)"
        )
    lo, hi = ctx.alg.known_index(a), ctx.alg.known_index(b)
    if lo is None or hi is None or hi != lo + 1:
        raise ctx.unsupported(
            "the numbers of a UNIFORM interval holding more than one value (or bounds that "
            "depend on the inputs) are implementation-defined"
        )
    return np.full(t.shape, lo, dtype=t.numpy_dtype)
