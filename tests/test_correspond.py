"""Correspondences between per-device values and spec values are found from numbers alone."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tv_ir.prover.correspond import TileIndex, tiles
from tv_ir.prover.simulate import Trace


def test_tiles() -> None:
    assert tiles((4, 6), (2, 3)) == [
        ((0, 2), (0, 3)),
        ((0, 2), (3, 6)),
        ((2, 4), (0, 3)),
        ((2, 4), (3, 6)),
    ]
    assert tiles((4, 6), (3, 3)) is None


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2), (4, 2), (1, 8), (8, 1)]),
    st.permutations(range(8)),
    st.integers(0, 2**32 - 1),
)
def test_sharded_values_are_found_in_any_device_order(grid, order, seed) -> None:
    rng = np.random.default_rng(seed)
    spec = {
        1: rng.standard_normal((8, 8)),
        2: rng.standard_normal((8, 8)),
        3: rng.standard_normal((8, 4)),
    }
    traces = [Trace(values=spec)]
    index = TileIndex(traces, {k: v.shape for k, v in spec.items()}, {1: 0, 2: 1, 3: 2})
    local = (8 // grid[0], 8 // grid[1])
    boxes = tiles((8, 8), local)
    n = len(boxes)
    per_device = [[spec[2][tuple(slice(a, b) for a, b in boxes[order[d] % n])]] for d in range(8)]
    found = index.candidates(per_device)
    assert found and found[0].spec_value == 2
    for d in range(8):
        assert np.array_equal(found[0].block(spec[2], d), per_device[d][0])


def test_no_correspondence_when_one_device_differs() -> None:
    rng = np.random.default_rng(0)
    spec = {1: rng.standard_normal((4, 4))}
    index = TileIndex([Trace(values=spec)], {1: (4, 4)}, {1: 0})
    per_device = [[spec[1][:2]], [spec[1][2:] + 1.0]]
    assert index.candidates(per_device) == []
