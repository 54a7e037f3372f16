"""mesh-reduction: prove a shard_map program, or XLA's partitioning of a jit, on a smaller
mesh than its real one.

A shard_map body (or XLA's per-device program) is one program for every device, parametric
in the device's mesh coordinates. `template.read_template` finds where the mesh enters it
(replica groups, permute pairs, `partition_id` arithmetic and tables, the boundary
shardings) as functions of the axis sizes, and what each axis needs: 2 positions, 3 when a
shift or a first/last comparison needs first, interior and last devices; an axis whose
coordinate is used otherwise, or whose collective reshapes tiles or counts devices, keeps
its size. Each axis shrinks to the smallest divisor of its size that it needs; the template
is checked against the real program at the real sizes (`template.mismatches`), then
instantiated at the reduced sizes (`rewrite.reduced_impl`); the spec shrinks along the
dimensions those axes split (`spec_dims.shrink_spec`), every constant of both programs
unchanged. Why a verdict on the
reduced mesh holds on the real one: docs/equivalence.md, "Mesh reduction".
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

import numpy as np

from tv_ir.ir.program import Module

from .body_shapes import BodyShapes
from .rewrite import reduced_impl, remapped, whole_factor
from .spec_dims import shrink_spec
from .template import NO_MESH as NO_MESH
from .template import NOT_A_SHARD_MAP as NOT_A_SHARD_MAP
from .template import (
    Mesh,
    Template,
    axes_layout,
    marked_need,
    mismatches,
    positions,
    read_template,
)

name = "mesh-reduction"
TWO_WAYS = "a dimension gathered two ways"
TIED_CANDIDATES = 400  # meshes tried for axes tied by a dimension split two ways
NOT_DISTRIBUTED = "not a distributed program"


@dataclass
class MeshAxis:
    name: str
    real: int
    reduced: int
    kept: str | None = None

    def __str__(self) -> str:
        if self.kept and self.real > 2:
            return f'"{self.name}": {self.real} kept ({self.kept})'
        return f'"{self.name}": {self.real} -> {self.reduced}'


@dataclass
class MeshReduction:
    """What mesh reduction did: the axes, and the reduced pair (None when nothing shrank)."""

    axes: list[MeshAxis] = field(default_factory=list)
    spec: Module | None = None
    impl: Module | None = None
    failed: str | None = None
    real_mesh: Mesh | None = None
    reduced_mesh: Mesh | None = None
    # the program's own mesh when `real_mesh` reads some of its axes as sub-axes
    coarse: Mesh | None = None
    # per spec argument: for each dimension, the mesh axes (indices) that split it
    arg_axes: list[list[tuple[int, ...]]] = field(default_factory=list)
    # a per-device program's boundary on the reduced mesh (the real layouts' axes there):
    # (argument layouts, result layouts); None for a shard_map program (whole on every device)
    layouts: tuple[list, list] | None = None
    # per axis: the positions inside it the program compares its coordinate with
    marks: dict[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def reduced(self) -> bool:
        return self.impl is not None

    def summary(self) -> str:
        if self.failed:
            return f"mesh reduction: not applied ({self.failed})"
        if not self.reduced:
            head = "mesh reduction: no axis shrank"
        else:
            head = (
                f"mesh reduction: {self.real_mesh.devices:,} -> {self.reduced_mesh.devices:,} "
                "devices"
            )
        return "\n".join([head] + ["  " + str(a) for a in self.axes])

    def to_json(self) -> dict:
        return {
            "reduced": self.reduced,
            "failed": self.failed,
            "summary": self.summary(),
            "devices": [
                self.real_mesh.devices if self.real_mesh else None,
                self.reduced_mesh.devices if self.reduced_mesh else None,
            ],
            "axes": [dataclasses.asdict(a) for a in self.axes],
        }

    def blown_up(self, x, axes: list[tuple[int, ...]]):
        """An argument of the reduced spec at its real size: each real device's block is
        the block of the reduced device standing for it (first for first, last for last, a
        marked position for itself, the others one of their run)."""
        stands: dict[int, list[int]] = {}

        def stand(a: int, k: int) -> int:
            if a not in stands:
                stands[a] = self._reduced_positions(a)
            return stands[a][k]

        return self._recut(x, axes, self.reduced_mesh, self.real_mesh, stand)

    def _recut(self, x, axes: list[tuple[int, ...]], source: Mesh, target: Mesh, stand):
        """`x` with each dimension split over mesh axes `axes` cut into `target`'s blocks
        from `source`'s: the block at coordinate k along axis a is source's block at
        `stand(a, k)`."""
        import numpy as np

        x = np.asarray(x)
        for dim, ax in enumerate(axes):
            if not ax or all(self.real_mesh.sizes[a] == self.reduced_mesh.sizes[a] for a in ax):
                continue
            src = [source.sizes[a] for a in ax]
            tile = x.shape[dim] // int(np.prod(src))
            blocks = []
            for coords in np.ndindex(*[target.sizes[a] for a in ax]):
                c = [stand(a, k) for a, k in zip(ax, coords, strict=True)]
                b = int(np.ravel_multi_index(c, src))
                blocks.append(np.take(x, range(b * tile, (b + 1) * tile), axis=dim))
            x = np.concatenate(blocks, axis=dim)
        return x

    def real_device(self, device: int) -> tuple[int, dict[str, int]]:
        """The real device a device of the reduced mesh stands for, and its coordinates: the
        first positions of each axis stand for the first, the last for the last."""
        coords = self.reduced_mesh.coords(device)
        device = self.real_mesh.device([self._real_position(a, c) for a, c in enumerate(coords)])
        named = self.coarse or self.real_mesh
        return device, dict(zip(named.names, named.coords(device), strict=True))

    def _real_position(self, axis: int, c: int) -> int:
        """The real coordinate reduced coordinate `c` along `axis` stands for."""
        r, n = self.reduced_mesh.sizes[axis], self.real_mesh.sizes[axis]
        if axis in self.marks:
            return positions(n, r, self.marks[axis])[c]
        return c if 2 * c < r else n - (r - c)

    def picked(self, x, axes: list[tuple[int, ...]]):
        """An argument of the spec at its real size cut to the reduced mesh: each reduced
        device's block is the block of the real device it stands for (`blown_up`'s
        inverse on what it makes)."""
        return self._recut(x, axes, self.real_mesh, self.reduced_mesh, self._real_position)

    def real_devices(self, devices) -> list[int]:
        """Every real device one of `devices` (of the reduced mesh) stands for: the runs of
        real positions each reduced position stands for, along every axis."""
        stands = np.ix_(
            *(np.asarray(self._reduced_positions(a)) for a in range(len(self.real_mesh.sizes)))
        )
        reduced = np.ravel_multi_index(stands, self.reduced_mesh.sizes).reshape(-1)
        return np.flatnonzero(np.isin(reduced, list(devices))).tolist()

    def _reduced_positions(self, axis: int) -> list[int]:
        """For each real coordinate along `axis`, the reduced coordinate standing for it."""
        r, n = self.reduced_mesh.sizes[axis], self.real_mesh.sizes[axis]
        if axis not in self.marks:
            return [_representative(c, r, n) for c in range(n)]
        # a marked or end position stands for itself, any other for one of its run: the
        # last reduced position at or before it
        stands = positions(n, r, self.marks[axis])
        return (np.searchsorted(stands, np.arange(n), side="right") - 1).tolist()


def _representative(c: int, r: int, n: int) -> int:
    """The reduced coordinate (of r) standing for real coordinate c (of n)."""
    first = (r + 1) // 2  # reduced coordinates that stand for the first real ones
    if c < first:
        return c
    if c >= n - (r - first):
        return r - (n - c)
    return first - 1


def smallest_divisor_at_least(n: int, need: int) -> int:
    for r in range(min(need, n), n + 1):
        if n % r == 0:
            return r
    return n


def plan_sizes(t: Template) -> tuple[int, ...]:
    sizes = []
    for axis, n in enumerate(t.mesh.sizes):
        if axis in t.kept:
            sizes.append(n)
        else:
            sizes.append(smallest_divisor_at_least(n, t.needs.get(axis, 2)))
    return tuple(sizes)


def reduce_mesh(spec: Module, impl: Module, placement, sizes=None) -> MeshReduction:
    """The pair on the smallest mesh that keeps the impl's structure (or on `sizes`, the
    axis sizes a previous call chose, so the real pair and its reduced shapes match). The
    reduced impl runs on `reduced_mesh.devices` devices, its arguments whole on each."""
    out = MeshReduction()
    if placement is None or not placement.distributed:
        out.failed = NOT_DISTRIBUTED
        return out
    t = read_template(impl, placement)
    if t.failed:
        out.failed = t.failed
        return out
    layouts = list(placement.args) + list(placement.results)
    if any(len(lay.boxes) != placement.num_devices for lay in layouts):
        out.failed = "a boundary layout is not over every device"
        return out
    if t.manual is not None and (
        placement.num_devices != t.mesh.devices
        or any(lay.tile_shape != lay.global_shape for lay in layouts)
    ):
        out.failed = "the shard_map's arguments are not whole on every device"
        return out
    bad = mismatches(t)
    if bad:
        out.failed = f"the template at the real sizes differs from the program at {bad[0]}"
        return out
    out.real_mesh = t.mesh
    out.coarse = t.coarse
    out.arg_axes = t.arg_axes
    out.marks = {a: tuple(sorted(m)) for a, m in t.marks.items()}
    kept = dict(t.kept)
    body = None
    for _ in range(len(t.mesh.sizes) + 1):
        if sizes is not None:
            target = tuple(sizes)
            short = [
                a
                for a, marks in t.marks.items()
                if t.mesh.sizes[a] > target[a] < marked_need(t.mesh.sizes[a], tuple(marks))
            ]
            if short:
                name = t.mesh.names[short[0]]
                out.failed = f'"{name}" is too small there for its marked positions'
                break
        else:
            t.kept = kept
            target = plan_sizes(t)
        reduced = t.mesh.resized(target)
        if reduced.devices == t.mesh.devices:
            break
        shaped = [a for a in t.shaped if target[a] < t.mesh.sizes[a]]
        body_impl, sites, arg_axes, result_axes = impl, t, t.arg_axes, t.result_axes
        if shaped:  # the body's shapes follow these axes: rescaled with them, or kept
            if body is None:
                body = BodyShapes(impl, t)
            factor, why = body.factors(reduced)
            if factor is None and sizes is None and TWO_WAYS in why:
                # a dimension split over two sets of axes: shrink them by the same factor
                tied = _tied_sizes(body, t, target)
                if tied is not None:
                    sizes_now = zip(t.mesh.sizes, target, tied, strict=True)
                    for a, (n, was, now) in enumerate(sizes_now):
                        if now == n > was:
                            kept.setdefault(a, f"{why}, with axes that cannot shrink as far")
                    target, reduced = tied, t.mesh.resized(tied)
                    shaped = [a for a in t.shaped if target[a] < t.mesh.sizes[a]]
            found = _rescaled(body, t, reduced)
            if isinstance(found, str):
                if sizes is not None:
                    out.failed = f"the body cannot be rescaled on that mesh: {found}"
                    break
                for a in shaped:
                    kept.setdefault(a, f"{t.shaped[a]}; {found}")
                continue
            body_impl, sites, arg_axes, result_axes = found
        wanted = {}
        for values, axes_list in (
            (spec.main.args, arg_axes),
            (spec.main.body.results, result_axes),
        ):
            for v, axes in zip(values, axes_list, strict=True):
                for a, ax in enumerate(axes):
                    f = whole_factor(ax, t.mesh, reduced)
                    if f > 1:
                        shards = whole_factor(ax, t.mesh, t.mesh.resized([1] * len(target)))
                        wanted[(v, a)] = (f, shards)
        small_spec, failed = shrink_spec(spec, wanted)
        if small_spec is not None:
            small_impl = reduced_impl(body_impl, sites, reduced, reshaped=bool(shaped))
            layouts = None
            if t.manual is None:
                layouts, differs = _per_device_layouts(
                    small_spec, small_impl, arg_axes, result_axes, reduced
                )
            else:
                differs = _signature_difference(small_spec, small_impl)
            if differs:  # a spec dimension tied to a split one, which the impl holds whole
                out.failed = f"the spec and the implementation shrink differently: {differs}"
                break
            out.spec = small_spec
            out.impl = small_impl
            out.layouts = layouts
            out.reduced_mesh = reduced
            break
        if sizes is not None:
            out.failed = f"the spec cannot shrink on that mesh: {next(iter(failed.values()))}"
            break
        # axes a body's tiles add to the shard_map's split of a dimension (FSDP parts of a
        # rank's heads) keep their sizes first: the splits' own axes may shrink without them
        shrinking = {}
        added = set()
        for (v, a), why in failed.items():
            axes = [
                x
                for x in _axes_of(v, a, spec, arg_axes, result_axes)
                if target[x] < t.mesh.sizes[x]
            ]
            split = set(_axes_of(v, a, spec, t.arg_axes, t.result_axes))
            added.update(x for x in axes if x not in split)
            for axis in axes:
                shrinking.setdefault(axis, why)
        for axis, why in shrinking.items():
            if not added or axis in added:
                kept.setdefault(axis, f"splits a spec dimension that cannot shrink: {why}")
    t.kept = kept
    final = out.reduced_mesh or t.mesh
    for axis, n in enumerate(t.mesh.sizes):  # an axis that needs all of its devices
        if final.sizes[axis] == n > 2 and axis not in kept and axis in t.needs_why:
            need = t.needs[axis]
            short = f" ({n} has no smaller divisor that large)" if need < n else ""
            kept[axis] = t.needs_why[axis] + short
    out.axes = [
        MeshAxis(n, real, red, kept.get(axis))
        for axis, (n, real, red) in enumerate(
            zip(t.mesh.names, t.mesh.sizes, final.sizes, strict=True)
        )
    ]
    return out


def _signature_difference(spec: Module, impl: Module) -> str:
    """The first argument or result whose global type differs between the reduced spec and
    the reduced implementation ("" when none)."""
    for what, s_types, i_types in (
        ("argument", spec.main.arg_types, impl.main.arg_types),
        ("result", spec.main.result_types, impl.main.result_types),
    ):
        for k, (a, b) in enumerate(zip(s_types, i_types, strict=False)):
            if a != b:
                return f"{what} {k} is {a} in the spec but {b} in the implementation"
    return ""


def _per_device_layouts(spec: Module, impl: Module, arg_axes, result_axes, mesh: Mesh):
    """((argument layouts, result layouts) of a per-device program on the reduced `mesh`, "")
    or (None, the first argument or result whose tile there is not the program's)."""
    layouts = []
    for what, types, tiles, axes_list in (
        ("argument", spec.main.arg_types, impl.main.arg_types, arg_axes),
        ("result", spec.main.result_types, impl.main.result_types, result_axes),
    ):
        layouts.append([])
        for k, (whole, tile, axes) in enumerate(zip(types, tiles, axes_list, strict=True)):
            lay = axes_layout(axes, mesh, whole.shape)
            if tuple(lay.tile_shape) != tuple(tile.shape):
                return None, (
                    f"{what} {k}: its tile on the reduced mesh is {list(lay.tile_shape)}, "
                    f"the program's is {list(tile.shape)}"
                )
            layouts[-1].append(lay)
    return (layouts[0], layouts[1]), ""


def _tied_sizes(body: BodyShapes, t: Template, planned: tuple[int, ...]):
    """The smallest mesh, no axis below its planned size, on which every dimension of the
    body shrinks by one factor however it is split over axes (data x tile in one op, model
    x tile in another: "data" and "model" shrink by the same factor), or None."""
    choices = []
    for axis, (n, low) in enumerate(zip(t.mesh.sizes, planned, strict=True)):
        if axis in t.kept or low >= n:
            choices.append([n])
        else:
            choices.append([d for d in range(low, n + 1) if n % d == 0])
    candidates = sorted(itertools.product(*choices), key=lambda c: (int(np.prod(c)), c))
    for sizes in candidates[:TIED_CANDIDATES]:
        if int(np.prod(sizes)) >= t.mesh.devices:
            break
        if body.factors(t.mesh.resized(sizes))[0] is not None:
            return tuple(sizes)
    return None


def _rescaled(body: BodyShapes, t: Template, reduced: Mesh):
    """(the impl with its body's shapes on `reduced`, its template's sites there, the axes
    of each argument's and result's dimensions), or why the body cannot be rescaled."""
    factor, why = body.factors(reduced)
    if factor is None:
        return why
    rescaled, why, vmap = body.rewrite(factor)
    if rescaled is None:
        return why
    main = body.impl.main

    def real(axes: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(a for a in axes if t.mesh.sizes[a] > 1)

    if t.manual is None:  # a per-device program: its boundary is tiles, split as before
        return rescaled, remapped(t, vmap), t.arg_axes, t.result_axes
    found = []
    for values, boundary in ((main.args, t.arg_axes), (main.body.results, t.result_axes)):
        found.append([])
        for v, split in zip(values, boundary, strict=True):
            got = body.axes_of(v)
            if any(not _within(real(b), real(g)) for g, b in zip(got, split, strict=True)):
                return "the body's devices parts disagree with the shard_map's shardings"
            found[-1].append([g if real(g) else b for g, b in zip(got, split, strict=True)])
    return rescaled, remapped(t, vmap), found[0], found[1]


def _within(split: tuple[int, ...], parts: tuple[int, ...]) -> bool:
    """Whether a dimension the shard_map splits over `split` can be the body's `parts`
    (major first): the same axes, or the split's axes first and then axes that make up each
    device's tile (an FSDP shard all-gathered inside the body: the tile of a weight split
    over "model" is itself "fsdp" parts of the shard another weight holds)."""
    return parts[: len(split)] == split


def _axes_of(v, a: int, spec: Module, arg_axes, result_axes) -> tuple[int, ...]:
    for values, axes_list in (
        (spec.main.args, arg_axes),
        (spec.main.body.results, result_axes),
    ):
        for w, axes in zip(values, axes_list, strict=True):
            if w is v:
                return axes[a]
    return ()
