"""Concrete simulation: random inputs, every top-level value recorded, value matching.

Floats are evaluated in float64 (the programs' real-number semantics, up to float64
rounding). Two arrays *match* when they agree to a relative 1e-9: far below any real
difference a bug makes, far above float64 noise in these programs. Outputs are compared at
the scale of the whole array (`close`); a value and a candidate cut-point element by element
(`close_elementwise`), so one huge masked element cannot hide the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tv_ir.ir.program import Function, Module, TensorType
from tv_ir.semantics.algebra import NumpyAlgebra
from tv_ir.semantics.closeness import RTOL, close, close_elementwise  # noqa: F401 (re-exported)
from tv_ir.semantics.interpreters.interp import Interpreter

from ..limits import check_time


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
        elif t.is_complex:  # both parts as a float's
            re, im = (rng.standard_normal(t.shape).astype(np.float32) for _ in range(2))
            a = re.astype(np.float64) + 1j * im.astype(np.float64)
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


# ops that carry an integer input's elements to a comparison unchanged (copies, moves)
_CARRYING = frozenset(
    "stablehlo." + n for n in "broadcast_in_dim reshape transpose slice convert".split()
)


def compared_ids(fn: Function) -> list[int]:
    """The integer arguments whose elements are compared for equality with an integer
    argument's elements (ids against ids: `seg[:, :, None] == seg[:, None, :]`, the mask
    of sequence packing). Their positions, in argument order."""
    from tv_ir.ir.program import walk

    arg_of = {v.id: i for i, v in enumerate(fn.args)}

    def source(v) -> int | None:  # the argument `v` carries, if any
        while v.owner is not None and v.owner.name in _CARRYING:
            v = v.owner.operands[0]
        i = arg_of.get(v.id) if v.owner is None else None
        t = None if i is None else fn.arg_types[i]
        return i if isinstance(t, TensorType) and t.is_integer else None

    found: set[int] = set()
    for op in walk(fn.body):
        if op.name != "stablehlo.compare" or str(op.attrs.get("comparison_direction")) not in (
            "EQ",
            "NE",
        ):
            continue
        sides = [source(v) for v in op.operands]
        if None not in sides:
            found.update(sides)
    return sorted(found)


def with_equal_ids(fn: Function, inputs: list) -> list:
    """`inputs` with every id compared against ids (`compared_ids`) set to 1 throughout.
    Small random ids make almost every pair unequal at reduced sizes (a packing mask over 2
    positions leaves each query one key), so what the equal pairs compute (attention over
    several keys, and its gradients) is exactly 0 or 1 in every run: values the same in
    every run, which simulation cannot match to spec values. One run with all ids equal
    (one segment, nonzero) takes that path; the other runs keep the unequal one."""
    out = list(inputs)
    for i in compared_ids(fn):
        out[i] = np.ones_like(out[i])
    return out


# ops defined only for non-negative (or positive) operand 0, as reals
_ROOTS = frozenset("stablehlo." + n for n in "sqrt rsqrt log log_plus_one power cbrt".split())
# ops through which an argument's sign reaches their result: (op, operand positions); a
# multiply carries the operand the other of which reads no argument (`under_roots`)
_SIGN_CARRYING = {
    **{n: (0,) for n in _CARRYING},
    "stablehlo.add": (0, 1),
    "stablehlo.divide": (0,),
    "stablehlo.subtract": (0,),
    "stablehlo.reduce": (0,),
    "stablehlo.select": (1, 2),
}


def under_roots(fn: Function) -> list[int]:
    """The float arguments that reach the operand of a square root, a log or a power
    through sums, scalings by constants and moves (AdamW's second moment: `sqrt(b2 * nu +
    ...)`), not through a product of values (`x * x`, non-negative whatever x's sign).
    Their positions."""
    from tv_ir.ir.program import walk

    arg_of = {v.id: i for i, v in enumerate(fn.args)}
    reads = _reads_arguments()
    found: set[int] = set()
    seen: set[int] = set()
    stack = [op.operands[0] for op in walk(fn.body) if op.name in _ROOTS and op.operands]
    while stack:
        v = stack.pop()
        if v.id in seen:
            continue
        seen.add(v.id)
        op = v.owner
        if op is None:
            i = arg_of.get(v.id)
            t = None if i is None else fn.arg_types[i]
            if isinstance(t, TensorType) and t.is_float:
                found.add(i)
            continue
        if op.name == "stablehlo.multiply":  # a scaling: by a constant, not by a value
            a, b = op.operands
            positions = tuple(k for k, other in ((0, b), (1, a)) if not reads(other))
        else:
            positions = _SIGN_CARRYING.get(op.name, ())
        stack += [op.operands[k] for k in positions if k < len(op.operands)]
    return sorted(found)


def _reads_arguments():
    """`reads(v)`: whether `v` depends on an argument (a function's or a region's)."""
    memo: dict[int, bool] = {}

    def reads(v) -> bool:
        stack = [(v, False)]
        while stack:  # post-order: a value after every value it depends on, each once
            u, ready = stack.pop()
            if u.id in memo:
                continue
            if u.owner is None:
                memo[u.id] = True
            elif ready:
                memo[u.id] = bool(u.owner.regions) or any(memo[w.id] for w in u.owner.operands)
            else:
                stack.append((u, True))
                stack += [(w, False) for w in u.owner.operands if w.id not in memo]
        return memo[v.id]

    return reads


def with_non_negative_roots(fn: Function, inputs: list) -> list:
    """`inputs` with the magnitude of every argument that reaches a square root, a log or a
    power (`under_roots`): one run where such values are defined. From a normal
    distribution `sqrt(nu)` of a random second moment is NaN wherever `nu < 0`, and a small
    tile NaN in every run equals every other tile NaN there (NaNs in the same places count
    as equal): on a 32-device FSDP x TP jit AdamW step, 2-element tiles of the update were
    matched to the wrong spec values and the step was never proved. Only those arguments:
    all inputs non-negative make activations grow without cancelling, and then the
    gradients' differences of large values no longer match at float64 noise."""
    out = list(inputs)
    for i in under_roots(fn):
        if out[i] is not None:
            out[i] = np.abs(out[i])
    return out


FACTORISING = frozenset(("stablehlo.cholesky", "stablehlo.triangular_solve"))


def with_dominant_diagonals(fn: Function, inputs: list, *modules: Module) -> list:
    """`inputs` with every square float matrix (the last two dimensions, over any batch)
    made diagonally dominant, x + n I, when the programs factorise or solve: a random
    matrix is almost never positive definite, so its Cholesky factor is NaN everywhere in
    both programs, and a difference between them would not show in any run."""
    from tv_ir.ir.program import walk

    if not any(
        op.name in FACTORISING for m in modules for f in m.functions.values() for op in walk(f.body)
    ):
        return inputs
    out = list(inputs)
    for i, t in enumerate(fn.arg_types):
        shape = getattr(t, "shape", ())
        if getattr(t, "is_float", False) and len(shape) >= 2 and shape[-1] == shape[-2] > 1:
            n = shape[-1]
            out[i] = out[i] + n * np.eye(n, dtype=out[i].dtype)
    return out


def compared_constants(*modules: Module, limit: int = 16) -> list[float]:
    """Finite float constants that the programs compare values against (thresholds,
    sentinels), so simulation can land on both sides of each guard."""
    from tv_ir.ir.program import walk

    found: list[float] = []
    for m in modules:
        for fn in m.functions.values():
            for op in walk(fn.body):
                if op.name != "stablehlo.compare":
                    continue
                for v in op.operands:
                    c = _constant_of(v)
                    if c is None:
                        continue
                    for x in np.unique(c)[:limit]:
                        if np.isfinite(x) and float(x) not in found:
                            found.append(float(x))
    return found[:limit]


def _constant_of(v):
    """The values of a (broadcast) float constant operand, else None."""
    for _ in range(4):
        op = v.owner
        if op is None:
            return None
        if op.name == "stablehlo.constant":
            t = v.type
            if not isinstance(t, TensorType) or not t.is_float:
                return None
            return np.asarray(op.attrs.get("value"), dtype=np.float64).reshape(-1)
        if op.name not in ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.convert"):
            return None
        v = op.operands[0]
    return None


def guard_inputs(fn: Function, constants: list[float], rng: np.random.Generator) -> list[list]:
    """Inputs on the guard sets random normals miss: everything zero (zero denominators and
    norms, empty masks), and elements drawn from 0, +-1 and the compared constants with
    their neighbours (both sides of a threshold, the sentinel itself)."""
    pool = [0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0]
    for c in constants:
        pool += [c, c + 1.0, c - 1.0, -c]
    pool = np.array(sorted(set(pool)), dtype=np.float32).astype(np.float64)
    zeros, mixed = [], []
    for t in fn.arg_types:
        if not isinstance(t, TensorType):
            zeros.append(None)
            mixed.append(None)
            continue
        zeros.append(np.zeros(t.shape, dtype=np.float64 if t.is_float else t.numpy_dtype))
        if t.is_float:
            pick = rng.random(t.shape) < 0.5
            a = np.where(
                pick,
                rng.choice(pool, size=t.shape),
                rng.standard_normal(t.shape).astype(np.float32).astype(np.float64),
            )
        elif t.is_bool:
            a = rng.random(t.shape) < 0.5
        else:
            a = rng.integers(0, 4, size=t.shape).astype(t.numpy_dtype)
        mixed.append(np.asarray(a))
    return [zeros, mixed]


# ops that are total and finite over the reals on finite operands: an infinity they produce
# from finite operands is float overflow (a division by zero or log(0) is not: see dom)
_TOTAL = frozenset(
    "stablehlo." + n
    for n in (
        "add subtract multiply exponential exponential_minus_one power dot_general dot "
        "reduce convert cosine sine tanh logistic negate abs maximum minimum "
        "broadcast_in_dim reshape transpose all_reduce reduce_scatter"
    ).split()
)


_COMBINING = frozenset({"stablehlo.all_reduce", "stablehlo.reduce_scatter"})


def overflowed(module: Module, trace, within: set[int] | None = None) -> bool:
    """Whether a run overflowed floats: an op that is total over the reals produced an
    infinity from finite operands (integers near their extremes converted to floats and
    exponentiated, say). Floats are reals, so such a run is no evidence about the programs;
    a division by zero or a square root of a negative number is (docs/equivalence.md).
    `within`: only ops whose results are among these value ids (what one output reads)."""
    for op in module.main.body.ops:
        if op.name not in _TOTAL:
            continue
        if within is not None and not any(v.id in within for v in op.results):
            continue
        for v in op.results:
            out = trace.values.get(v.id)
            if out is None:
                continue
            outs = out if isinstance(out, list) else [out]
            for d, r in enumerate(outs):
                r = np.asarray(r)
                if r.dtype.kind != "f" or np.all(np.isfinite(r)) or not np.any(np.isinf(r)):
                    continue
                ins = []
                for x in op.operands:
                    a = trace.values.get(x.id)
                    if isinstance(a, list) and op.name in _COMBINING:
                        ins += a  # a device's result combines every device's operand
                    else:
                        ins.append(a[d] if isinstance(a, list) else a)
                if all(
                    a is not None and (np.asarray(a).dtype.kind != "f" or np.all(np.isfinite(a)))
                    for a in ins
                ):
                    return True
    return False


@dataclass
class Trace:
    """Every top-level value of one concrete run (by value id), and the outputs."""

    values: dict[int, np.ndarray] = field(default_factory=dict)
    outputs: list = field(default_factory=list)


def run_traced(module: Module, inputs: list, values: bool = True) -> Trace:
    """One run of `module`: its outputs, and (`values`) every top-level value."""
    trace = Trace()

    def hook(op, results):
        for v, r in zip(op.results, results, strict=True):
            trace.values[v.id] = r
        return results

    interp = Interpreter(module, NumpyAlgebra(), hook=hook if values else None)
    for v, a in zip(module.main.args, inputs, strict=True):
        trace.values[v.id] = a
    trace.outputs = interp.run(module.main, inputs)
    return trace


def run_traced_devices(
    module: Module,
    per_device_inputs: list[list],
    num_replicas: int,
    num_partitions: int,
    values: bool = True,
    trace: Trace | None = None,
) -> Trace:
    """Run a per-device program on every device; values (unless `values` is False: the
    outputs only, the devices' values held batched) and outputs are per-device lists.
    `trace`, when given, is filled as the run goes: a caller keeps the values computed
    before an error (a hang) ended the run."""
    from tv_ir.semantics.interpreters.spmd import SpmdInterpreter

    trace = Trace() if trace is None else trace
    n = num_replicas * num_partitions

    def hook(op, results):
        check_time()  # a program run at its real sizes may be long: limits hold here too
        for k, v in enumerate(op.results):
            trace.values[v.id] = [results[d][k] for d in range(n)]
        return results

    for k, v in enumerate(module.main.args):
        trace.values[v.id] = [per_device_inputs[d][k] for d in range(n)]
    interp = SpmdInterpreter(
        module, NumpyAlgebra(), num_replicas, num_partitions, hook=hook if values else None
    )
    outs = interp.run(per_device_inputs)
    trace.outputs = [[outs[d][k] for d in range(n)] for k in range(len(module.main.body.results))]
    return trace


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
            diff = np.where(fin, np.abs(a - b) > rtol * scale, fa != np.isfinite(b))
    idx = np.argwhere(diff)
    return tuple(int(i) for i in idx[0]) if len(idx) else None
