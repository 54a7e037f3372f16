"""Find how a per-device implementation value corresponds to a spec value, from simulation.

A correspondence says: on every device d, the implementation's local value equals the block
`box[d]` of one spec value (the whole value when replicated). Blocks are the tiles of the
local shape inside the spec value's shape, so a value sharded along any mesh axes, in any
device order, or replicated, is found by hashing tiles. The numbers decide; nothing here
reads sharding annotations. A tile matches element by element (`close_elementwise`): a
masked logit of -0.7 * finfo(float32).max must not make every head's tile match.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from tv_ir.limits import check_time
from tv_ir.semantics.closeness import RTOL, close_elementwise

from .simulate import Trace

Box = tuple[tuple[int, int], ...]  # (start, stop) per dimension

# ops that only move or relabel elements: never worth a cut-point of their own
# equal tiles of one spec value kept as a device's alternatives (heads whose masked scores are
# equal in every simulation run); a zero value equals thousands of tiles: only so many boxes
ALTERNATIVES = 8
# tiles whose largest finite magnitudes differ by more than this (relative to 1 or the
# larger) are not element-wise close (`close_elementwise` allows RTOL, so theirs differ by
# at most RTOL; twice that for rounding): they are not compared
PEAK_SLACK = 2 * RTOL
FEW_CANDIDATES = 16  # candidates compared without that sorting out
# a value whose every element is below this "equals" a near-zero tile of any unrelated value
# under matching's floored comparison (|a - b| <= RTOL x max(1, ...)): a backward value
# scaled by 1/1024 on a far pipeline stage is 1e-9, an AdamW g*g 1e-11. Its matches count
# only where they hold at the elements' own magnitude; trying an unrelated one expands that
# spec value through everything not yet proved before it, without bound
TINY = 1e3 * RTOL


MOVEMENT_OPS = {
    "stablehlo.broadcast_in_dim",
    "stablehlo.reshape",
    "stablehlo.transpose",
    "stablehlo.slice",
    "stablehlo.concatenate",
    "stablehlo.convert",
    "stablehlo.reverse",
    "stablehlo.pad",
    "stablehlo.dynamic_slice",
    "stablehlo.dynamic_update_slice",
    "stablehlo.optimization_barrier",
    "stablehlo.get_tuple_element",
    "stablehlo.tuple",
    "stablehlo.copy",
    "stablehlo.gather",
    "stablehlo.select",
}


@dataclass(frozen=True)
class Correspondence:
    spec_value: int  # spec value id
    boxes: tuple[Box, ...]  # one per device
    # per device, every box whose tile equals the device's value in every run (the first is
    # `boxes[d]`): masked tiles of different heads can be equal in simulation
    alternatives: tuple[tuple[Box, ...], ...] = field(default=(), compare=False)

    def block(self, array, device: int):
        """The part of a spec-shaped array that `device` holds."""
        return np.asarray(array)[box_index(self.boxes[device])]

    def with_box(self, device: int, box: Box) -> Correspondence:
        """The same correspondence with `device` holding `box` instead."""
        boxes = list(self.boxes)
        boxes[device] = box
        return Correspondence(self.spec_value, tuple(boxes), self.alternatives)


def box_index(box: Box) -> tuple:
    """numpy index of a box; the Ellipsis keeps a 0-d block an array, not a scalar."""
    return (*(slice(a, b) for a, b in box), Ellipsis)


def tiles(shape: tuple, local: tuple) -> list[Box] | None:
    """Every tile of `local` inside `shape`, or None if `local` does not tile `shape`."""
    if len(shape) != len(local) or any(l <= 0 or s % l for s, l in zip(shape, local, strict=True)):
        return None
    ranges = [range(0, s, l) for s, l in zip(shape, local, strict=True)]
    return [
        tuple((o, o + l) for o, l in zip(origin, local, strict=True))
        for origin in itertools.product(*ranges)
    ]


def loose_tiles(shape: tuple, local: tuple) -> list[Box]:
    """Tiles of `shape` that hold `local` up to unit dimensions (a (1, 4, 8) tile for a
    (4, 8) value), and the whole of `shape` when it has as many elements as `local`: what
    reshapes keep."""
    dims = [n for n in local if n != 1]
    out: list[Box] = []
    if tuple(shape) != tuple(local) and np.prod(shape, dtype=np.int64) == np.prod(
        local, dtype=np.int64
    ):
        out.append(tuple((0, n) for n in shape))
    if len(dims) > len(shape):
        return out
    for where in itertools.combinations(range(len(shape)), len(dims)):
        tile = [1] * len(shape)
        for k, n in zip(where, dims, strict=True):
            tile[k] = n
        out += tiles(tuple(shape), tuple(tile)) or []
    return list(dict.fromkeys(out))


def tile_shapes(shape: tuple, local: tuple, loose: bool) -> list[tuple]:
    """The shapes of the tiles `tiles` (or, `loose`, `loose_tiles`) cuts `shape` into, in the
    order those list their boxes: all tiles of one shape are the tiling of `shape` by it."""
    shape, local = tuple(shape), tuple(local)
    if not loose:
        return [local] if _divides(shape, local) else []
    out = []
    if shape != local and np.prod(shape, dtype=np.int64) == np.prod(local, dtype=np.int64):
        out.append(shape)
    dims = [n for n in local if n != 1]
    if len(dims) > len(shape):
        return out
    for where in itertools.combinations(range(len(shape)), len(dims)):
        tile = [1] * len(shape)
        for k, n in zip(where, dims, strict=True):
            tile[k] = n
        if _divides(shape, tuple(tile)):
            out.append(tuple(tile))
    return list(dict.fromkeys(out))


def _divides(shape: tuple, tile: tuple) -> bool:
    return len(shape) == len(tile) and all(
        t > 0 and s % t == 0 for s, t in zip(shape, tile, strict=True)
    )


def tile_rows(array: np.ndarray, tile: tuple) -> np.ndarray:
    """Every tile of shape `tile` of `array` (which it divides), flattened, one per row, in
    the order `tiles` lists their boxes (origins in row-major order)."""
    split = [n for s, t in zip(array.shape, tile, strict=True) for n in (s // t, t)]
    k = len(tile)
    blocks = array.reshape(split).transpose([*range(0, 2 * k, 2), *range(1, 2 * k, 2)])
    return blocks.reshape(-1, int(np.prod(tile, dtype=np.int64)))


def tile_box(shape: tuple, tile: tuple, row: int) -> Box:
    """The box of row `row` of `tile_rows(array of shape, tile)`."""
    box = []
    for s, t in zip(reversed(shape), reversed(tile), strict=True):  # row-major: last dim first
        row, o = divmod(row, s // t)
        box.append((o * t, o * t + t))
    return tuple(reversed(box))


class TileIndex:
    """Spec values cut into tiles of a given local shape, keyed by a random projection.

    `loose_rank`: also tiles that equal the value up to unit dimensions (localisation; a
    proof needs blocks of the value's own shape)."""

    def __init__(
        self,
        traces: list[Trace],
        shapes: dict[int, tuple],
        order: dict[int, int],
        loose_rank: bool = False,
    ):
        self.traces = traces
        self.shapes = shapes
        self.order = order
        self.loose_rank = loose_rank
        self._by_local: dict[tuple, _TileEntries] = {}
        self._by_norm: dict[tuple, _NormIndex] = {}
        self._directions: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        # `_matches` of the value being cut, by its arrays' identities (`forget` clears it):
        # `candidates` and then `tile_matches` look up the same devices' arrays
        self._memo: dict[tuple, tuple] | None = None  # off until `forget`

    def _canonical(self, local: tuple) -> tuple:
        """The tile shape an index is kept for: with `loose_rank`, local shapes that differ
        only in unit dimensions (`(1, 2, 2)`, `(2, 1, 2)`, `(2, 2)`) have the same tiles in the
        same element order, so they share one index (and one projection direction)."""
        return tuple(n for n in local if n != 1) if self.loose_rank else local

    def _direction(self, local: tuple) -> tuple[np.ndarray, np.ndarray]:
        """The random direction values of shape `local` are projected on, and its absolute
        values (drawn once per shape: every value and tile of a shape meets the same one)."""
        local = self._canonical(local)
        d = self._directions.get(local)
        if d is None:
            r = np.random.default_rng(abs(hash(local)) & 0xFFFF).standard_normal(
                int(np.prod(local, dtype=np.int64))
            )
            d = self._directions[local] = (r, np.abs(r))
        return d

    def _project(self, local: tuple, arrays) -> tuple[float, float] | None:
        """A random projection of the arrays, and the magnitude it has to be compared at."""
        r, r_abs = self._direction(local)
        total = mag = 0.0
        for a in arrays:
            a = np.asarray(a)
            if a.dtype.kind not in "fiub":
                return None
            a = a.astype(np.float64).reshape(-1)
            if not np.isfinite(a).all():
                a = np.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)
            total += float(r @ a)
            mag += float(r_abs @ np.abs(a))
        return total, mag

    def _tiles(self, local: tuple) -> list[tuple[int, Box, list]]:
        """(spec value, box, the tile in every run, shaped `local`) for every tile."""
        out = []
        for vid, shape in self.shapes.items():
            if vid not in self.traces[0].values:
                continue
            if self.loose_rank:
                boxes = loose_tiles(tuple(shape), local)
            else:
                boxes = tiles(tuple(shape), local) or []
            runs = range(len(self.traces))
            out += [(vid, box, [self._tile(vid, box, i, local) for i in runs]) for box in boxes]
        return out

    def agrees(self, pieces: list[tuple[int, Box, list]]) -> bool:
        """Is every (spec value, box, arrays) piece's block equal to its arrays (one
        device's value in every run), as the tiles `candidates` names are? Compared at once."""
        blocks, arrays = [], []
        for vid, box, runs in pieces:
            if vid not in self.traces[0].values or len(runs) != len(self.traces):
                return False
            for i, a in enumerate(runs):
                block = np.asarray(self.traces[i].values[vid])[box_index(box)]
                if block.size != np.size(a):
                    return False
                blocks.append(np.reshape(block, -1))
                arrays.append(np.reshape(a, -1))
        return not blocks or close_elementwise(np.concatenate(arrays), np.concatenate(blocks))

    def _tile(self, vid: int, box: Box, run: int, local: tuple):
        return np.reshape(self.traces[run].values[vid][box_index(box)], local)

    def _index(self, local: tuple) -> _TileEntries:
        """The distinct tiles of each spec value and tile shape, sorted by projection; equal
        tiles of one value share an entry, so a value that equals many of them (a zero tile
        of a masked attention matrix) is compared once per value, not once per copy. Each
        spec value's tiles of one shape are projected and grouped at once (`tile_rows`,
        numpy): a value of a million elements has a million unit tiles, which one by one
        (or one Python step each) cost minutes in a large program."""
        local = self._canonical(local)
        idx = self._by_local.get(local)
        if idx is None:
            r, _ = self._direction(local)
            values_of = []
            for vid, shape in self.shapes.items():
                if vid not in self.traces[0].values:
                    continue
                values = [np.asarray(tr.values[vid]) for tr in self.traces]
                if any(v.dtype.kind not in "fiub" or v.shape != tuple(shape) for v in values):
                    continue  # no projection (as `_project`)
                values_of.append((vid, tuple(shape), values))
            cut = _tiles_projected(values_of, local, self.loose_rank, r)
            parts: list[tuple] = []
            tiles_seen: list[tuple] = []
            for vid, shape, _ in values_of:  # in the spec's order (ties in the index keep it)
                check_time()  # an index over every spec value of a large program takes a while
                for tile in tile_shapes(shape, local, self.loose_rank):
                    key, peak, nonfinite, rows = cut[(vid, tile)]
                    groups = _equal_rows(rows)
                    tiles_seen.append(tile)
                    first = groups.first
                    parts.append(
                        (
                            key[first],
                            vid,
                            len(tiles_seen) - 1,
                            groups,
                            peak[first],
                            nonfinite[first],
                        )
                    )
            idx = _TileEntries.of(parts, tiles_seen)
            self._by_local[local] = idx
        return idx

    def _member(self, member: tuple) -> tuple[int, Box]:
        """(spec value, box) of an index entry's member (value, tile shape, row)."""
        vid, tile, row = member
        return vid, tile_box(tuple(self.shapes[vid]), tile, row)

    def _matches(
        self,
        local: tuple,
        arrays,
        firsts: bool = False,
        one: bool = False,
        only: frozenset[int] | None = None,
        own_scale: bool = False,
    ) -> list[tuple[int, tuple, int]]:
        """The index members (spec value, tile shape, row) of every tile the arrays (one
        device's value in every run) equal, at most ALTERNATIVES equal ones per value and
        tile shape (no caller uses more); `_member` gives their boxes. `firsts`: one member
        per spec value (all that a caller looking for the values needs); `one`: the first
        member found only (whether there is one); `only`: members of these spec values only;
        `own_scale`: tiles are sorted out at the arrays' own magnitude, not at least 1 (a
        TINY value: near zero, every tiny tile of the program shares its key and peak)."""
        if self._memo is None:
            return self._matches_uncached(local, arrays, firsts, one, only, own_scale)
        memo_key = (local, tuple(map(id, arrays)), firsts, one, only, own_scale)
        hit = self._memo.get(memo_key)
        if hit is not None:
            return list(hit)
        out = self._matches_uncached(local, arrays, firsts, one, only, own_scale)
        self._memo[memo_key] = tuple(out)
        return out

    def forget(self) -> None:
        """Look-ups from here on are remembered (by the arrays' identities: the caller keeps
        the arrays alive) until the next `forget`: call it before each value, whose arrays
        `candidates` and then `tile_matches` look up in turn."""
        self._memo = {}

    def _matches_uncached(
        self,
        local: tuple,
        arrays,
        firsts: bool,
        one: bool,
        only: frozenset[int] | None = None,
        own_scale: bool = False,
    ) -> list:
        key = self._project(local, arrays)
        if key is None:
            return []
        idx = self._index(local)
        floor = 0.0 if own_scale else 1.0  # the comparison's scale: max(floor, magnitudes)
        tol = 1e-7 * (floor + key[1])
        lo = int(np.searchsorted(idx.keys, key[0] - tol, side="left"))
        hi = int(np.searchsorted(idx.keys, key[0] + tol, side="right"))
        # near-zero keys are shared by thousands of tiles (zeros of every value, an idle
        # stage's, a masked attention's tiny tail): tiles whose largest magnitude is not the
        # arrays' are dropped at once, and tiles so small that every element is within the
        # comparison's tolerance of the arrays' (zeros: an idle stage's) are equal at once
        if hi - lo > FEW_CANDIDATES:
            peak, nonfinite = (
                float(x[0]) for x in _peaks([np.reshape(a, (1, -1)) for a in arrays])
            )
            peaks = idx.peaks[lo:hi]
            far = (idx.nonfinite[lo:hi] != nonfinite) | (
                np.abs(peaks - peak) > PEAK_SLACK * np.maximum(floor, np.maximum(peaks, peak))
            )
            sure = (idx.nonfinite[lo:hi] == 0) & (nonfinite == 0) & (peaks + peak <= 0.5 * RTOL)
            sure &= not own_scale
            entries = np.flatnonzero(~far)
        else:  # a few candidates: comparing them costs less than sorting them out
            sure = np.zeros(hi - lo, dtype=bool)
            entries = np.arange(hi - lo)
        if only is not None:  # at once: an idle stage's zeros share a key with 10^5 tiles
            entries = entries[np.isin(idx.vids[lo + entries], np.fromiter(only, dtype=np.int64))]
        out, seen = [], set()
        if firsts and not one and sure.any():
            # tiles equal at once, one member per spec value: found without a Python step
            # for each of their (at DP 64, a 126-layer step's walk: minutes) copies
            certain = entries[sure[entries]]
            vids, first = np.unique(idx.vids[lo + certain], return_index=True)
            for vid, k in zip(vids.tolist(), certain[first].tolist(), strict=True):
                e = lo + k
                out.append((vid, idx.tiles[int(idx.tile_of[e])], idx.members(e)[0]))
                seen.add(vid)
            entries = entries[~sure[entries]]
        verdicts: dict[tuple, bool] = {}  # equal tiles of several values: compared once
        for k in entries.tolist():
            e = lo + k
            vid = int(idx.vids[e])
            if firsts and vid in seen:
                continue  # near-zero tiles of values already found
            check_time()  # near-zero tiles: thousands may share a key
            tile = idx.tiles[int(idx.tile_of[e])]
            rows = idx.members(e)
            if sure[k]:
                same = True  # |a - b| <= |a| + |b| <= RTOL, finite on both sides
            else:
                box = tile_box(tuple(self.shapes[vid]), tile, rows[0])
                blocks = [self._tile(vid, box, i, local) for i in range(len(arrays))]
                content = tuple(np.ascontiguousarray(b).tobytes() for b in blocks)
                same = verdicts.get(content)
                if same is None:
                    same = verdicts[content] = all(
                        close_elementwise(a, b) for a, b in zip(arrays, blocks, strict=True)
                    )
            if same:
                out += [(vid, tile, row) for row in (rows[:1] if firsts else rows)]
                seen.add(vid)
                if one:
                    break
        return out

    def tile_matches(self, arrays: list) -> list[tuple[int, Box]]:
        """(spec value, box) of every spec tile one device's value equals in every run,
        earliest spec value first (a TINY value: the tiles it equals at its own magnitude)."""
        local = tuple(np.shape(arrays[0]))
        tiny = _tiny(_magnitude(arrays))
        found = self._matches(local, arrays, own_scale=tiny)
        out = [self._member(m) for m in sorted(found, key=lambda m: self.order.get(m[0], 0))]
        if tiny:
            out = [(vid, box) for vid, box in out if self._equal_closely(vid, box, arrays, local)]
        return out

    def values_held(self, per_device: list[list]) -> set[int]:
        """The spec values a tile of which every device's value is (in every run): the
        values `candidates(per_device, limit=0)` names, without making their boxes."""
        local = tuple(np.shape(per_device[0][0]))
        common: set[int] | None = None
        # the largest values first: a device holding zeros (an idle pipeline stage) equals
        # every zero tile of every spec value, a costly look-up that a device holding data
        # usually makes unnecessary (the intersection is empty after it)
        magnitudes = [_magnitude(arrays) for arrays in per_device]
        for d in largest_first(per_device, magnitudes):
            arrays = per_device[d]
            tiny = _tiny(magnitudes[d])
            only = None if common is None else frozenset(common)  # (no other is kept)
            found = self._matches(local, arrays, firsts=True, only=only, own_scale=tiny)
            here = {m[0] for m in found}
            common = here if common is None else common & here
            if not common:
                return set()
        return common or set()

    def holds_tile(self, arrays: list) -> bool:
        """Is this one device's value (in every run) a tile of some spec value?"""
        tiny = _tiny(_magnitude(arrays))
        local = tuple(np.shape(arrays[0]))
        return bool(self._matches(local, arrays, firsts=True, one=True, own_scale=tiny))

    def _norm_index(self, local: tuple) -> _NormIndex:
        """Spec tiles divided by their largest-magnitude element (scale-free keys), sorted.
        Each spec value's tiles of one shape are normalised and projected at once, as in
        `_index` (one by one, the tiles of a large program took minutes)."""
        local = self._canonical(local)
        idx = self._by_norm.get(local)
        if idx is None:
            r, _ = self._direction(local)
            parts: list[tuple] = []
            tiles_seen: list[tuple] = []
            for vid, shape in self.shapes.items():
                check_time()
                if vid not in self.traces[0].values:
                    continue
                values = [np.asarray(tr.values[vid]) for tr in self.traces]
                if values[0].dtype.kind != "f" or any(v.shape != tuple(shape) for v in values):
                    continue  # no pivot (as `_pivot`)
                for tile in tile_shapes(shape, local, self.loose_rank):
                    rows = [tile_rows(v, tile).astype(np.float64) for v in values]
                    if rows[0].shape[1] == 0:
                        continue
                    first = rows[0]
                    at = np.argmax(np.abs(first), axis=1)
                    pivots = first[np.arange(len(first)), at]
                    keep = np.isfinite(first).all(axis=1) & (pivots != 0)
                    if not keep.any():
                        continue
                    where = np.flatnonzero(keep)
                    key = np.zeros(len(where))
                    with np.errstate(all="ignore"):
                        for run in rows:
                            f = run[where] / pivots[where, None]
                            if not np.isfinite(f).all():
                                f = np.nan_to_num(f, nan=0.0, posinf=0.0, neginf=0.0)
                            key += f @ r
                    tiles_seen.append(tile)
                    n = len(where)
                    parts.append(
                        (
                            key,
                            np.full(n, vid),
                            np.full(n, len(tiles_seen) - 1),
                            where,
                            pivots[where],
                        )
                    )
            idx = _NormIndex.of(parts, tiles_seen)
            self._by_norm[local] = idx
        return idx

    def _scaled_matches(self, local: tuple, arrays) -> list[tuple[int, Box, float]]:
        """(spec value, box, c) with arrays == c * tile in every run, c a whole number or
        the reciprocal of one (other than 1): one box for each spec value and factor."""
        pivot = _pivot(arrays[0])
        if pivot is None:
            return []
        key = self._project(local, [np.asarray(a, dtype=np.float64) / pivot for a in arrays])
        if key is None:
            return []
        idx = self._norm_index(local)
        tol = 1e-7 * (1.0 + key[1])
        lo = int(np.searchsorted(idx.keys, key[0] - tol, side="left"))
        hi = int(np.searchsorted(idx.keys, key[0] + tol, side="right"))
        out, found = [], set()
        with np.errstate(all="ignore"):
            ratios = pivot / idx.pivots[lo:hi]
        whole = lo + np.flatnonzero(_whole_ratios(ratios))  # (a vectorised `_whole_ratio`)
        for e in whole.tolist():
            vid = int(idx.vids[e])
            c = pivot / float(idx.pivots[e])
            if not _whole_ratio(c) or (vid, _round_ratio(c)) in found:
                continue  # a near-constant tile matches thousands: one box per value is enough
            check_time()
            tile = idx.tiles[int(idx.tile_of[e])]
            box = tile_box(tuple(self.shapes[vid]), tile, int(idx.rows[e]))
            if all(
                close_elementwise(
                    a, c * np.asarray(self._tile(vid, box, i, local), dtype=np.float64)
                )
                for i, a in enumerate(arrays)
            ):
                out.append((vid, box, c))
                found.add((vid, _round_ratio(c)))
        return out

    def scale_of(self, per_device: list[list]) -> float | None:
        """The factor c (not 1) such that on every device the value is c times a tile of
        one spec value, if there is one: a gradient scaled by a shard count, a sum that
        still needs dividing."""
        local = tuple(np.shape(per_device[0][0]))
        common: set[tuple[int, float]] | None = None
        for arrays in per_device:
            here = {(vid, _round_ratio(c)) for vid, _, c in self._scaled_matches(local, arrays)}
            common = here if common is None else common & here
            if not common:
                return None
        return min(common, key=lambda k: self.order.get(k[0], 0))[1] if common else None

    def candidates(self, per_device: list[list], limit: int = 4) -> list[Correspondence]:
        """Correspondences for a value given, per device, its arrays in every simulation run
        (`limit` 0: all of them), earliest spec value first."""
        local = tuple(np.shape(per_device[0][0]))
        # the device with the largest values first, then each only among the values every
        # device so far holds: an idle stage's zeros equal a zero tile of nearly every spec
        # value, which a device holding data has already ruled out
        per: dict[int, dict[int, list[Box]]] = {}
        common: frozenset[int] | None = None
        magnitudes = [_magnitude(arrays) for arrays in per_device]
        tiny = _tiny(max(magnitudes))
        for d in largest_first(per_device, magnitudes):
            here: dict[int, list[Box]] = {}
            for member in self._matches(local, per_device[d], only=common, own_scale=tiny):
                boxes = here.setdefault(member[0], [])
                if len(boxes) < ALTERNATIVES:  # equal tiles: kept as alternatives
                    boxes.append(self._member(member)[1])
            common = frozenset(here) if common is None else common & frozenset(here)
            if not common:
                return []
            per[d] = here
        n = len(per_device)
        found = {vid: [tuple(per[d][vid]) for d in range(n)] for vid in per[0] if vid in common}
        # values that equal their tiles at their own magnitude first, at those tiles: matching
        # floors the scale at 1, so a value of tiny elements (a gradient behind a saturated
        # softmax) equals every near-zero tile, and earlier spec values would be tried first
        close = {v: self._closest_boxes(v, found[v], per_device, local) for v in found}
        if tiny:  # matches by the floor alone: none
            found = {v: b for v, b in found.items() if close[v] is not None}
        ordered = sorted(found, key=lambda v: (close[v] is None, self.order.get(v, 0)))
        out = []
        for v in ordered[:limit] if limit else ordered:
            boxes = close[v] or tuple(b[0] for b in found[v])
            alternatives = tuple(
                (box, *(b for b in bs if b != box)) for box, bs in zip(boxes, found[v], strict=True)
            )
            out.append(Correspondence(v, boxes, alternatives))
        return out

    def _closest_boxes(self, vid: int, alternatives: list, per_device: list[list], local):
        """Per device, the first of its boxes whose tile of `vid` equals its value in every
        run to a relative RTOL of the elements' own magnitudes (no floor at 1: tiny values
        must agree too); None if a device has none."""
        out = []
        for boxes, arrays in zip(alternatives, per_device, strict=True):
            box = next((b for b in boxes if self._equal_closely(vid, b, arrays, local)), None)
            if box is None:
                return None
            out.append(box)
        return tuple(out)

    def _equal_closely(self, vid: int, box: Box, arrays: list, local) -> bool:
        for i, a in enumerate(arrays):
            x = np.asarray(a)
            y = np.asarray(self._tile(vid, box, i, local))
            if x.dtype.kind != "f" or y.dtype.kind != "f":
                continue
            x, y = x.astype(np.float64), y.astype(np.float64)
            both = np.isfinite(x) & np.isfinite(y)
            x, y = x[both], y[both]  # (inf - inf, elsewhere, would warn)
            if not np.all(np.abs(x - y) <= RTOL * np.maximum(np.abs(x), np.abs(y))):
                return False
        return True


