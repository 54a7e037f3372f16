"""Element-wise stages that mirror a spec op: cut by what they are, without their terms.

An element-wise op (StableHLO: `result[i] = f(operand_1[i], ..., operand_n[i])`, every
operand of the result's shape) applied on a device to blocks that are, element by element,
the very terms of one spec op's operands at one box (cut symbols of values already proved,
the spec's own constants and broadcasts of them), where the spec op is the same op (name,
attributes, element types), computes that box of the spec op's result: the same `f` of
the same values at every position. Its result is then the spec value's symbols at that box
(equal to it wherever it is defined), as when its terms are found to be the spec's one-op
definition there (`StageProver._is_definition`): the stage is proved by what the op is,
and its terms, which such a proof would compute and then replace, are never computed.
Anything else (another op, another box, an operand that is not the spec's terms there) is
evaluated and cut as before.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tv_ir.errors import TvError
from tv_ir.ir.program import Op, TensorType
from tv_ir.semantics import terms as T
from tv_ir.semantics.interpreters.device_batch import ELEMENTWISE

from .correspond import box_index
from .spec_graph import SpecGraph, elementwise_signature


def mirrored_cut(
    graph: SpecGraph,
    op: Op,
    operands_of: Callable[[Op], list[list]],
    cut_of: dict,
    spec_env: dict,
    block_of: Callable[[np.ndarray], tuple | None],
) -> tuple | None:
    """Per device, the (spec value, box) `op`'s one result equals because `op` mirrors a
    spec op there (see the module docstring); None unless it does on every device.
    `operands_of(op)[d]` are device d's operand values; `cut_of` maps an implementation value to
    the (spec value, box) per device it was proved equal to; `block_of` names the (spec
    value, box) whose symbols an array is, if any (a shard of an input, a slice of a cut
    value); `spec_env` the spec's values as terms. The box only picks the candidate: the
    operands' terms are what is compared."""
    if op.name not in ELEMENTWISE or len(op.results) != 1:
        return None
    t = op.results[0].type
    if not isinstance(t, TensorType) or not t.is_float or getattr(t, "is_complex", False):
        return None
    shape = tuple(t.shape)
    if not _position_wise(op):
        return None  # a scalar predicate or bound, broadcast: not position by position
    signature = elementwise_signature(op)
    out = []
    for d, values in enumerate(operands_of(op)):
        found = None
        for u, x in zip(op.operands, values, strict=True):
            cut = cut_of.get(u.id)
            piece = block_of(x) if cut is None else cut[d]
            if piece is None:
                continue
            vid, box = piece
            if tuple(b - a for a, b in box) != shape:
                continue
            found = _mirrored(graph, signature, vid, box, values, spec_env)
            if found is not None:
                break
        if found is None:
            return None
        out.append(found)
    return tuple(out)


def _mirrored(graph: SpecGraph, signature, vid: int, box, values: list, spec_env: dict):
    """(result, box) of the spec op reading `vid` whose operands at `box` are `values`."""
    index = box_index(box)
    for s_op in graph.users(vid):
        if graph.elementwise_signature(s_op) != signature or not _position_wise(s_op):
            continue
        if all(
            w.id in spec_env and same_terms(np.asarray(x), np.asarray(spec_env[w.id])[index])
            for x, w in zip(values, s_op.operands, strict=True)
        ):
            return s_op.results[0].id, box
    return None


def _position_wise(op: Op) -> bool:
    """Is every operand of the result's shape (no scalar broadcast by the op)?"""
    shape = tuple(getattr(op.results[0].type, "shape", ()))
    return all(tuple(getattr(u.type, "shape", ())) == shape for u in op.operands)


def same_terms(a: np.ndarray, b: np.ndarray) -> bool:
    """Are two arrays the same terms element by element (hash-consed normal forms with
    their definedness conditions; a number and the constant term of its value alike)?"""
    return a.shape == b.shape and all(
        x is y or same_term(x, y) for x, y in zip(a.flat, b.flat, strict=True)
    )


def same_term(x, y) -> bool:
    if isinstance(x, T.Bool) or isinstance(y, T.Bool):
        return T.lift_bool(x) is T.lift_bool(y)
    try:
        return T.lift(x) == T.lift(y)
    except TvError:
        return False
