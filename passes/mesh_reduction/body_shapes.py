"""The shard_map body's shapes on a smaller mesh, where they follow the axis sizes.

An `all_gather` over axes S makes a dimension of |S| tiles, a `reduce_scatter` splits one
into |S|, and a tile sliced at `coordinate x tile` comes from a dimension of `size x tile`:
on a mesh where S is smaller those dimensions are smaller, and so is everything computed
from them (the attention over a gathered sequence). The body's dimensions are grouped into
classes by shape reduction's rules (passes/shape_reduction/rules.py), except that such a
dimension is the *product* of a devices part (one per mesh axis) and its tile, as a global
dimension split over axes is at the shard_map's boundary. The devices parts shrink by their
axes' real / reduced sizes, nothing else does: tiles keep their sizes, constants their
values (a mean's `1/N` included, as everywhere in mesh reduction). What the rewrite cannot
read as that family is refused, and the axes keep their sizes: a devices part tied to
another axis's or to a class some op keeps (a window, a table), an offset inside a
shrinking dimension (a slice at one tile from the end is no longer the same tile), an offset
that differs per device, a count computed from a size.
"""

from __future__ import annotations

from tv_ir.passes.shape_reduction.classes import DimClasses, Key
from tv_ir.passes.shape_reduction.factors import _products, _value
from tv_ir.passes.shape_reduction.rewrite import Rewriter, inconsistent
from tv_ir.passes.shape_reduction.rules import ShapeRules

from tv_ir.ir.program import Module, Op, TensorType, Value

from .template import GATHERING, Mesh, Template, axes_size