@dataclass(frozen=True)
class _NormIndex:
    """Normalised spec tiles sorted by key: per entry its spec value, tile shape (an index
    into `tiles`), row of `tile_rows` and pivot."""

    keys: np.ndarray
    vids: np.ndarray
    tile_of: np.ndarray
    rows: np.ndarray
    pivots: np.ndarray
    tiles: list

    @staticmethod
    def of(parts: list[tuple], tiles: list) -> _NormIndex:
        if not parts:
            empty = np.zeros(0)
            return _NormIndex(empty, empty, empty, empty, empty, tiles)
        cols = [np.concatenate(c) for c in zip(*parts, strict=True)]
        order = np.argsort(cols[0], kind="stable")
        return _NormIndex(*(c[order] for c in cols), tiles)


@dataclass(frozen=True)
class _EqualRows:
    """Rows equal in every run, grouped: each group's first row (groups in the order of
    their first rows) and, in `rows[starts[g]:starts[g] + counts[g]]`, its rows ascending."""

    first: np.ndarray
    rows: np.ndarray
    starts: np.ndarray
    counts: np.ndarray


def _equal_rows(rows: list[np.ndarray]) -> _EqualRows:
    """The rows of `tile_rows` (one array per run) grouped by content (byte for byte)."""
    n = len(rows[0])
    if n == 0:  # a tile of no elements (an empty piece of a ragged exchange)
        empty = np.zeros(0, dtype=np.int64)
        return _EqualRows(empty, empty, empty, empty)
    joined = np.ascontiguousarray(np.concatenate([r.reshape(n, -1) for r in rows], axis=1))
    if joined.shape[1] == 0:
        one = np.zeros(min(n, 1), dtype=np.int64)
        return _EqualRows(one, np.arange(n), one, np.full(len(one), n))
    as_bytes = joined.view(np.dtype((np.void, joined.dtype.itemsize * joined.shape[1])))
    _, first, inverse = np.unique(as_bytes.reshape(-1), return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    by_group = np.argsort(inverse, kind="stable")  # each group's rows, ascending
    counts = np.bincount(inverse, minlength=len(first))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    order = np.argsort(first, kind="stable")  # groups in the order of their first rows
    return _EqualRows(first[order], by_group, starts[order], counts[order])


@dataclass(frozen=True)
class _TileEntries:
    """One local shape's index: per entry (a group of equal tiles of one spec value and
    tile shape), sorted by projection, its spec value, tile shape (in `tiles`) and rows."""

    keys: np.ndarray
    vids: np.ndarray
    tile_of: np.ndarray
    chunk_of: np.ndarray
    group_of: np.ndarray
    chunks: list  # per (value, tile shape): its _EqualRows
    tiles: list
    peaks: np.ndarray  # per entry: its largest finite magnitude over the runs (`_peaks`)
    nonfinite: np.ndarray  # per entry: its number of non-finite elements over the runs

    @staticmethod
    def of(parts: list[tuple], tiles: list) -> _TileEntries:
        """From (keys of each group, spec value, tile, _EqualRows, and each group's `_peaks`)
        per value and tile."""
        cols: list[list] = [[], [], [], [], [], [], []]
        for c, (keys, vid, tile, _, peaks, nonfinite) in enumerate(parts):
            n = len(keys)
            row = (keys, np.full(n, vid), np.full(n, tile), np.full(n, c), np.arange(n))
            for col, x in zip(cols, (*row, peaks, nonfinite), strict=True):
                col.append(x)
        arrays = [np.concatenate(c) if c else np.zeros(0, dtype=np.int64) for c in cols]
        order = np.argsort(arrays[0], kind="stable")
        chunks = [p[3] for p in parts]
        *first, peaks, nonfinite = (a[order] for a in arrays)
        return _TileEntries(*first, chunks, tiles, peaks, nonfinite)

    def members(self, e: int) -> list[int]:
        """Entry `e`'s rows: the first ALTERNATIVES equal tiles."""
        g = self.chunks[int(self.chunk_of[e])]
        k = int(self.group_of[e])
        start = int(g.starts[k])
        return g.rows[start : start + min(int(g.counts[k]), ALTERNATIVES)].tolist()


def _peaks(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per row (a tile, one 2-d array of rows per run): its largest finite magnitude in any
    run, and its number of non-finite elements over the runs. Tiles equal element by
    element (`close_elementwise`) have non-finite elements in the same places and largest
    finite magnitudes within RTOL x max(1, either) of each other."""
    _, peak, nonfinite = _projected(rows, None)
    return peak, nonfinite


# spec values of one shape stacked to be cut into tiles together, up to this many bytes
STACK_BYTES = 32 << 20


def _tiles_projected(values_of: list[tuple], local: tuple, loose: bool, r: np.ndarray) -> dict:
    """(spec value, tile shape) -> (each tile's projection on `r`, `_peaks` of each tile,
    its rows in every run: `tile_rows`) for each spec value (vid, shape, arrays per run) and
    tile shape of `local`. Values of one shape and dtypes are stacked and cut, projected and
    measured in one numpy call per tile shape: a large program's index met thousands of
    values, one call each."""
    alike: dict[tuple, list] = {}
    for vid, shape, values in values_of:
        alike.setdefault((shape, tuple(v.dtype for v in values)), []).append((vid, values))
    out: dict[tuple, tuple] = {}
    for (shape, _), members in alike.items():
        tiles_here = tile_shapes(shape, local, loose)
        if not tiles_here:
            continue
        size = sum(v.nbytes for v in members[0][1]) or 1
        step = max(1, STACK_BYTES // size)
        for at in range(0, len(members), step):
            check_time()
            chunk = members[at : at + step]
            runs = [np.stack([values[i] for _, values in chunk]) for i in range(len(chunk[0][1]))]
            for tile in tiles_here:
                rows = [tile_rows(x, (1, *tile)) for x in runs]
                per = len(rows[0]) // len(chunk)  # tiles of each value
                key, peak, nonfinite = _projected(rows, r)
                for k, (vid, _) in enumerate(chunk):
                    own = slice(k * per, (k + 1) * per)
                    out[(vid, tile)] = (key[own], peak[own], nonfinite[own], [x[own] for x in rows])
    return out


def _projected(rows: list[np.ndarray], r: np.ndarray | None) -> tuple:
    """(projection on `r` summed over the runs, non-finite elements as zeros; `_peaks`) of
    each row, in one pass over the runs' rows."""
    n = len(rows[0])
    key, peak = np.zeros(n), np.zeros(n)
    nonfinite = np.zeros(n, dtype=np.int64)
    for run in rows:
        f = run.astype(np.float64)
        ok = np.isfinite(f)
        if not ok.all():
            nonfinite += f.shape[1] - ok.sum(axis=1)
            f = np.where(ok, f, 0.0)
        if r is not None:
            key += f @ r
        if f.shape[1]:
            peak = np.maximum(peak, np.maximum(f.max(axis=1), -f.min(axis=1)))
    return key, peak, nonfinite


def _pivot(a) -> float | None:
    """The largest-magnitude element of a float array (None if it is all zero, or not a
    finite float array): dividing by it makes equal-up-to-scale arrays equal."""
    a = np.asarray(a)
    if a.dtype.kind != "f" or a.size == 0 or not np.all(np.isfinite(a)):
        return None
    flat = a.reshape(-1).astype(np.float64)
    k = int(np.argmax(np.abs(flat)))
    return float(flat[k]) if flat[k] != 0 else None


def _whole_ratio(c: float, limit: float = 1e7) -> bool:
    """Is c (not 1) a whole number, or the reciprocal of one, up to float64 noise?"""
    if not np.isfinite(c) or c == 0 or abs(c - 1.0) <= 1e-9:
        return False
    for x in (c, 1.0 / c):
        if 1.0 <= abs(x) <= limit and abs(x - round(x)) <= 1e-9 * abs(x):
            return True
    return False


def _whole_ratios(c: np.ndarray, limit: float = 1e7) -> np.ndarray:
    """`_whole_ratio` of each element (a superset: callers check each hit with it)."""
    c = np.asarray(c, dtype=np.float64)
    with np.errstate(all="ignore"):
        ok = np.isfinite(c) & (c != 0) & (np.abs(c - 1.0) > 1e-9)
        hit = np.zeros(c.shape, dtype=bool)
        for x in (c, 1.0 / c):
            a = np.abs(x)
            hit |= (a >= 1.0) & (a <= limit) & (np.abs(x - np.round(x)) <= 2e-9 * a)
    return ok & hit


def _round_ratio(c: float) -> float:
    """c snapped to the exact whole number or reciprocal it is close to."""
    return float(round(c)) if abs(c) >= 1.0 else 1.0 / round(1.0 / c)


def largest_first(per_device: list, magnitudes: list[float] | None = None) -> list[int]:
    """Device numbers, the one with the largest values (over its runs) first: the order in
    which to ask whether every device's value matches (a device holding zeros matches
    many tiles, one holding data usually none, which settles the question).
    `magnitudes`: each device's `_magnitude`, when known."""
    if magnitudes is None:
        magnitudes = [_magnitude(arrays) for arrays in per_device]
    return sorted(range(len(per_device)), key=lambda d: -magnitudes[d])


def _tiny(magnitude: float) -> bool:
    """Is a value of this largest magnitude TINY (zeros are not: they equal zero tiles)?"""
    return 0.0 < magnitude < TINY


def _magnitude(arrays: list) -> float:
    """The largest magnitude in one device's value over every run (0 for non-floats; inf
    when an element is inf or NaN). Asked for every device of every stage: array methods,
    not numpy's function wrappers (2.5 times cheaper on small tiles)."""
    out = 0.0
    for a in arrays:
        if type(a) is not np.ndarray:
            a = np.asarray(a)
        if a.size and a.dtype.kind == "f":
            m = float(np.abs(a).max())
            if not math.isfinite(m):
                return math.inf
            if m > out:
                out = m
    return out


def mesh_groups(n: int) -> list[tuple[tuple[int, ...], ...]]:
    """Every way to group n devices along the axes of a row-major mesh with n devices
    (each factorisation of n into axis sizes, each non-empty subset of its axes): the
    candidate groups of a partial sum."""
    shapes: list[tuple[int, ...]] = []

    def factor(rest: int, prefix: tuple[int, ...]) -> None:
        if rest == 1:
            if prefix:
                shapes.append(prefix)
            return
        for f in range(2, rest + 1):
            if rest % f == 0:
                factor(rest // f, prefix + (f,))

    factor(n, ())
    seen: set = set()
    out = []
    ids = np.arange(n)
    for shape in shapes:
        grid = ids.reshape(shape)
        for k in range(1, len(shape) + 1):
            for axes in itertools.combinations(range(len(shape)), k):
                rest = [a for a in range(len(shape)) if a not in axes]
                moved = np.transpose(grid, rest + list(axes)).reshape(
                    -1, int(np.prod([shape[a] for a in axes]))
                )
                groups = tuple(sorted(tuple(int(x) for x in row) for row in moved))
                if groups not in seen:
                    seen.add(groups)
                    out.append(groups)
    return out
