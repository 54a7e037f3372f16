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
evaluated and cut as before. A `dot_general` mirrors a spec one the same way when its
operands' blocks hold their whole contracting dimensions (`_mirrored_dots`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tv_ir.errors import TvError
from tv_ir.ir.program import Op, TensorType
from tv_ir.semantics import terms as T
from tv_ir.semantics.ops.registry import ELEMENTWISE

from .correspond import box_index
from .spec_graph import SpecGraph, shape_free_signature

DOT = "stablehlo.dot_general"


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
    if (op.name not in ELEMENTWISE and op.name != DOT) or len(op.results) != 1:
        return None
    t = op.results[0].type
    if not isinstance(t, TensorType) or not t.is_float or getattr(t, "is_complex", False):
        return None
    shape = tuple(t.shape)
    signature = shape_free_signature(op)
    if op.name == DOT:
        return _mirrored_dots(graph, op, signature, operands_of(op), cut_of, spec_env, block_of)
    if not _position_wise(op):
        return None  # a scalar predicate or bound, broadcast: not position by position
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
        if graph.shape_free_signature(s_op) != signature or not _position_wise(s_op):
            continue
        if all(
            w.id in spec_env and same_terms(np.asarray(x), np.asarray(spec_env[w.id])[index])
            for x, w in zip(values, s_op.operands, strict=True)
        ):
            return s_op.results[0].id, box
    return None


def _mirrored_dots(graph, op, signature, operands, cut_of, spec_env, block_of) -> tuple | None:
    """Per device, (spec value, box) of a `dot_general` whose operands are the blocks of a
    spec `dot_general`'s operands (the same attributes and element types) that hold their
    whole contracting dimensions and the same batch positions: it computes every sum of the
    spec op's at the positions its blocks select, so it is that block of the result."""
    dims = op.attrs.get("dot_dimension_numbers")
    if dims is None:
        return None
    lb, rb, lc, rc = dims.lhs_batch, dims.rhs_batch, dims.lhs_contract, dims.rhs_contract
    out = []
    for d, (x, y) in enumerate(operands):
        x, y = np.asarray(x), np.asarray(y)
        pieces = []
        for u, a in zip(op.operands, (x, y), strict=True):
            cut = cut_of.get(u.id)
            pieces.append(block_of(a) if cut is None else cut[d])
        known = next((p for p in pieces if p is not None), None)
        if known is None:
            return None
        found = None
        for s_op in graph.users(known[0]):
            if graph.shape_free_signature(s_op) != signature:
                continue
            sl, sr = (spec_env.get(w.id) for w in s_op.operands)
            if sl is None or sr is None:
                continue
            sl, sr = np.asarray(sl), np.asarray(sr)
            lbox = pieces[0][1] if pieces[0] is not None else _located(x, sl)
            rbox = pieces[1][1] if pieces[1] is not None else _located(y, sr)
            if lbox is None or rbox is None or len(lbox) != sl.ndim or len(rbox) != sr.ndim:
                continue
            whole = all(lbox[c] == (0, sl.shape[c]) for c in lc) and all(
                rbox[c] == (0, sr.shape[c]) for c in rc
            )
            if not whole or any(lbox[i] != rbox[j] for i, j in zip(lb, rb, strict=True)):
                continue
            if same_terms(x, sl[box_index(lbox)]) and same_terms(y, sr[box_index(rbox)]):
                lf = [i for i in range(sl.ndim) if i not in lb and i not in lc]
                rf = [j for j in range(sr.ndim) if j not in rb and j not in rc]
                box = tuple([lbox[i] for i in lb] + [lbox[i] for i in lf] + [rbox[j] for j in rf])
                found = (s_op.results[0].id, box)
                break
        if found is None:
            return None
        out.append(found)
    return tuple(out)


def _located(x: np.ndarray, whole: np.ndarray):
    """The box of `whole` that starts where `x`'s first element is (by identity), of x's
    shape; None when it is not there or does not fit. Only a candidate: the caller compares
    the terms."""
    if x.ndim != whole.ndim or x.size == 0 or whole.dtype != object or x.dtype != object:
        return None
    first = x.flat[0]
    at = next((i for i, e in enumerate(whole.flat) if e is first), None)
    if at is None:
        return None
    origin = np.unravel_index(at, whole.shape)
    box = tuple((int(o), int(o) + n) for o, n in zip(origin, x.shape, strict=True))
    return box if all(b <= n for (_, b), n in zip(box, whole.shape, strict=True)) else None


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


def terms_key(a: np.ndarray):
    """A key two arrays `same_terms` calls equal share (their shapes and first elements'
    terms): distinct arrays filed by it are compared with the few of their key only."""
    if a.size == 0:
        return a.shape
    x = a.flat[0]
    if isinstance(x, T.Bool):
        return a.shape, "bool", id(x)
    try:
        return a.shape, T.lift(x)
    except TvError:
        return a.shape, "none", id(a)  # equal to nothing but itself


def same_term(x, y) -> bool:
    if isinstance(x, T.Bool) or isinstance(y, T.Bool):
        return T.lift_bool(x) is T.lift_bool(y)
    try:
        return T.lift(x) == T.lift(y)
    except TvError:
        return False
