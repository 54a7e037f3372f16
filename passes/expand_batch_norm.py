"""expand-batch-norm: batch_norm_training / _inference / _grad as the ops of their
definition (tv_ir/semantics/ops/normalization.py, the spec's decomposition with rsqrt;
batch_norm_grad's 1/N taken into its sums, so that N is a mean's count: `_grad`).

One batch_norm op is one value to the prover: its result terms would be the whole
normalisation expanded over its inputs (a variance is quadratic in every element of its
lane), and a LayerNorm that torch_xla lowers to batch_norm_training cost seconds per op.
Expanded, the mean, the variance and rsqrt(variance + epsilon) are values of their own
(cut-points), as in a hand-written LayerNorm. The evaluators stay: the expansion computes
exactly what they do (tests/test_op_semantics.py compares the two).
"""

from __future__ import annotations

import numpy as np

from tv_ir.ir.program import Block, Module, Op, Region, TensorType, Value, storage_dtype

name = "expand-batch-norm"

# on the reduces that sum a batch_norm's lanes: shape reduction keeps at least 3 positions
# on what they reduce (passes/shape_reduction/rules.py, `rule_reduce`). A lane of 2
# normalises to +-1 (x - mean is +-(x0 - x1)/2): simulation, which picks the cut-points,
# then sees coincidences everywhere, and HF GPT-2's SGD step with its hidden size at 2 was
# not proved in 900 s (at 4: proved in 57 s)
NORMALISED_LANE = "tv.batch_norm_lane"

OPS = (
    "stablehlo.batch_norm_training",
    "stablehlo.batch_norm_inference",
    "stablehlo.batch_norm_grad",
)


def run(module: Module) -> Module:
    for fn in module.functions.values():
        fn.body = _block(fn.body, {})
    return module


def _block(block: Block, rename: dict[int, Value]) -> Block:
    ops: list[Op] = []
    for op in block.ops:
        op.operands = [rename.get(v.id, v) for v in op.operands]
        for region in op.regions:
            region.block = _block(region.block, rename)
        if op.name not in OPS:
            ops.append(op)
            continue
        b = _Builder(op, ops)
        new = {
            "stablehlo.batch_norm_training": _training,
            "stablehlo.batch_norm_inference": _inference,
            "stablehlo.batch_norm_grad": _grad,
        }[op.name](b, *op.operands)
        for old, v in zip(op.results, new, strict=True):
            rename[old.id] = v
    return Block(block.args, ops, [rename.get(v.id, v) for v in block.results])


class _Builder:
    """Appends ops (at the batch_norm op's location) and returns their results."""

    def __init__(self, op: Op, ops: list[Op]):
        self.op, self.ops = op, ops
        self.t: TensorType = op.operands[0].type
        self.fi: int = op.attrs["feature_index"]
        self.eps: float = op.attrs["epsilon"]

    def emit(self, name: str, operands: list, t: TensorType, attrs=None, regions=None) -> Value:
        v = Value(t)
        o = Op(name, list(operands), [v], dict(attrs or {}), list(regions or []), self.op.loc)
        v.owner = o
        self.ops.append(o)
        return v

    def scalar(self, value: float) -> Value:
        """constant(value, element_type(operand)), rounded to that type."""
        st = TensorType((), self.t.dtype)
        x = np.asarray(value, dtype=np.float64).astype(storage_dtype(st)).astype(np.float64)
        return self.emit("stablehlo.constant", [], st, {"value": x})

    def full(self, v: Value) -> Value:
        """A scalar or a per-feature vector broadcast to the operand's shape."""
        dims = () if not v.type.shape else (self.fi,)
        return self.emit("stablehlo.broadcast_in_dim", [v], self.t, {"broadcast_dimensions": dims})

    def binary(self, name: str, x: Value, y: Value) -> Value:
        return self.emit(f"stablehlo.{name}", [x, y], x.type)

    def rsqrt(self, x: Value) -> Value:
        return self.emit("stablehlo.rsqrt", [x], x.type)

    def sum(self, x: Value) -> Value:
        """compute_sum: reduce with add over every dimension but the feature dimension."""
        st = TensorType((), self.t.dtype)
        p, q, s = Value(st), Value(st), Value(st)
        add = Op("stablehlo.add", [p, q], [s], {}, [], self.op.loc)
        s.owner = add
        axes = tuple(d for d in range(len(self.t.shape)) if d != self.fi)
        out = TensorType((self.t.shape[self.fi],), self.t.dtype)
        body = Region(Block([p, q], [add], [s]))
        attrs = {"dimensions": axes, NORMALISED_LANE: True}
        return self.emit("stablehlo.reduce", [x, self.scalar(0.0)], out, attrs, [body])

    def count(self) -> Value:
        return self.scalar(self.t.size // self.t.shape[self.fi])

    def mean(self, x: Value) -> Value:
        s = self.sum(x)
        n = self.emit(
            "stablehlo.broadcast_in_dim", [self.count()], s.type, {"broadcast_dimensions": ()}
        )
        return self.binary("divide", s, n)


def _normalize(b: _Builder, operand, scale, offset, mean, variance) -> Value:
    centered = b.binary("subtract", operand, b.full(mean))
    inv = b.rsqrt(b.binary("add", b.full(variance), b.full(b.scalar(b.eps))))
    normalized = b.binary("multiply", centered, inv)
    return b.binary("add", b.binary("multiply", b.full(scale), normalized), b.full(offset))


def _inference(b: _Builder, operand, scale, offset, mean, variance) -> list[Value]:
    return [_normalize(b, operand, scale, offset, mean, variance)]


def _training(b: _Builder, operand, scale, offset) -> list[Value]:
    mean = b.mean(operand)
    centered = b.binary("subtract", operand, b.full(mean))
    variance = b.mean(b.binary("multiply", centered, centered))
    return [_normalize(b, operand, scale, offset, mean, variance), mean, variance]


def _grad(b: _Builder, operand, scale, mean, variance, grad_output) -> list[Value]:
    """The spec's `(scale * inv / N) * (N * g - sum(g) - sum(g * c) * c / (var + eps))`
    with 1/N taken into the sums: `scale * inv * (g - mean(g) - mean(g * c) * c / (var +
    eps))`, equal over the reals wherever either is defined (N is a non-zero constant).
    So N is the count of a mean, `sum / N`, which shape reduction reads at the reduced
    count; as `g * N` and `x / N` of values that are no sums it is a constant equal to a
    size, which keeps the normalised dimension at its real size (a LayerNorm's hidden
    size, under torch_xla)."""
    variance_eps = b.binary("add", b.full(variance), b.full(b.scalar(b.eps)))
    centered = b.binary("subtract", operand, b.full(mean))
    inv = b.rsqrt(variance_eps)
    normalized = b.binary("multiply", centered, inv)
    mean_g = b.full(b.mean(grad_output))
    mean_gc = b.full(b.mean(b.binary("multiply", grad_output, centered)))
    i5 = b.binary("divide", b.binary("multiply", mean_gc, centered), variance_eps)
    i6 = b.binary("subtract", b.binary("subtract", grad_output, mean_g), i5)
    grad_operand = b.binary("multiply", b.binary("multiply", b.full(scale), inv), i6)
    grad_scale = b.sum(b.binary("multiply", grad_output, normalized))
    grad_offset = b.sum(grad_output)
    return [grad_operand, grad_scale, grad_offset]
