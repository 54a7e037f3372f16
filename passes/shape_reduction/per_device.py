"""Integers known on every device, held once per distinct value.

Shape reduction folds the integers a program computes from constants and `partition_id`
on every device of the real mesh (rules.py: offsets, shard starts, a device's coordinate).
Devices share few distinct values (a coordinate along an axis takes as many values as the
axis has positions), so a value is held as its distinct values and, per device, which of
them it holds; an op is evaluated once per distinct combination of its operands' values,
and an elementwise op over all of those combinations at once. What this costs follows the
number of distinct values, not the number of devices: 8,192 devices whose coordinates take
512 values fold 512 values, not 8,192 (only `partition_id` itself has one per device).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from tv_ir.ir.program import TensorType


class PerDevice:
    """Device d holds `values[which[d]]`; `values` are distinct, in the order of the first
    device holding each. Values folded together are held as the rows of one array (`rows`),
    read as a list only when asked (8,192 devices can hold 8,192 distinct offsets)."""

    __slots__ = ("_values", "rows", "which")

    def __init__(self, values: Sequence[np.ndarray] | np.ndarray, which: np.ndarray):
        self.rows = values if isinstance(values, np.ndarray) else None
        self._values = None if self.rows is not None else list(values)
        self.which = which

    @property
    def values(self) -> list[np.ndarray]:
        if self._values is None:
            self._values = list(self.rows)
        return self._values

    @property
    def count(self) -> int:
        """How many distinct values devices hold."""
        return len(self.rows) if self.rows is not None else len(self._values)

    @classmethod
    def same(cls, value: np.ndarray, devices: int) -> PerDevice:
        """One value on every device."""
        return cls([value], np.zeros(devices, dtype=np.intp))

    @classmethod
    def of(cls, arrays: Sequence[np.ndarray]) -> PerDevice:
        """From one array per device (equal arrays held once)."""
        return _distinct([np.asarray(a) for a in arrays], np.arange(len(arrays)))

    def __len__(self) -> int:
        return len(self.which)

    def __getitem__(self, device: int) -> np.ndarray:
        if self.rows is not None:
            return self.rows[self.which[device]]
        return self.values[self.which[device]]

    def per_device(self) -> list[np.ndarray]:
        """One array per device (shared where devices hold the same value)."""
        return [self.values[i] for i in self.which]

    def mapped(self, fn: Callable[[np.ndarray], np.ndarray]) -> PerDevice:
        """fn applied to each distinct value (fn must be injective: a broadcast view)."""
        return PerDevice([fn(v) for v in self.values], self.which)

    def stacked(self) -> np.ndarray:
        """The distinct values as the rows of one array (they have one shape and dtype)."""
        if self.rows is None:
            self.rows = np.stack([np.asarray(v) for v in self._values])
        return self.rows

    def scalars(self) -> list[int] | None:
        """The distinct values as numbers when each is one number (a scalar, or a scalar
        broadcast), else None."""
        if self.rows is not None and self.rows.dtype != object:
            flat = self.rows.reshape(len(self.rows), -1)
            if flat.shape[1] == 0 or (flat.shape[1] > 1 and (flat != flat[:, :1]).any()):
                return None
            return [int(x) for x in flat[:, 0].tolist()]
        arrays = [np.asarray(v) for v in self.values]
        if arrays and all(a.ndim == 0 and a.dtype != object for a in arrays):
            return [int(x) for x in np.array(arrays).tolist()]  # one per device: read at once
        out = []
        for a in arrays:
            if a.size == 0:
                return None
            first = a.flat[0]
            # a broadcast scalar (strides 0) holds one number without comparing its elements
            if any(a.strides) and np.any(a != first):
                return None
            out.append(int(first))
        return out


def combinations(operands: Sequence[PerDevice]) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The distinct combinations of the operands' values that devices hold (as indices into
    each operand's `values`, in the order of the first device holding each), and which
    combination each device holds."""
    devices = len(operands[0]) if operands else 0
    if not operands:
        return [()], np.zeros(devices, dtype=np.intp)
    if len(operands) == 1:
        return [(i,) for i in range(operands[0].count)], operands[0].which
    key = np.zeros(devices, dtype=np.int64)
    for x in operands:  # mixed radix over the operands' value counts
        key = key * x.count + x.which
    first, which = first_seen(key, math.prod(x.count for x in operands))
    held = np.stack([x.which for x in operands], axis=1)[first]
    return list(map(tuple, held.tolist())), which


