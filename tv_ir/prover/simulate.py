"""Concrete simulation: random inputs, every top-level value recorded, value matching.

Floats are evaluated in float64 (the programs' real-number semantics, up to float64
rounding). Two arrays *match* when they agree to a relative 1e-9: far below any real
difference a bug makes, far above float64 noise in these programs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..algebra import NumpyAlgebra
from ..interp import Interpreter
from ..ir import Function, Module, TensorType

RTOL = 1e-9


def random_inputs(fn: Function, rng: np.random.Generator, extremes: bool = False) -> list:
    """Random inputs: floats from a standard normal (representable in f32), integers small
    (valid indices) or, with `extremes`, anywhere in their type's range with its edges
    (min, min + 1, -1, 0, 1, max - 1, max) half of the time, where machine integers wrap."""
    out = []
    for t in fn.arg_types:
        if not isinstance(t, TensorType):
            out.append(None)
            continue
        if t.is_float:
            # values representable in f32, so a reported input is exactly what XLA would see
            a = rng.standard_normal(t.shape).astype(np.float32).astype(np.float64)
        elif t.is_bool:
            a = rng.random(t.shape) < 0.5
        elif extremes:
            info = np.iinfo(t.numpy_dtype)
            edges = [info.min, info.min + 1, -1, 0, 1, info.max - 1, info.max]
            edges = np.array([v for v in edges if info.min <= v <= info.max], dtype=t.numpy_dtype)
            anywhere = rng.integers(
                info.min, info.max, size=t.shape, dtype=t.numpy_dtype, endpoint=True
            )
            a = np.where(rng.random(t.shape) < 0.5, rng.choice(edges, size=t.shape), anywhere)
            a = a.astype(t.numpy_dtype)
        else:
            a = rng.integers(0, 4, size=t.shape).astype(t.numpy_dtype)
        out.append(np.asarray(a))
    return out


def overflowed(trace, reference) -> bool:
    """Whether a run reached infinities or NaNs where the reference run had finite values:
    floats are reals, so such a run (integers near their extremes converted to floats, say)
    is no evidence about the programs' real-number semantics."""
    for vid, values in trace.values.items():
        ref = reference.values.get(vid)
        if ref is None:
            continue
        pairs = zip(values, ref, strict=True) if isinstance(values, list) else [(values, ref)]
        for a, b in pairs:
            a, b = np.asarray(a), np.asarray(b)
            if (
                a.dtype.kind == "f"
                and a.shape == b.shape
                and np.any(~np.isfinite(a) & np.isfinite(b))
            ):
                return True
    return False


@dataclass
class Trace:
    """Every top-level value of one concrete run (by value id), and the outputs."""

    values: dict[int, np.ndarray] = field(default_factory=dict)
    outputs: list = field(default_factory=list)


def run_traced(module: Module, inputs: list) -> Trace:
    trace = Trace()

    def hook(op, results):
        for v, r in zip(op.results, results, strict=True):
            trace.values[v.id] = r
        return results

    interp = Interpreter(module, NumpyAlgebra(), hook=hook)
    for v, a in zip(module.main.args, inputs, strict=True):
        trace.values[v.id] = a
    trace.outputs = interp.run(module.main, inputs)
    return trace


def run_traced_devices(
    module: Module, per_device_inputs: list[list], num_replicas: int, num_partitions: int
) -> Trace:
    """Run a per-device program on every device; values and outputs are per-device lists."""
    from ..spmd import SpmdInterpreter

    trace = Trace()
    n = num_replicas * num_partitions

    def hook(op, results):
        for k, v in enumerate(op.results):
            trace.values[v.id] = [results[d][k] for d in range(n)]
        return results

    for k, v in enumerate(module.main.args):
        trace.values[v.id] = [per_device_inputs[d][k] for d in range(n)]
    interp = SpmdInterpreter(module, NumpyAlgebra(), num_replicas, num_partitions, hook=hook)
    outs = interp.run(per_device_inputs)
    trace.outputs = [[outs[d][k] for d in range(n)] for k in range(len(module.main.body.results))]
    return trace


def close(a, b, rtol: float = RTOL) -> bool:
    """Equal up to float64 noise; infinities and NaNs must coincide exactly."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype.kind not in "fc" and b.dtype.kind not in "fc":
        return bool(np.array_equal(a, b))
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not np.array_equal(fa, fb):
        return False
    if not np.all(fa):
        na, nb = np.isnan(a), np.isnan(b)
        if not np.array_equal(na, nb) or not np.array_equal(a[~fa & ~na], b[~fb & ~nb]):
            return False
    if not np.any(fa):
        return True
    scale = max(1.0, float(np.max(np.abs(a[fa]))), float(np.max(np.abs(b[fb]))))
    return bool(np.max(np.abs(a[fa] - b[fb])) <= rtol * scale)


def first_difference(a, b, rtol: float = RTOL) -> tuple[int, ...] | None:
    """Index of the first element where a and b differ beyond noise, or None."""
    a = np.asarray(a, dtype=np.float64) if np.asarray(a).dtype.kind != "b" else np.asarray(a)
    b = np.asarray(b, dtype=np.float64) if np.asarray(b).dtype.kind != "b" else np.asarray(b)
    if a.dtype.kind == "b" or b.dtype.kind == "b":
        diff = a != b
    else:
        fa = np.isfinite(a)
        fin = fa & np.isfinite(b)
        scale = max(
            1.0, float(np.max(np.abs(a[fin]), initial=0)), float(np.max(np.abs(b[fin]), initial=0))
        )
        with np.errstate(all="ignore"):
            diff = np.where(
                fin, np.abs(a - b) > rtol * scale, ~((a == b) | (np.isnan(a) & np.isnan(b)))
            )
    idx = np.argwhere(diff)
    return tuple(int(i) for i in idx[0]) if len(idx) else None