class BodyShapes:
    """The body's classes on the real mesh, with devices parts (read once per program)."""

    def __init__(self, impl: Module, t: Template):
        self.t = t
        self.d = DimClasses()
        self.rules = _MeshRules(self.d, impl, t)
        self.rules.run(impl.main)
        self.impl = impl
        self.classes = self.d.classes()
        self.defs, self.pinned = _products(self.d)
        # plain classes whose factor a merged dimension gives them on the last mesh asked
        # for (`_through_merges`): the axes whose devices parts they stand in for
        self.derived: dict[Key, tuple[int, ...]] = {}

    def axes_of(self, v: Value) -> list[tuple[int, ...]]:
        """For each dimension of v, the axes whose devices parts make it up (major first)."""
        return [tuple(self._axes(self.d.find(k))) for k in self.rules.keys(v)]

    def _axes(self, root: Key, seen=frozenset()) -> list[int]:
        if root in seen:
            return []
        if root not in self.defs:
            if root in self.derived:
                return list(self.derived[root])
            axes = [_axis_of(k) for k in self.classes[root] if _axis_of(k) is not None]
            return axes[:1]
        out: list[int] = []
        for p in self.defs[root][0]:
            out += self._axes(p, seen | {root})
        return out

    def factors(self, reduced: Mesh) -> tuple[dict[Key, int] | None, str]:
        """Every class's factor on `reduced`, or (None, why not)."""
        d, real = self.d, self.t.mesh
        if self.rules.pos.counts:
            n, where = self.rules.pos.counts[0]
            return None, f"the body computes a count ({n}) from a size at {where}"
        classes, defs, pinned = self.classes, self.defs, self.pinned
        factor: dict[Key, int] = {}
        for root, members in classes.items():
            if root in defs:
                continue
            axes = {_axis_of(k) for k in members} - {None}
            if len(axes) > 1:
                return None, "the devices of two axes are tied in one dimension"
            f = 1
            if axes:
                a = axes.pop()
                f = real.sizes[a] // reduced.sizes[a]
            if f > 1:
                why = d.reason_kept(members) or d.reason_uneven(members)
                if why or root in pinned:
                    return (
                        None,
                        why
                        or f"a gathered dimension tied to its own tile ({_name(d, root, members)})",
                    )
            factor[root] = f
        self._through_merges(factor)
        for whole in defs:
            values = _value(defs, factor, whole)
            own = {_axis_of(k) for k in classes[whole]} - {None}
            if len(values) != 1 or own:
                return None, f"a dimension gathered two ways ({_name(d, whole, classes[whole])})"
            f = values.pop()
            if f > 1:
                why = d.reason_kept(classes[whole]) or d.reason_uneven(classes[whole])
                if why:
                    return None, why
            factor[whole] = f
        for key, offsets in d.offsets.items():
            if factor.get(d.find(key), 1) > 1 and any(o not in (0, d.real[key]) for o in offsets):
                return None, f"the body offsets a gathered dimension ({d.names.get(key, '?')})"
        for r in self.rules.pos.rescales:
            if factor.get(d.find(r.key), 1) > 1:
                return None, f"the body offsets a gathered dimension at {r.op.loc}"
        return factor, ""

    def _through_merges(self, factor: dict[Key, int]) -> None:
        """A merged dimension made both of devices parts (an FSDP shard all-gathered) and of
        plain classes (the heads x head_dim an attention output reshapes to): the plain
        way's major-most part stands in for the devices parts and shrinks with them (FSDP
        over "fsdp" of the heads a "model" rank holds: fewer "fsdp" devices, fewer heads per
        rank, as JAX lowers it on that mesh). Only a part that nothing else sizes: no axis of
        its own, not kept, not pinned, not merged, dividing evenly; else the definitions
        still disagree and `factors` refuses the mesh."""
        defs = self.defs
        self.derived = {}
        for _ in range(len(defs) + 1):
            changed = False
            for ways in defs.values():
                values = [_way_value(defs, factor, parts) for parts in ways]
                shrunk = {v for v in values if v is not None and v > 1}
                if len(shrunk) != 1 or None in values:
                    continue
                target = shrunk.pop()
                axes = next(
                    tuple(self._way_axes(parts))
                    for parts, v in zip(ways, values, strict=True)
                    if v == target
                )
                for parts, v in zip(ways, values, strict=True):
                    if v != 1:  # shrinking by the determining way's axes alone, or not at all
                        continue
                    trial, named = dict(factor), dict(self.derived)
                    if self._assign(parts, target, axes, trial, named):
                        factor.update(trial)
                        self.derived = named
                        changed = True
            if not changed:
                return

    def _assign(self, parts, target: int, axes, factor: dict, named: dict, depth: int = 0) -> bool:
        """Make the definition `parts` give `target` by its major-most plain part (through
        every definition of a merged major), on `factor` and `named`; False when a part it
        would take is not free (the caller then drops both)."""
        d, defs, classes = self.d, self.defs, self.classes
        if not parts or depth > len(defs):
            return False
        rest = _way_value(defs, factor, parts[1:])
        if rest is None or target % rest:
            return False
        need, major = target // rest, parts[0]
        if major in defs:
            return all(
                _way_value(defs, factor, way) == need
                or self._assign(way, need, axes, factor, named, depth + 1)
                for way in defs[major]
            )
        have = factor.get(major, 1)
        if have == need:
            return True
        members = classes.get(major, [])
        free = (
            have == 1
            and major not in self.pinned
            and not any(_axis_of(k) is not None for k in members)
            and not d.reason_kept(members)
            and not d.reason_uneven(members)
            and d.real[major] % need == 0
        )
        if free:
            factor[major] = need
            named[major] = axes
        return free

    def _way_axes(self, parts: tuple[Key, ...]) -> list[int]:
        out: list[int] = []
        for p in parts:
            out += self._axes(p)
        return out

    def rewrite(self, factor: dict[Key, int]) -> tuple[Module | None, str, dict]:
        """The impl with the body's shapes at `factor` (sites still at the real sizes), and
        each value's copy (by the original's id)."""
        rw = Rewriter(self.d, factor, [], self.t.mesh.devices, {}, self.rules.pos.splats, {})
        out = rw.module(self.impl)
        bad = inconsistent(out)
        if bad is not None:
            return None, f"the rescaled body is inconsistent at {bad}", {}
        return out, "", rw.vmap


# the first element of the keys of an all_to_all's blocks (no value's id, no axis's)
BLOCK = 1 << 40


def _way_value(defs, factor: dict, parts: tuple[Key, ...]) -> int | None:
    """The factor one definition of a merged dimension gives it (None: its parts disagree)."""
    out = 1
    for p in parts:
        values = _value(defs, factor, p)
        if len(values) != 1:
            return None
        out *= values.pop()
    return out


def _name(d: DimClasses, root: Key, members) -> str:
    """Where a class's dimension is, for a reason the report gives."""
    return d.names.get(root) or next((d.names[k] for k in members if k in d.names), "?")


def _axis_of(key: Key) -> int | None:
    """The mesh axis of a devices part's key (their value ids are negative)."""
    return -1 - key[0] if key[0] < 0 else None


