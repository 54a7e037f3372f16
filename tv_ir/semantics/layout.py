"""How a logical tensor lives on a device mesh: one `Layout` for mhlo.sharding and sdy.sharding.

Devices are partition ids: indices into the program's device assignment (what `partition_id`
returns in a per-device program; position p in `jax.sharding.Mesh.devices.flat`, not `Device.id`).

- `boxes[d]`: the in-bounds index box device d holds, ((start, stop), ...) per dimension. As in
  XLA, a dimension of size n split k ways has ceil(n/k)-sized shards, the last ones shorter or
  empty; device buffers are padded up to `tile_shape`, the padding is no part of the value.
- Devices with the same box hold copies of it (replication).
- `unreduced`: groups of devices. Members of a group hold the same box and partial sums: the
  logical value on the box is the SUM of the members' values. Two groups with the same box are
  replicas (their sums agree).
- `manual`: groups of devices, one per manual instance. Each instance is its own value of
  `global_shape`, laid out over its members by `boxes`; instances are unrelated. `{manual}`: every
  device is an instance holding the whole (per-device) tensor.
- `maximal`: the value lives on that device only (other devices' buffers are meaningless).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

import numpy as np

from tv_ir.errors import BadInput, Unsupported
from tv_ir.ir.attrs import SdyAxis, SdyMesh, SdySharding

Box = tuple[tuple[int, int], ...]
Shape = tuple[int, ...]
# per device: (tile index per dim, manual instance key, partial-sum group key); keys None = none
_Cell = tuple[tuple[int, ...], Hashable | None, Hashable | None]


@dataclass(frozen=True)
class Layout:
    """Where each device's piece of a logical tensor comes from (see the module docstring)."""

    global_shape: Shape
    num_devices: int
    boxes: tuple[Box, ...]
    tile_shape: Shape
    unreduced: tuple[tuple[int, ...], ...] = ()
    manual: tuple[tuple[int, ...], ...] = ()
    maximal: int | None = None
    desc: str = field(default="", compare=False)

    # -- constructors ----------------------------------------------------------------------

    @classmethod
    def replicated(cls, global_shape: Any, num_devices: int) -> Layout:
        """Every device holds the whole tensor."""
        return _whole(_shape(global_shape), num_devices, "{replicated}")

    @classmethod
    def from_hlo_sharding(
        cls, text: str, global_shape: Any, num_devices: int | None = None
    ) -> Layout | list[Layout]:
        """Parse an `mhlo.sharding` string with XLA's parser; a list for tuple shardings.

        `global_shape` is a shape (or TensorType), or a list of them for a tuple-typed value.
        `num_devices` defaults to the tile assignment's device count (needed for
        replicated, manual, unreduced and maximal shardings).
        """
        if _is_shape_list(global_shape):
            return _parsed_hlo_layout(text, global_shape, num_devices)
        return _hlo_layout(text, _shape(global_shape), num_devices)

    @classmethod
    def from_sdy(
        cls,
        sharding: SdySharding,
        mesh: SdyMesh | Mapping[str, SdyMesh] | None,
        global_shape: Any,
        num_devices: int | None = None,
        manual_axes: Sequence[str] = (),
    ) -> Layout:
        """A Shardy sharding over `mesh` (or the mesh it names in a name -> mesh mapping).

        With `manual_axes` (inside `sdy.manual_computation`), `global_shape` is the per-instance
        shape; manual axes are dropped from the dimensions and group devices into instances.
        """
        return _from_sdy(sharding, mesh, _shape(global_shape), num_devices, tuple(manual_axes))

    # -- queries -----------------------------------------------------------------------------

    def box(self, device: int) -> Box:
        return self.boxes[device]

    def local_shape(self, device: int) -> Shape:
        """The in-bounds shape device `device` holds (smaller than `tile_shape` at ragged ends)."""
        return tuple(b - a for a, b in self.boxes[device])

    @property
    def holders(self) -> tuple[int, ...]:
        """Devices whose values are meaningful (all, except for maximal layouts)."""
        if self.maximal is not None:
            return (self.maximal,)
        return tuple(range(self.num_devices))

    @property
    def is_replicated(self) -> bool:
        full = tuple((0, n) for n in self.global_shape)
        return (
            not self.unreduced
            and not self.manual
            and all(self.boxes[d] == full for d in self.holders)
        )

    def instances(self) -> tuple[tuple[int, ...], ...]:
        """Device groups holding one logical value each (one group unless manual)."""
        return self.manual or (self.holders,)

    # -- moving data -------------------------------------------------------------------------

    def shard(self, global_array: Any, device: int, *, pad: Any = None, zero: Any = 0) -> Any:
        """The piece of `global_array` that `device` holds (numpy slicing; object arrays too).

        `pad` not None: pad the piece up to `tile_shape` with it (XLA's buffer shape). For
        unreduced layouts the first member of each group gets the box, the others `zero`s.
        """
        arr = np.asarray(global_array)
        if arr.shape != self.global_shape:
            raise ValueError(f"array of shape {arr.shape}, layout is for {self.global_shape}")
        piece = arr[_slices(self.boxes[device])]
        if self.unreduced and device != self._group_of(device)[0]:
            piece = np.full(piece.shape, zero, dtype=arr.dtype)
        if pad is not None and piece.shape != self.tile_shape:
            out = np.full(self.tile_shape, pad, dtype=arr.dtype)
            out[tuple(slice(0, n) for n in piece.shape)] = piece
            piece = out
        return piece

    def assemble(self, per_device: Sequence[Any], add: Callable | None = None) -> np.ndarray:
        """The logical value from the devices' values (padded buffers allowed).

        Replicated copies: the first holder's. Unreduced: the sum of the first group covering
        each box, folded with `add` (numpy `+` by default) in device order.
        """
        if self.manual:
            raise ValueError("a manual layout has no global value; use assemble_instances")
        return self.assemble_instances(per_device, add)[0]

    def assemble_instances(
        self, per_device: Sequence[Any], add: Callable | None = None
    ) -> list[np.ndarray]:
        """One logical value per instance (manual layouts), else a one-element list."""
        sources = self._sources(per_device, add)
        out = []
        for inst in sources:
            result, covered = None, np.zeros(self.global_shape, dtype=bool)
            for box, values in inst:
                value = values[0]
                if result is None:
                    result = np.empty(self.global_shape, dtype=value.dtype)
                result[_slices(box)] = value
                covered[_slices(box)] = True
            if result is None or not covered.all():
                raise ValueError(f"layout {self} does not cover its tensor")
            out.append(result)
        return out

    def replicas_agree(
        self, per_device: Sequence[Any], close: Callable[[Any, Any], bool] | None = None
    ) -> bool:
        """Whether all copies of each box (or each group's sum, if unreduced) agree."""
        close = close or (lambda a, b: bool(np.array_equal(a, b)))
        for inst in self._sources(per_device, None):
            for _, values in inst:
                if not all(close(values[0], v) for v in values[1:]):
                    return False
        return True

    def copies(self, per_device: Sequence[Any], add: Callable | None = None) -> list[tuple]:
        """Every copy of every box: [(device, box, value)] in device order, over all
        instances. Replicated boxes appear once per holder (each device's own copy: a
        replicated value is right only if every copy is); an unreduced group appears once,
        as its sum, named by its first member."""
        return [
            (d, box, value)
            for inst in self._copies(per_device, add)
            for box, held in inst
            for d, value in held
        ]

    def _sources(self, per_device: Sequence[Any], add: Callable | None) -> list[list]:
        """Per instance: [(box, [value of each copy])], copies in device order."""
        return [
            [(box, [value for _, value in held]) for box, held in inst]
            for inst in self._copies(per_device, add)
        ]

    def _copies(self, per_device: Sequence[Any], add: Callable | None) -> list[list]:
        """Per instance: [(box, [(device, value) of each copy])], copies in device order."""
        if len(per_device) != self.num_devices:
            raise ValueError(f"{len(per_device)} device values for {self.num_devices} devices")
        add = add or operator.add
        groups = self._groups
        out = []
        for inst in self.instances():
            by_box: dict[Box, list] = {}
            seen = set()
            for d in inst:
                group = groups.get(d, (d,))
                if group in seen:
                    continue
                seen.add(group)
                value = None
                for m in group:
                    v = self._local(per_device[m], m)
                    value = v if value is None else add(value, v)
                by_box.setdefault(self.boxes[d], []).append((group[0], np.asarray(value)))
            out.append(list(by_box.items()))
        return out

    def _local(self, value: Any, device: int) -> np.ndarray:
        arr = np.asarray(value)
        shape = self.local_shape(device)
        if arr.ndim != len(shape) or any(a < s for a, s in zip(arr.shape, shape, strict=True)):
            raise ValueError(f"device {device} value has shape {arr.shape}, expected {shape}")
        return arr[(*(slice(0, n) for n in shape), Ellipsis)]

    @property
    def box_array(self) -> np.ndarray:
        """`boxes` as one int64 array (device, dimension, start / stop)."""
        rows, which = self.box_rows
        return rows[which]

    @cached_property
    def box_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows, which): device d's box is `rows[which[d]]`, an int64 array (box, dimension,
        start / stop). Devices share few box objects (a tile replicated over an axis): each
        is one row (two rows may still be equal boxes). A layout built from a tiling, or
        rescaled, is given its own (`_tiled`, `_build`, `_whole`, `scaled_layout`)."""
        rank = len(self.global_shape)
        seen: dict[int, int] = {}
        distinct: list[Box] = []
        which = np.empty(len(self.boxes), dtype=np.intp)
        for d, b in enumerate(self.boxes):
            k = seen.get(id(b))
            if k is None:
                k = seen[id(b)] = len(distinct)
                distinct.append(b)
            which[d] = k
        return np.asarray(distinct, dtype=np.int64).reshape(len(distinct), rank, 2), which

    @cached_property
    def distinct_boxes(self) -> list[Box]:
        """The distinct boxes, in the order of the first device holding each."""
        if not self.boxes or not self.global_shape:
            return list(dict.fromkeys(self.boxes))
        rows, which = self.box_rows
        radix = np.repeat(np.array(self.global_shape, dtype=np.int64) + 1, 2)
        _, same = _distinct_rows(rows.reshape(len(rows), -1), radix)
        _, first = np.unique(same[which], return_index=True)
        return [self.boxes[d] for d in np.sort(first).tolist()]

    @cached_property
    def _groups(self) -> dict[int, tuple[int, ...]]:
        return {d: g for g in self.unreduced for d in g}

    def _group_of(self, device: int) -> tuple[int, ...]:
        return self._groups.get(device, (device,))

    def __str__(self) -> str:
        shape = "(" + ",".join(str(n) for n in self.global_shape) + ")"
        if self.desc:
            return f"{self.desc} on {shape}"
        return f"layout on {shape} over {self.num_devices} devices"


# -- building ------------------------------------------------------------------------------


def _build(
    shape: Shape, n: int, tiles: tuple[int, ...], cells: Mapping[int, _Cell], desc: str
) -> Layout:
    """A Layout from each device's tile index, manual instance key and partial-sum key."""
    if sorted(cells) != list(range(n)):
        raise BadInput(f"sharding {desc} does not place exactly devices 0..{n - 1}")
    at = np.array([cells[d][0] for d in range(n)], dtype=np.int64).reshape(n, len(tiles))
    boxes, chunk, rows = _boxes(shape, tiles, at)
    manual: dict[Hashable, list[int]] = {}
    groups: dict[Hashable, list[int]] = {}
    for d in range(n):
        tile, mkey, rkey = cells[d]
        if mkey is not None:
            manual.setdefault(mkey, []).append(d)
        if rkey is not None:
            groups.setdefault((mkey, tile, rkey), []).append(d)
    lay = Layout(
        shape,
        n,
        boxes,
        chunk,
        tuple(sorted(tuple(g) for g in groups.values())),
        tuple(sorted(tuple(g) for g in manual.values())),
        None,
        desc,
    )
    lay.__dict__["box_rows"] = rows  # the cache of `Layout.box_rows`: the boxes as built
    return lay


