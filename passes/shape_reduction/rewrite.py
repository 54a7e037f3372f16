"""The reduced programs: each value's dimensions divided by their class's factor.

Only attributes that hold sizes or offsets change (slice bounds, pad widths, dynamic_slice
sizes, splat constants' shapes), and known integers in a class's units are read divided
(`Rescale`: a constant, or a per-device table indexed by `partition_id`). Ops keep their
source locations, so a refutation at reduced shapes names the user's op and line.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from tv_ir.ir.program import Block, Function, Module, Op, Region, TensorType, Value
from tv_ir.semantics.layout import Layout
from tv_ir.semantics.ops.shape import TABLE_ATTR
from tv_ir.semantics.scale_symbols import symbol_value

from .affine import Affine
from .classes import DimClasses
from .rules import ELEMENTWISE, Rescale
from .windows import cumulative, whole_window, window_pads


def table_key(value: np.ndarray) -> str:
    """A name for a real table: its elements in row-major order and its shape (`content:shape`,
    read by `SymbolicAlgebra.table`). Tables with the same elements in the same order share
    their symbols whatever their shapes: XLA folds `reshape(constant)` into a constant of the
    new shape (a RoPE frequency table [4] becomes [1, 4, 1] in the partitioned program), and
    element k of both is one real number."""
    h = hashlib.sha1(f"{value.dtype}".encode())
    h.update(np.ascontiguousarray(value).tobytes())
    return f"{h.hexdigest()[:16]}:{'x'.join(str(n) for n in value.shape)}"


class Rewriter:
    def __init__(
        self,
        d: DimClasses,
        factor: dict,
        rescales: list[Rescale],
        num_partitions: int,
        normalised: dict | None = None,
        splats: dict | None = None,
        tables: dict | None = None,
        affine: dict[tuple[int, int], Affine] | None = None,
        symbols: dict | None = None,
    ):
        self.d = d
        self.factor = factor
        self.affine = affine or {}  # class root -> its affine unit (affine.py)
        self.rescales = {(id(r.op), r.operand): r for r in rescales}
        # (id(op), operand) -> the float constant's value at the reduced size
        self.normalised = normalised or {}
        self.splats = splats or {}
        self.tables = tables or {}  # value ids of float tables that become symbols
        # (id(op), operand) -> the key of the symbol an ambiguous scale stands for (a
        # positive number, `scale_key`): proved for any value, its own and a count's
        self.symbols = symbols or {}
        self.num_partitions = num_partitions
        self.vmap: dict[int, Value] = {}
        # splat copies made in the block being rewritten: (value id, type) -> the copy, so
        # a splat shared by many uses (CSE) is copied once per shape, not once per use
        self.copies: dict = {}

    def f(self, vid: int, axis: int) -> int:
        key = (vid, axis)
        if key not in self.d.parent:
            return 1
        return self.factor.get(self.d.find(key), 1)

    def at(self, vid: int, axis: int, n: int) -> int:
        """A size or offset n along dimension `axis` of value `vid`, at the reduced size:
        divided by its class's factor, or mapped by its affine unit."""
        key = (vid, axis)
        if key not in self.d.parent:
            return n
        aff = self.affine.get(self.d.find(key))
        if aff is not None:
            return aff.at(n)
        k = self.f(vid, axis)
        if n % k:
            raise AssertionError(f"factor {k} does not divide {n} (value {vid}, axis {axis})")
        return n // k

    def type_of(self, v: Value):
        t = v.type
        if not isinstance(t, TensorType):
            return t
        shape = [self.at(v.id, a, n) for a, n in enumerate(t.shape)]
        return TensorType(tuple(shape), t.dtype)

    def value(self, v: Value, owner: Op | None = None, index: int = 0) -> Value:
        nv = Value(self.type_of(v), v.name, owner, index)
        self.vmap[v.id] = nv
        return nv

    def module(self, m: Module) -> Module:
        fn = m.main
        new_fn = self.function(fn)
        functions = {k: (new_fn if f is fn else f) for k, f in m.functions.items()}
        return dataclasses.replace(m, functions=functions)

    def function(self, fn: Function) -> Function:
        body = self.block(fn.body)
        return dataclasses.replace(fn, body=body, result_types=[v.type for v in body.results])

    def block(self, b: Block) -> Block:
        args = [self.value(a) for a in b.args]
        ops: list[Op] = []
        outer, self.copies = self.copies, {}  # a copy made in a region is not seen outside
        for op in b.ops:
            ops.extend(self.op(op))
        self.copies = outer
        return Block(args, ops, [self.vmap[v.id] for v in b.results])

    def op(self, op: Op) -> list[Op]:
        before: list[Op] = []
        operands = []
        for k, v in enumerate(op.operands):
            r = self.rescales.get((id(op), k))
            value = self.normalised.get((id(op), k))
            root = self.d.find(r.key) if r is not None else None
            if r is not None and (self.factor.get(root, 1) > 1 or root in self.affine):
                new_ops, nv = self.rescaled(r, v, op)
                before += new_ops
                operands.append(nv)
            elif value is not None:
                new_ops, nv = self.splat(np.float64(value), self.operand_type(v, op), op.loc)
                before += new_ops
                operands.append(nv)
            elif (id(op), k) in self.symbols:
                key = self.symbols[(id(op), k)]
                t = self.operand_type(v, op)
                new_ops, nv = self.splat(np.asarray(symbol_value(key)), t, op.loc)
                new_ops[0].attrs[TABLE_ATTR] = key
                before += new_ops
                operands.append(nv)
            elif v.id in self.splats and op.name in ELEMENTWISE and op.results:
                new_ops, nv = self.splat_at(v, self.operand_type(v, op))
                before += new_ops
                operands.append(nv)
            elif v.id in self.splats and op.name == "stablehlo.while":
                # a splat starting the loop's state, at the state's reduced shape
                new_ops, nv = self.splat_at(v, self.type_of(op.results[k]))
                before += new_ops
                operands.append(nv)
            else:
                operands.append(self.vmap[v.id])
        attrs = self.attrs(op)
        new = Op(op.name, operands, [], attrs, [], op.loc)
        new.regions = [Region(self.block(r.block)) for r in op.regions]
        new.results = [self.value(v, new, i) for i, v in enumerate(op.results)]
        return before + [new]

    def attrs(self, op: Op) -> dict:
        attrs = dict(op.attrs)
        name = op.short_name
        if name == "constant":
            value = np.asarray(attrs["value"])
            shape = self.type_of(op.results[0]).shape
            if tuple(shape) != value.shape and op.results[0].id in self.tables:
                # a table proved for any values: its leading block, so that element i of
                # the reduced table and of the real one are the same symbol in both programs
                attrs["value"] = value[tuple(slice(0, n) for n in shape)]
                attrs[TABLE_ATTR] = table_key(value)
            elif tuple(shape) != value.shape:
                # a splat (other tables keep their dimensions: rules.rule_constant)
                attrs["value"] = np.broadcast_to(value.reshape(-1)[:1].reshape(()), shape)
        elif name == "slice":
            x = op.operands[0]
            starts, limits = [], []
            out = self.type_of(op.results[0]).shape
            strides = attrs.get("strides") or (1,) * len(out)
            for a, (s, st) in enumerate(zip(attrs["start_indices"], strides, strict=True)):
                s2 = self.at(x.id, a, s)
                starts.append(s2)
                limits.append(s2 + (out[a] - 1) * st + 1 if out[a] else s2)
            attrs["start_indices"], attrs["limit_indices"] = tuple(starts), tuple(limits)
        elif name == "pad":
            x = op.operands[0]
            for key in ("edge_padding_low", "edge_padding_high"):
                attrs[key] = tuple(self.at(x.id, a, p) for a, p in enumerate(attrs[key]))
        elif name == "dynamic_slice":
            attrs["slice_sizes"] = tuple(self.type_of(op.results[0]).shape)
        elif name == "reduce_window":
            attrs.update(self.cumulative_windows(op))
        elif name == "convolution":
            attrs.update(self.group_counts(op))
            attrs.update(self.outer_padding(op))
        elif name == "gather":  # a dimension taken whole stays whole (rules.rule_gather)
            x = op.operands[0]
            reduced = self.type_of(x).shape
            attrs["slice_sizes"] = tuple(
                reduced[a] if size == n else size
                for a, (size, n) in enumerate(zip(attrs["slice_sizes"], x.type.shape, strict=True))
            )
        return attrs

    def cumulative_windows(self, op: Op) -> dict:
        """A reduce_window's window and padding at the reduced size of its dimensions that
        fold the whole dimension (`windows.cumulative`, `windows.whole_window`)."""
        x = op.operands[0]
        rank = len(x.type.shape)
        cum = [a for a in range(rank) if cumulative(op, a)]
        whole = [a for a in range(rank) if whole_window(op, a)]
        if not cum and not whole:
            return {}
        reduced = self.type_of(x).shape
        window = list(op.attrs["window_dimensions"])
        pads = window_pads(op).copy()
        for a in cum:
            window[a] = reduced[a]
            pads[a] = (reduced[a] - 1, 0) if pads[a, 0] else (0, reduced[a] - 1)
        for a in whole:
            window[a] = self.at(x.id, a, window[a])
            pads[a] = [self.at(x.id, a, int(p)) for p in pads[a]]
        out = {"window_dimensions": tuple(window)}
        padding = op.attrs.get("padding")
        if padding is not None:
            padding = np.asarray(padding)
            out["padding"] = pads.reshape(padding.shape).astype(padding.dtype)
        elif pads.any():
            raise AssertionError(f"reduce_window at {op.loc}: padding from none")
        return out

    def group_counts(self, op: Op) -> dict:
        """A convolution's group counts at the reduced sizes: the groups are a class of their
        own (`convolution.py`), so the count is reduced input features / reduced features per
        group (batch groups: reduced input batch / reduced output batch)."""
        dn = op.attrs.get("dimension_numbers")
        if dn is None:
            return {}
        lhs, rhs, r = (
            self.type_of(v).shape for v in (op.operands[0], op.operands[1], op.results[0])
        )
        out = {}
        if op.attrs.get("feature_group_count", 1) > 1:
            out["feature_group_count"] = lhs[dn.input_feature] // rhs[dn.kernel_input_feature]
        if op.attrs.get("batch_group_count", 1) > 1:
            out["batch_group_count"] = lhs[dn.input_batch] // r[dn.output_batch]
        return out

    def outer_padding(self, op: Op) -> dict:
        """A convolution's padding where one input position meets a window padded by its
        size less one on both sides (`convolution.py`): the reduced window's size less one."""
        dn, padding = op.attrs.get("dimension_numbers"), op.attrs.get("padding")
        if dn is None or padding is None:
            return {}
        lhs, rhs = op.operands[0].type.shape, op.operands[1].type.shape
        reduced = self.type_of(op.operands[1]).shape
        pads = np.asarray(padding).reshape(len(dn.input_spatial), 2).copy()
        for i, (a, w) in enumerate(zip(dn.input_spatial, dn.kernel_spatial, strict=True)):
            k = rhs[w]
            if lhs[a] == 1 and k > 1 and pads[i, 0] == pads[i, 1] == k - 1:
                pads[i] = reduced[w] - 1
        if np.array_equal(pads.reshape(np.shape(padding)), np.asarray(padding)):
            return {}
        return {"padding": pads.reshape(np.shape(padding)).astype(np.asarray(padding).dtype)}

    def rescaled(self, r: Rescale, v: Value, user: Op) -> tuple[list[Op], Value]:
        """Ops computing r's per-device values at the reduced size, in v's reduced type (at
        its user's shape when the user is elementwise: v may be a shared splat)."""
        root = self.d.find(r.key)
        aff = self.affine.get(root)
        k = self.factor.get(root, 1)
        t = self.operand_type(v, user)
        dt = np.dtype(t.numpy_dtype) if not t.is_float else np.float64
        if aff is not None:  # r.values are the distinct values (r.which: each device's)
            vals = [aff.at(x + r.bias) - r.bias for x in r.values]
        else:
            vals = [(x + r.bias) // k - r.bias for x in r.values]
        loc = r.op.loc
        if all(x == vals[0] for x in vals):
            return self.splat(np.asarray(vals[0], dtype=dt), t, loc)
        if len(r.which) != self.num_partitions:
            raise AssertionError("per-device offsets across replicas")
        mapped = self.vmap.get(v.id)
        exact = aff is None and all((x + r.bias) % k == 0 for x in r.values)
        if mapped is not None and mapped.type == t and exact:
            # (v + bias) / k - bias, from v itself: exact (k divides v + bias), and a wrong
            # offset stays traceable to the ops that computed it (localisation)
            where = v.owner.loc if v.owner is not None else loc
            ops: list[Op] = []
            x: object = mapped
            for name, c in (("add", r.bias), ("divide", k), ("subtract", r.bias)):
                if (name == "divide" and c == 1) or (name != "divide" and c == 0):
                    continue
                const = _op("stablehlo.constant", [], t, where)
                const.attrs["value"] = np.broadcast_to(np.asarray(c, dtype=dt), t.shape)
                ops += [const, _op(f"stablehlo.{name}", [x, const], t, where)]
                x = ops[-1]
            return ops, ops[-1].results[0]
        table = _op("stablehlo.constant", [], TensorType((len(r.which),), t.dtype), loc)
        table.attrs["value"] = np.array(vals, dtype=dt)[r.which]
        pid = _op("stablehlo.partition_id", [], TensorType((), "ui32"), loc)
        pick = _op("stablehlo.dynamic_slice", [table, pid], TensorType((1,), t.dtype), loc)
        pick.attrs["slice_sizes"] = (1,)
        scalar = _op("stablehlo.reshape", [pick], TensorType((), t.dtype), loc)
        ops = [table, pid, pick, scalar]
        if t.shape:
            wide = _op("stablehlo.broadcast_in_dim", [scalar], t, loc)
            wide.attrs["broadcast_dimensions"] = ()
            ops.append(wide)
        return ops, ops[-1].results[0]

    def operand_type(self, v: Value, user: Op):
        """v's reduced type where `user` reads it: an elementwise user's own shape (v may be a
        splat shared, through CSE, by users of other shapes), else v's own."""
        t = self.type_of(v)
        if user.name in ELEMENTWISE and user.results and isinstance(t, TensorType) and t.shape:
            return TensorType(tuple(self.type_of(user.results[0]).shape), t.dtype)
        return t

    def splat_at(self, v: Value, t: TensorType) -> tuple[list[Op], Value]:
        """Splat `v` at type `t`: itself where its own reduced type is `t`, else its copy at
        `t` in this block (made at the first use). A copy per use would make the reduced
        programs larger than the real ones where the uses' dimensions keep their sizes."""
        own = self.vmap[v.id]
        if own.type == t:
            return [], own
        if (v.id, t) in self.copies:
            return [], self.copies[(v.id, t)]
        ops, copy = self.copy_splat(self.splats[v.id], v, t)
        self.copies[(v.id, t)] = copy
        return ops, copy

    def copy_splat(self, maker: Op, v: Value, t: TensorType) -> tuple[list[Op], Value]:
        """A copy of splat `v` (made by `maker`: a splat constant, a scalar broadcast, or an
        elementwise op of splats) of type `t`."""
        if maker.name == "stablehlo.constant":
            value = np.asarray(maker.attrs["value"]).reshape(-1)[:1].reshape(())
            return self.splat(value, t, maker.loc)
        if maker.name == "stablehlo.broadcast_in_dim":
            src = self.vmap[maker.operands[0].id]
            wide = _op("stablehlo.broadcast_in_dim", [src], t, maker.loc)
            wide.attrs["broadcast_dimensions"] = ()
            return [wide], wide.results[0]
        ops, operands = [], []
        for u in maker.operands:
            if u.id in self.splats and isinstance(u.type, TensorType) and u.type.shape:
                ut = TensorType(t.shape, u.type.dtype)
                more, nu = self.splat_at(u, ut)
                ops += more
                operands.append(nu)
            else:
                operands.append(self.vmap[u.id])
        new = Op(maker.name, operands, [], dict(maker.attrs), [], maker.loc)
        new.results = [Value(t, None, new, 0)]
        return ops + [new], new.results[0]

    def splat(self, value: np.ndarray, t: TensorType, loc) -> tuple[list[Op], Value]:
        c = _op("stablehlo.constant", [], t, loc)
        c.attrs["value"] = np.broadcast_to(value, t.shape)
        return [c], c.results[0]


def _op(name: str, operands: list, t, loc) -> Op:
    """A new one-result op; operands are ops (their first result) or values."""
    vals = [o.results[0] if isinstance(o, Op) else o for o in operands]
    op = Op(name, vals, [], {}, [], loc)
    op.results = [Value(t, None, op, 0)]
    return op


def scaled_layout(lay: Layout, factors: list) -> Layout:
    """The same tiling of a tensor whose dimension a shrank by factors[a] (an int), or is
    mapped by factors[a] (a function of a size or offset: an affine class)."""
    if all(k == 1 for k in factors):
        return lay
    maps = [k if callable(k) else (lambda n, k=k: n // k) for k in factors]
    # most devices share a box with others (8,192 devices, a few boxes): each distinct box
    # is mapped once, and the devices take theirs by index (`Layout.box_rows`)
    rows, which = lay.box_rows
    mapped = rows.copy()
    for a, m in enumerate(maps):  # each dimension's starts and stops: each value mapped once
        values, at = np.unique(rows[:, a, :], return_inverse=True)
        mapped[:, a, :] = np.array([m(v) for v in values.tolist()], dtype=np.int64)[
            at.reshape(-1, 2)
        ]
    distinct = [tuple(map(tuple, r)) for r in mapped.tolist()]
    out = dataclasses.replace(
        lay,
        global_shape=tuple(m(n) for n, m in zip(lay.global_shape, maps, strict=True)),
        boxes=tuple(map(distinct.__getitem__, which.tolist())),
        tile_shape=tuple(m(n) for n, m in zip(lay.tile_shape, maps, strict=True)),
    )
    out.__dict__["box_rows"] = (mapped, which)
    return out


def inconsistent(m: Module) -> str | None:
    """The first op of `m` whose reduced shapes its meaning forbids (a reshape that changes
    the element count, elementwise operands of other shapes, a dot whose contracted sizes
    differ, a broadcast of a dimension to another size), or None: a reduced program that
    fails this is not used."""
    from tv_ir.ir.program import walk

    for op in walk(m.main.body):
        ins = [v.type for v in op.operands if isinstance(v.type, TensorType)]
        outs = [v.type for v in op.results if isinstance(v.type, TensorType)]
        name = op.name
        if name == "stablehlo.reshape" and ins[0].size != outs[0].size:
            return f"{op} ({ins[0]} -> {outs[0]})"
        if name in ELEMENTWISE and name != "stablehlo.bitcast_convert":
            shapes = {t.shape for t in ins + outs if t.shape}
            if len(shapes) > 1:
                return f"{op} (shapes {sorted(shapes)})"
        if name == "stablehlo.dot_general":
            dn = op.attrs["dot_dimension_numbers"]
            lhs, rhs = ins
            pairs = list(zip(dn.lhs_contract, dn.rhs_contract, strict=True))
            pairs += list(zip(dn.lhs_batch, dn.rhs_batch, strict=True))
            if any(lhs.shape[i] != rhs.shape[j] for i, j in pairs):
                return f"{op} ({lhs} x {rhs})"
        if name == "stablehlo.broadcast_in_dim":
            for i, j in enumerate(op.attrs["broadcast_dimensions"]):
                if ins[0].shape[i] not in (1, outs[0].shape[j]):
                    return f"{op} ({ins[0]} -> {outs[0]})"
        if name == "stablehlo.convolution":
            bad = convolution_mismatch(op, ins[0].shape, ins[1].shape, outs[0].shape)
            if bad:
                return f"{op} ({bad})"
        bad = _window_mismatch(op, ins, outs)
        if bad:
            return f"{op} ({bad})"
    return None


def _window_mismatch(op: Op, ins: list, outs: list) -> str | None:
    """Why a pad's, slice's, concatenation's or dynamic_slice's reduced shapes disagree with
    its attributes (the sizes an affine class maps must still add up), or None."""
    name = op.short_name
    if name == "pad":
        lo, hi = op.attrs["edge_padding_low"], op.attrs["edge_padding_high"]
        inner = op.attrs["interior_padding"]
        for a, (n, m) in enumerate(zip(ins[0].shape, outs[0].shape, strict=True)):
            if lo[a] + hi[a] + n + inner[a] * max(n - 1, 0) != m:
                return f"dim {a}: {lo[a]} + {n} + {hi[a]} padded is not {m}"
    elif name == "slice":
        starts, limits = op.attrs["start_indices"], op.attrs["limit_indices"]
        for a, (s, e, n) in enumerate(zip(starts, limits, ins[0].shape, strict=True)):
            if not 0 <= s <= e <= n:
                return f"dim {a}: [{s}, {e}) is not inside {n}"
    elif name == "concatenate":
        axis = op.attrs["dimension"]
        if sum(t.shape[axis] for t in ins) != outs[0].shape[axis]:
            return f"the pieces along dim {axis} do not add up to {outs[0].shape[axis]}"
    elif name == "dynamic_slice":
        sizes = op.attrs["slice_sizes"]
        if any(k > n for k, n in zip(sizes, ins[0].shape, strict=True)):
            return f"slice sizes {tuple(sizes)} exceed {ins[0].shape}"
    return None


def convolution_mismatch(op: Op, lhs: tuple, rhs: tuple, out: tuple) -> str | None:
    """Why a convolution's operand and result shapes disagree with its attributes (the
    output size of each spatial dimension, the groups dividing what they split), or None."""
    dn = op.attrs.get("dimension_numbers")
    if dn is None:
        return None
    nsp = len(dn.input_spatial)
    strides = op.attrs.get("window_strides") or (1,) * nsp
    padding = op.attrs.get("padding")
    pads = np.zeros((nsp, 2), int) if padding is None else np.asarray(padding).reshape(nsp, 2)
    lhs_dil = op.attrs.get("lhs_dilation") or (1,) * nsp
    rhs_dil = op.attrs.get("rhs_dilation") or (1,) * nsp
    for i in range(nsp):
        n = (lhs[dn.input_spatial[i]] - 1) * lhs_dil[i] + 1 + int(pads[i][0]) + int(pads[i][1])
        span = (rhs[dn.kernel_spatial[i]] - 1) * rhs_dil[i] + 1
        want = max((n - span) // strides[i] + 1, 0)
        if out[dn.output_spatial[i]] != want:
            return f"spatial dim {i}: {out[dn.output_spatial[i]]} outputs, the window gives {want}"
    g = op.attrs.get("feature_group_count", 1)
    b = op.attrs.get("batch_group_count", 1)
    if lhs[dn.input_feature] != g * rhs[dn.kernel_input_feature]:
        return (
            f"{lhs[dn.input_feature]} input features, {g} groups of {rhs[dn.kernel_input_feature]}"
        )
    if lhs[dn.input_batch] != b * out[dn.output_batch]:
        return f"batch {lhs[dn.input_batch]}, {b} batch groups of {out[dn.output_batch]}"
    ko = rhs[dn.kernel_output_feature]
    if ko % (g * b) or out[dn.output_feature] != ko:
        return f"{ko} kernel output features, {out[dn.output_feature]} output features"
    return None