def first_seen(key: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """(where each distinct key first appears, in the order they first appear; each
    element's rank in that order), for keys in [0, bound): through a table of `bound`
    entries when that is not much larger than the keys, else by sorting them."""
    n = len(key)
    if bound > 4 * n + 1024:
        return _first_seen_sorting(key)
    seen = np.full(bound, n, dtype=np.intp)
    np.minimum.at(seen, key, np.arange(n, dtype=np.intp))
    present = np.flatnonzero(seen < n)
    order = np.argsort(seen[present], kind="stable")
    rank = np.empty(bound, dtype=np.intp)
    rank[present[order]] = np.arange(len(present), dtype=np.intp)
    return seen[present[order]], rank[key]


def results(per_combination: list[list[np.ndarray]], which: np.ndarray) -> list[PerDevice]:
    """Each result of an op evaluated once per combination (`combinations`), per device."""
    count = len(per_combination[0]) if per_combination else 0
    return [_distinct([out[k] for out in per_combination], which) for k in range(count)]


def stacked_results(outs: Sequence[np.ndarray], which: np.ndarray) -> list[PerDevice]:
    """`results` of results stacked along a leading dimension, one row per combination."""
    return [_distinct(x, which) for x in outs]


def batched(
    types: Sequence[TensorType],
    operands: Sequence[PerDevice],
    combos: list[tuple[int, ...]],
    elementwise: bool = True,
) -> tuple[list[np.ndarray], Callable[[TensorType], TensorType]] | None:
    """Operands stacked along a new leading dimension, one row per combination, for an op
    that maps rows to rows (an elementwise op only when its operands and results all have
    one shape: a scalar operand beside a tensor, as `select` and `clamp` allow, is not
    stacked: None); and the map from a type to its stacked type."""
    if not all(isinstance(t, TensorType) for t in types):
        return None
    if elementwise and len({tuple(t.shape) for t in types}) != 1:
        return None
    m = len(combos)
    picks = np.array(combos, dtype=np.intp).reshape(m, len(operands))
    stacked = [x.stacked()[picks[:, i]] for i, x in enumerate(operands)]
    return stacked, lambda t: TensorType((m, *t.shape), t.dtype)


def table_rows(
    table: np.ndarray, starts: Sequence[PerDevice], combos: list[tuple[int, ...]], sizes
) -> np.ndarray:
    """`dynamic_slice(table, *starts)` for every combination at once (the table is the same
    for all; `combos` index the table, then each start): one row per combination. Starts
    are clamped into the table as the op clamps them (`start_indices`)."""
    from tv_ir.semantics.ops.shape import start_indices

    picks = np.array(combos, dtype=np.intp).reshape(len(combos), 1 + len(starts))
    wanted = [  # each start operand's value in each combination
        x.stacked().reshape(-1).astype(np.int64)[picks[:, 1 + i]] for i, x in enumerate(starts)
    ]
    at = start_indices(table.shape, sizes, wanted)
    index = []
    for i, n in enumerate(sizes):
        shape = [len(combos)] + [n if j == i else 1 for j in range(len(sizes))]
        index.append((at[i][:, None] + np.arange(n)).reshape(shape))
    return table[tuple(index)]


def _distinct(arrays: list[np.ndarray] | np.ndarray, which: np.ndarray) -> PerDevice:
    """`arrays[which[d]]` on device d, equal arrays (byte for byte) held once (`arrays`: a
    list, or one array whose rows they are). `which` numbers the arrays in the order of the
    first device holding each (as `combinations` does), so the distinct ones, numbered in
    the order they first appear among the arrays, are in that order too."""
    values, relabel = _labelled(arrays)
    return PerDevice(values, relabel[which])


# elements stacked at once to compare arrays (broadcast views are materialised there)
STACK_LIMIT = 1 << 22


def _labelled(
    arrays: list[np.ndarray] | np.ndarray,
) -> tuple[list[np.ndarray] | np.ndarray, np.ndarray]:
    """(the distinct arrays, byte for byte, in order of first appearance (the rows of one
    array when `arrays` is one); each array's index among them). Arrays of one shape and
    dtype (or rows of one array) are compared in one numpy step."""
    if isinstance(arrays, np.ndarray):
        one_kind, stack = len(arrays) > 1, (lambda: arrays)
    else:
        one_kind = len(arrays) > 1 and len({(a.dtype.str, a.shape) for a in arrays}) == 1
        stack = lambda: np.stack(arrays)  # noqa: E731
    if one_kind and arrays[0].size * len(arrays) <= STACK_LIMIT:
        rows = np.ascontiguousarray(stack().reshape(len(arrays), -1))
        if rows.shape[1] and rows.dtype != object:
            keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1])))
            firsts, labels = _first_seen_sorting(keys.reshape(-1))
            kept = arrays[firsts] if isinstance(arrays, np.ndarray) else [arrays[i] for i in firsts]
            return kept, labels
    label: dict[bytes, int] = {}
    values: list[np.ndarray] = []
    relabel = np.empty(len(arrays), dtype=np.intp)
    for k, a in enumerate(arrays):
        key = a.dtype.str.encode() + a.tobytes()
        if key not in label:
            label[key] = len(values)
            values.append(a)
        relabel[k] = label[key]
    return values, relabel


def _first_seen_sorting(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`first_seen` for keys of any range (or byte strings), by sorting them."""
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # the distinct keys by first appearance
    rank = np.empty(len(order), dtype=np.intp)
    rank[order] = np.arange(len(order))
    return first[order], rank[inverse.reshape(-1)]