def _tiled(shape: Shape, n: int, tiles: tuple[int, ...], grid: np.ndarray, desc: str) -> Layout:
    """What `_build` makes of a tile assignment without manual or partial-sum subgroups
    (`grid`: the device at each tile index, then at each replica), with numpy: one tile
    index per device, no groups."""
    rank = len(tiles)
    flat = grid.reshape(-1)
    values, counts = np.unique(flat, return_counts=True)
    if (counts > 1).any():
        raise BadInput(f"sharding {desc} places device {int(values[counts > 1][0])} twice")
    if flat.size != n or (n and not np.array_equal(np.sort(flat), np.arange(n))):
        raise BadInput(f"sharding {desc} does not place exactly devices 0..{n - 1}")
    index = np.indices(grid.shape, dtype=np.int64).reshape(grid.ndim, -1)[:rank]
    at = np.empty((n, rank), dtype=np.int64)
    at[flat] = index.T
    boxes, chunk, rows = _boxes(shape, tiles, at)
    lay = Layout(shape, n, boxes, chunk, (), (), None, desc)
    lay.__dict__["box_rows"] = rows  # the cache of `Layout.box_rows`: the boxes as built
    return lay


def _boxes(shape: Shape, tiles: tuple[int, ...], at: np.ndarray) -> tuple[tuple, Shape, tuple]:
    """(each device's box, the tile shape, the distinct boxes as an array and which one each
    device holds: `Layout.box_rows`) from each device's tile index (`at`, one row per
    device) when each dimension is split into `tiles` chunks (the last one ragged)."""
    n, rank = at.shape
    chunk = tuple(-(-size // k) for size, k in zip(shape, tiles, strict=True))
    if not rank:
        return ((),) * n, chunk, (np.zeros((1, 0, 2), dtype=np.int64), np.zeros(n, np.intp))
    size, step = np.array(shape, dtype=np.int64), np.array(chunk, dtype=np.int64)
    corners = np.stack([np.minimum(at * step, size), np.minimum((at + 1) * step, size)], -1)
    # devices share boxes (a tile replicated over an axis): each distinct box built once
    distinct, which = _distinct_rows(corners.reshape(n, -1), np.repeat(size + 1, 2))
    made = [tuple(map(tuple, row)) for row in distinct.reshape(-1, rank, 2).tolist()]
    boxes = tuple(map(made.__getitem__, which.tolist()))
    return boxes, chunk, (distinct.reshape(-1, rank, 2), which)


def _distinct_rows(rows: np.ndarray, radix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct rows, which one each row is): `np.unique(rows, axis=0)`, through one
    integer key per row when the rows' values (each below its column's `radix`) fit one."""
    if (
        math.prod(int(r) for r in radix) >= 2**62
        or rows.size
        and (rows.min() < 0 or (rows >= radix).any())
    ):
        distinct, which = np.unique(rows, axis=0, return_inverse=True)
        return distinct, which.reshape(-1)
    weights = np.cumprod(np.concatenate([[1], radix[:0:-1]]))[::-1].astype(np.int64)
    _, first, which = np.unique(rows @ weights, return_index=True, return_inverse=True)
    return rows[first], which.reshape(-1)


def _whole(shape: Shape, n: int, desc: str, manual: bool = False, unreduced: bool = False):
    """Every device holds the whole tensor; each its own instance if `manual`. (What `_build`
    makes of one tile per device, built directly: one box shared by all n devices.)"""
    whole = tuple((0, size) for size in shape)
    alone = tuple(zip(range(n))) if manual else ()  # (d,) for each device d
    together = (tuple(range(n)),) if n else ()
    groups = (alone if manual else together) if unreduced else ()
    lay = Layout(shape, n, (whole,) * n, tuple(shape), groups, alone, None, desc)
    rows = np.array(whole, dtype=np.int64).reshape(1, len(shape), 2)
    lay.__dict__["box_rows"] = (rows, np.zeros(n, dtype=np.intp))  # `Layout.box_rows`
    return lay


def _maximal(shape: Shape, n: int, device: int, desc: str) -> Layout:
    if not 0 <= device < n:
        raise BadInput(f"sharding {desc}: device {device} is not one of {n} devices")
    lay = _whole(shape, n, desc)
    return Layout(shape, n, lay.boxes, lay.tile_shape, (), (), device, desc)


# -- mhlo.sharding ---------------------------------------------------------------------------

_DEVICES_RE = re.compile(r"devices=\[([^\]]*)\]\s*(?:<=\[([^\]]*)\](?:T\(([^)]*)\))?|([0-9,\s]+))?")


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BadInput(f"malformed sharding: bad integer list [{text}]") from None


def _check_hlo_text(text: str, n: int | None) -> None:
    """Reject tile assignments XLA's parser would accept and then crash or truncate on."""
    if not isinstance(text, str):
        raise BadInput(f"sharding must be a string, got {type(text).__name__}")
    for m in _DEVICES_RE.finditer(text):
        dims = _ints(m.group(1))
        count = math.prod(dims)
        if not dims or min(dims) < 1 or count > 1 << 20:
            raise BadInput(f"malformed sharding {text!r}: tile dims [{m.group(1)}]")
        if m.group(2) is not None:
            reshape = _ints(m.group(2))
            perm = _ints(m.group(3)) if m.group(3) is not None else list(range(len(reshape)))
            if math.prod(reshape) != count or sorted(perm) != list(range(len(reshape))):
                raise BadInput(f"malformed sharding {text!r}: iota <=[{m.group(2)}] mismatch")
        elif m.group(4) is not None:
            if len(_ints(m.group(4))) != count:
                raise BadInput(f"malformed sharding {text!r}: {count} devices expected")
        else:
            raise BadInput(f"malformed sharding {text!r}: no device list")
        if n is not None and count != n:
            raise BadInput(f"sharding {text!r} places {count} devices, program has {n}")
    for m in re.finditer(r"maximal\s+device\s*=\s*(-?\d+)", text):
        if int(m.group(1)) < 0 or (n is not None and int(m.group(1)) >= n):
            raise BadInput(f"sharding {text!r}: no device {m.group(1)}")


def _first_line(e: Exception) -> str:
    """XLA's parse error as one line: the diagnostic after `error:`."""
    m = re.search(r"error:\s*(\S[^\n]*)", str(e))
    if m:
        return m.group(1).strip()
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def _is_shape_list(x: Any) -> bool:
    if hasattr(x, "elements"):  # TupleType
        return True
    return isinstance(x, (list, tuple)) and len(x) > 0 and not isinstance(x[0], (int, np.integer))


def _shape(x: Any) -> Shape:
    if hasattr(x, "shape") and not isinstance(x, np.ndarray):
        x = x.shape
    try:
        return tuple(int(d) for d in x)
    except TypeError:
        raise ValueError(f"not a shape: {x!r}") from None


@lru_cache(maxsize=4096)
def _hlo_layout(text: str, shape: Shape, n: int | None) -> Layout:
    """One layout per sharding, shape and device count: the arguments and results of a
    per-device program share a few shardings, each built once for all its devices."""
    return _parsed_hlo_layout(text, shape, n)


def _parsed_hlo_layout(text: str, global_shape: Any, n: int | None) -> Layout | list[Layout]:
    _check_hlo_text(text, n)
    from jax._src.lib import xla_client as xc

    try:
        h = xc.HloSharding.from_string(text)
    except Exception as e:
        raise BadInput(f"malformed sharding {text!r}: {_first_line(e)}") from None
    return _from_hlo(h, global_shape, n, xc)


def _from_hlo(h: Any, global_shape: Any, n: int | None, xc: Any) -> Layout | list[Layout]:
    elems = h.tuple_elements()
    is_list = _is_shape_list(global_shape)
    if is_list:
        shapes = list(getattr(global_shape, "elements", global_shape))
        if elems and len(elems) != len(shapes):
            raise BadInput(f"tuple sharding {h} has {len(elems)} elements, value has {len(shapes)}")
        parts = elems or [h] * len(shapes)
        return [_from_hlo(e, s, n, xc) for e, s in zip(parts, shapes, strict=True)]
    if elems:
        raise BadInput(f"tuple sharding {h} on a non-tuple value")
    shape, desc = _shape(global_shape), str(h)
    if h.is_replicated():
        return _whole(shape, _need(n, desc), desc)
    if h.is_manual():
        return _whole(shape, _need(n, desc), desc, manual=True)
    if h.is_unreduced():
        return _whole(shape, _need(n, desc), desc, unreduced=True)
    if h.is_unknown():
        raise Unsupported(f"sharding {desc} (to be propagated) has no layout")
    if h.is_maximal():
        return _maximal(shape, _need(n, desc), int(h.tile_assignment_devices()[0]), desc)
    dims = list(h.tile_assignment_dimensions())
    devices = list(h.tile_assignment_devices())
    kinds = [xc.OpSharding.Type.REPLICATED] if h.replicate_on_last_tile_dim() else []
    kinds += list(h.subgroup_types())
    rank = len(dims) - len(kinds)
    if rank != len(shape):
        raise BadInput(f"sharding {desc} is for rank {rank}, value has shape {shape}")
    T = xc.OpSharding.Type
    if any(k not in (T.REPLICATED, T.MANUAL, T.UNREDUCED) for k in kinds):
        raise Unsupported(f"sharding {desc}: subgroup types {[k.name for k in kinds]} unsupported")
    n = len(devices) if n is None else n
    grid = np.array(devices, dtype=np.int64).reshape(dims)
    man = [rank + j for j, k in enumerate(kinds) if k == T.MANUAL]
    unred = [rank + j for j, k in enumerate(kinds) if k == T.UNREDUCED]
    if not man and not unred:
        return _tiled(shape, n, tuple(dims[:rank]), grid, desc)
    cells: dict[int, _Cell] = {}
    for idx in np.ndindex(*dims):
        d = int(grid[idx])
        if d in cells:
            raise BadInput(f"sharding {desc} places device {d} twice")
        mkey = tuple(idx[i] for i in man) if man else None
        rkey = tuple(idx[i] for i in range(rank, len(dims)) if i not in unred) if unred else None
        cells[d] = (tuple(int(i) for i in idx[:rank]), mkey, rkey)
    return _build(shape, n, tuple(dims[:rank]), cells, desc)


def _need(n: int | None, desc: str) -> int:
    if n is None:
        raise ValueError(f"sharding {desc}: num_devices is required")
    return n


# -- sdy.sharding ----------------------------------------------------------------------------


def _from_sdy(
    s: SdySharding,
    mesh: SdyMesh | Mapping[str, SdyMesh] | None,
    shape: Shape,
    n: int | None,
    manual_axes: tuple[str, ...],
) -> Layout:
    desc = f"sdy {s}"
    if isinstance(s.mesh, SdyMesh):
        m = s.mesh
    elif isinstance(mesh, SdyMesh):
        m = mesh
    elif mesh is not None and s.mesh in mesh:
        m = mesh[s.mesh]
    else:
        raise BadInput(f"sharding {s}: unknown mesh @{s.mesh}")
    if len(s.dims) != len(shape):
        raise BadInput(f"sharding {s} has {len(s.dims)} dimensions, value has shape {shape}")
    sizes = dict(m.axes)
    size = math.prod(sizes.values())
    if not m.axes:
        ids = m.device_ids or ()
        if len(ids) == 1:
            return _maximal(shape, _need(n, desc), ids[0], desc)
        return _whole(shape, 1 if n is None else n, desc)
    if n is not None and n != size:
        raise BadInput(f"mesh {m} has {size} devices, program has {n}")
    ids = m.device_ids if m.device_ids is not None else tuple(range(size))
    if sorted(ids) != list(range(size)):
        raise BadInput(f"mesh {m}: device_ids are not a permutation of 0..{size - 1}")
    for name in manual_axes:
        if name not in sizes:
            raise BadInput(f"manual axis {name!r} is not in mesh {m}")
    used = [a for axes in s.dims for a in axes] + list(s.unreduced) + list(s.replicated)
    for a in used:
        _axis_size(a, sizes, s)
    if len(set(used)) != len(used):
        raise BadInput(f"sharding {s} uses an axis twice")
    dims = [[a for a in axes if a.name not in manual_axes] for axes in s.dims]
    unred = [a for a in s.unreduced if a.name not in manual_axes]
    tiles = tuple(math.prod(_axis_size(a, sizes, s) for a in axes) for axes in dims)
    names = [name for name, _ in m.axes]
    cells: dict[int, _Cell] = {}
    for pos, d in enumerate(ids):
        digits = np.unravel_index(pos, tuple(sizes[x] for x in names))
        coords = {x: int(c) for x, c in zip(names, digits, strict=True)}
        tile = []
        for axes in dims:
            t = 0
            for a in axes:
                t = t * _axis_size(a, sizes, s) + _axis_coord(a, coords, sizes)
            tile.append(t)
        mkey = tuple(coords[x] for x in manual_axes) if manual_axes else None
        rkey = None
        if unred:
            rest = dict(coords)
            for a in unred:
                rest[a.name] -= _axis_coord(a, coords, sizes) * _stride(a, sizes)
            rkey = tuple(rest[x] for x in names)
        cells[d] = (tuple(tile), mkey, rkey)
    return _build(shape, size, tiles, cells, desc)


def _axis_size(a: SdyAxis, sizes: Mapping[str, int], s: SdySharding) -> int:
    if a.name not in sizes:
        raise BadInput(f"sharding {s}: no axis {a.name!r} in the mesh")
    if a.size is None:
        return sizes[a.name]
    if a.pre_size < 1 or a.size < 1 or sizes[a.name] % (a.pre_size * a.size):
        raise BadInput(f"sharding {s}: sub-axis {a} does not divide axis size {sizes[a.name]}")
    return a.size


def _stride(a: SdyAxis, sizes: Mapping[str, int]) -> int:
    """How far the axis coordinate moves per step of sub-axis `a` (1 for a whole axis)."""
    return 1 if a.size is None else sizes[a.name] // (a.pre_size * a.size)


def _axis_coord(a: SdyAxis, coords: Mapping[str, int], sizes: Mapping[str, int]) -> int:
    if a.size is None:
        return coords[a.name]
    return (coords[a.name] // _stride(a, sizes)) % a.size


def _slices(box: Box) -> tuple:
    """Index of a box; the trailing Ellipsis keeps 0-d results arrays (not scalars)."""
    return (*(slice(a, b) for a, b in box), Ellipsis)
