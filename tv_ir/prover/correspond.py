"""Find how a per-device implementation value corresponds to a spec value, from simulation.

A correspondence says: on every device d, the implementation's local value equals the block
`box[d]` of one spec value (the whole value when replicated). Blocks are the tiles of the
local shape inside the spec value's shape, so a value sharded along any mesh axes, in any
device order, or replicated, is found by hashing tiles. The numbers decide; nothing here
reads sharding annotations.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

import numpy as np

from .simulate import Trace, close

Box = tuple[tuple[int, int], ...]  # (start, stop) per dimension


@dataclass(frozen=True)
class Correspondence:
    spec_value: int  # spec value id
    boxes: tuple[Box, ...]  # one per device

    def block(self, array, device: int):
        """The part of a spec-shaped array that `device` holds."""
        return np.asarray(array)[box_index(self.boxes[device])]


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


class TileIndex:
    """Spec values cut into tiles of a given local shape, keyed by a random projection."""

    def __init__(self, traces: list[Trace], shapes: dict[int, tuple], order: dict[int, int]):
        self.traces = traces
        self.shapes = shapes
        self.order = order
        self._by_local: dict[tuple, list[tuple[float, int, Box]]] = {}

    def _project(self, local: tuple, arrays) -> tuple[float, float] | None:
        """A random projection of the arrays, and the magnitude it has to be compared at."""
        r = np.random.default_rng(abs(hash(local)) & 0xFFFF).standard_normal(
            int(np.prod(local, dtype=np.int64))
        )
        total = mag = 0.0
        for a in arrays:
            a = np.asarray(a)
            if a.dtype.kind not in "fiub":
                return None
            a = np.nan_to_num(a.astype(np.float64).reshape(-1), nan=0.0, posinf=0.0, neginf=0.0)
            total += float(r @ a)
            mag += float(np.abs(r) @ np.abs(a))
        return total, mag

    def _index(self, local: tuple) -> list[tuple[float, int, Box]]:
        idx = self._by_local.get(local)
        if idx is None:
            idx = []
            for vid, shape in self.shapes.items():
                boxes = tiles(tuple(shape), local)
                if boxes is None or vid not in self.traces[0].values:
                    continue
                for box in boxes:
                    sl = box_index(box)
                    key = self._project(local, [tr.values[vid][sl] for tr in self.traces])
                    if key is not None:
                        idx.append((key[0], vid, box))
            idx.sort(key=lambda e: e[0])
            self._by_local[local] = idx
        return idx

    def _matches(self, local: tuple, arrays) -> list[tuple[int, Box]]:
        key = self._project(local, arrays)
        if key is None:
            return []
        idx = self._index(local)
        tol = 1e-7 * (1.0 + key[1])
        lo = bisect.bisect_left(idx, key[0] - tol, key=lambda e: e[0])
        out = []
        for k, vid, box in idx[lo:]:
            if k > key[0] + tol:
                break
            sl = box_index(box)
            if all(close(a, tr.values[vid][sl]) for a, tr in zip(arrays, self.traces, strict=True)):
                out.append((vid, box))
        return out

    def candidates(self, per_device: list[list], limit: int = 4) -> list[Correspondence]:
        """Correspondences for a value given, per device, its arrays in every simulation run
        (`limit` 0: all of them), earliest spec value first."""
        local = tuple(np.shape(per_device[0][0]))
        found: dict[int, list[Box]] | None = None
        for d, arrays in enumerate(per_device):
            here: dict[int, Box] = {}
            for vid, box in self._matches(local, arrays):
                here.setdefault(vid, box)  # equal tiles: any one of them will do
            if d == 0:
                found = {vid: [box] for vid, box in here.items()}
            else:
                found = {vid: boxes + [here[vid]] for vid, boxes in found.items() if vid in here}
            if not found:
                return []
        ordered = sorted(found, key=lambda v: self.order.get(v, 0))
        return [Correspondence(v, tuple(found[v])) for v in (ordered[:limit] if limit else ordered)]


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