class _MeshRules(ShapeRules):
    """Shape reduction's rules on the implementation, with the dimensions the mesh axes make
    up (boundary splits, gathers, tiles sliced at coordinate x tile) read as products of
    devices parts and tiles rather than tied to their tiles."""

    def __init__(self, d: DimClasses, impl: Module, t: Template):
        super().__init__(d, impl, "impl", t.mesh.devices, 1, False)
        self.t = t
        self._parts = 0
        self._blocks = 0

    def part(self, axis: int) -> Key:
        self._parts += 1
        key = self.d.add((-1 - axis, self._parts), self.t.mesh.sizes[axis], "devices")
        self.d.tie(key, self.d.add((-1 - axis, 0), self.t.mesh.sizes[axis], "devices"))
        return key

    def product(self, whole: Key, tile: Key, axes: tuple[int, ...]) -> None:
        self.d.product(whole, tuple(self.part(a) for a in axes) + (tile,))

    def shard_boundary(self, whole: Value, local: Value, sharding) -> None:
        """A dimension the sharding splits is the product of its axes' devices parts and the
        tile; the others are tied."""
        if not isinstance(whole.type, TensorType):
            return
        index = {n: i for i, n in enumerate(self.t.mesh.names)}
        kw, kl = self.keys(whole), self.keys(local)
        dims = getattr(sharding, "dims", None) or [()] * len(kw)
        for a, (w, loc, dim) in enumerate(zip(kw, kl, dims, strict=True)):
            if whole.type.shape[a] == local.type.shape[a]:
                self.d.tie(w, loc)
            else:
                self.product(w, loc, tuple(index[ax.name] for ax in dim))

    def _gather(self, op: Op) -> bool:
        axes = self.t.gathers.get(id(op))
        if axes is None:
            return False
        x, r = op.operands[0], op.results[0]
        dim = op.attrs[GATHERING[op.name]]
        kx, kr = self.keys(x), self.keys(r)
        small, big = (kx, kr) if op.name == "stablehlo.all_gather" else (kr, kx)
        for a, (s, b) in enumerate(zip(small, big, strict=True)):
            if a == dim:
                self.product(b, s, axes)
            else:
                self.d.tie(s, b)
        self.carry(x, r)
        return True

    def rule_all_gather(self, op: Op) -> None:
        if not self._gather(op):
            super().rule_all_gather(op)

    def rule_reduce_scatter(self, op: Op) -> None:
        if not self._gather(op):
            super().rule_reduce_scatter(op)

    def rule_all_to_all(self, op: Op) -> None:
        """An exchange over axes S: the operand's split dimension is S's devices parts times
        the result's, the result's concatenated one S's parts times the operand's."""
        axes = self.t.gathers.get(id(op))
        if axes is None:
            return super().rule_all_to_all(op)
        x, r = op.operands[0], op.results[0]
        split, concat = op.attrs["split_dimension"], op.attrs["concat_dimension"]
        kx, kr = self.keys(x), self.keys(r)
        for a, (s, b) in enumerate(zip(kx, kr, strict=True)):
            if a == split == concat:  # one block per member: the dimension is parts x block
                self.d.tie(s, b)
                size = x.type.shape[a] // axes_size(self.t.mesh, axes)
                self._blocks += 1
                block = self.d.add((BLOCK, self._blocks), size, f"all_to_all block at {op.loc}")
                self.product(s, block, axes)
            elif a == split:
                self.product(s, b, axes)
            elif a == concat:
                self.product(b, s, axes)
            else:
                self.d.tie(s, b)
        self.carry(x, r)

    def _tiles(self, op: Op, x: Value, tile: Value, first_start: int) -> bool:
        starts = self.t.tile_starts.get(id(op))
        if starts is None:
            return False
        kx, kt = self.keys(x), self.keys(tile)
        for a in range(len(kx)):
            if a in starts:
                self.product(kx[a], kt[a], starts[a])
                continue
            self.d.tie(kx[a], kt[a])
            if tile.type.shape[a] != x.type.shape[a]:
                self.in_units(op, first_start + a, kx[a])
        return True

    def rule_dynamic_slice(self, op: Op) -> None:
        if self._tiles(op, op.operands[0], op.results[0], 1):
            self.untrack(op.operands[0], f"dynamic_slice at {op.loc}")
            return
        super().rule_dynamic_slice(op)

    def rule_dynamic_update_slice(self, op: Op) -> None:
        x, u, r = op.operands[0], op.operands[1], op.results[0]
        if self._tiles(op, x, u, 2):
            self.tie_all(x, r)
            for v in (x, u):
                self.untrack(v, f"dynamic_update_slice at {op.loc}")
            return
        super().rule_dynamic_update_slice(op)
