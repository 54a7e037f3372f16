"""Correspondences between per-device values and spec values are found from numbers alone."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tv_ir.prover.correspond import ALTERNATIVES, TileIndex, tiles
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


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), loose=st.booleans())
def test_the_index_finds_every_value_a_tile_of_which_a_value_is(seed, loose) -> None:
    """Tiles are projected and grouped a value at a time (numpy): every tile, queried,
    finds what comparing it with every spec tile one by one finds (the values; boxes that
    are tiles equal to it; at most ALTERNATIVES per value and tile shape)."""
    from tv_ir.semantics.closeness import close_elementwise

    rng = np.random.default_rng(seed)
    shapes = {1: (4, 6), 2: (2, 3, 4), 3: (6,), 4: (), 5: (4, 1, 6), 6: (2, 4)}
    traces = []
    for _ in range(2):
        values = {v: rng.integers(-2, 3, size=s).astype(np.float64) for v, s in shapes.items()}
        values[6] = rng.integers(0, 3, size=(2, 4))  # integers
        values[1][0, :2] = [np.inf, np.nan]  # non-finite elements project as zeros
        traces.append(Trace(values=values))
    order = {v: k for k, v in enumerate(shapes)}
    for local in [(2, 3), (2,), (1,), (), (4, 6), (6, 4), (1, 2), (2, 1, 3), (24,)]:
        index = TileIndex(traces, shapes, order, loose_rank=loose)
        every = index._tiles(local)
        for _, _, arrays in every:
            slow = [
                (vid, box)
                for vid, box, other in every
                if all(close_elementwise(a, b) for a, b in zip(arrays, other, strict=True))
            ]
            fast = index.tile_matches(arrays)
            assert {v for v, _ in fast} == {v for v, _ in slow}
            assert set(fast) <= set(slow)
            per_shape: dict = {}
            for vid, box in fast:
                key = (vid, tuple(b - a for a, b in box))
                per_shape[key] = per_shape.get(key, 0) + 1
            assert max(per_shape.values()) <= ALTERNATIVES * 2  # one group per run pattern
            assert index.holds_tile(arrays)


def test_tile_boxes_are_those_tiles_lists() -> None:
    from tv_ir.prover.correspond import tile_box

    for shape, tile in [((4, 6), (2, 3)), ((2, 3, 4), (1, 3, 2)), ((), ()), ((6,), (1,))]:
        boxes = tiles(shape, tile)
        assert [tile_box(shape, tile, i) for i in range(len(boxes))] == boxes


def _per_tile_norm_index(index: TileIndex, local: tuple) -> list:
    """The scale-free index as tiles one at a time give it: (key, value, box, pivot)."""
    from tv_ir.prover.correspond import _pivot

    out = []
    for vid, box, arrays in index._tiles(local):
        pivot = _pivot(arrays[0])
        if pivot is not None:
            key = index._project(local, [np.asarray(a, dtype=np.float64) / pivot for a in arrays])
            out.append((key[0], vid, box, pivot))
    return sorted(out, key=lambda e: e[0])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), loose=st.booleans())
def test_the_scale_free_index_normalises_all_tiles_at_once_as_one_by_one(seed, loose) -> None:
    from tv_ir.prover.correspond import tile_box

    rng = np.random.default_rng(seed)
    shapes = {1: (4, 6), 2: (2, 3, 4), 3: (6,), 4: (), 5: (4, 1, 6), 6: (2, 4)}
    traces = []
    for _ in range(2):
        values = {v: rng.integers(-2, 3, size=s).astype(np.float64) for v, s in shapes.items()}
        values[6] = rng.integers(0, 3, size=(2, 4))  # integers: no pivot
        values[1][0, :2] = [np.inf, np.nan]  # a tile with non-finite elements: no pivot
        traces.append(Trace(values=values))
    order = {v: k for k, v in enumerate(shapes)}
    for local in [(2, 3), (2,), (1,), (), (4, 6), (6, 4), (1, 2), (2, 1, 3), (24,)]:
        index = TileIndex(traces, shapes, order, loose_rank=loose)
        idx = index._norm_index(local)
        fast = sorted(
            (
                int(idx.vids[e]),
                tile_box(
                    shapes[int(idx.vids[e])], idx.tiles[int(idx.tile_of[e])], int(idx.rows[e])
                ),
                float(idx.pivots[e]),
                float(idx.keys[e]),
            )
            for e in range(len(idx.keys))
        )
        slow = sorted(
            (vid, box, pivot, key) for key, vid, box, pivot in _per_tile_norm_index(index, local)
        )
        assert [f[:3] for f in fast] == [s[:3] for s in slow]
        assert np.allclose([f[3] for f in fast], [s[3] for s in slow])


def test_a_value_off_by_a_factor_is_found_among_many_equal_constant_tiles() -> None:
    """A constant spec value has as many equal normalised tiles as elements: the factor of a
    constant device value is found once per spec value, not once per tile."""
    spec = {1: np.full((64, 64), 0.5), 2: np.arange(8.0)}
    index = TileIndex([Trace(values=spec)], {1: (64, 64), 2: (8,)}, {1: 0, 2: 1}, loose_rank=True)
    assert index.scale_of([[np.full((4,), 2.0)], [np.full((4,), 2.0)]]) == 4.0
    assert index.scale_of([[np.arange(4.0) * 3]]) == 3.0
    found = index._scaled_matches((4,), [np.full((4,), 2.0)])
    assert [(vid, c) for vid, _, c in found] == [(1, 4.0)]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_the_values_held_are_those_every_candidate_names(seed) -> None:
    """`values_held` (localisation's record of which spec values have a counterpart) names
    the spec values of `candidates(limit=0)`, zeros matching many values included."""
    rng = np.random.default_rng(seed)
    shapes = {1: (4, 6), 2: (2, 3, 4), 3: (6,), 4: (4, 1, 6), 5: (8, 6)}
    values = {v: rng.integers(-1, 2, size=s).astype(np.float64) for v, s in shapes.items()}
    values[5][:4] = 0.0
    index = TileIndex([Trace(values=values)], shapes, {v: v for v in shapes}, loose_rank=True)
    v1, v2, v3, v5 = values[1], values[2], values[3], values[5]
    cases = [
        [v1[:2], v1[2:]],
        [v2[0], v2[1]],
        [v3, v3],
        [v5[:4], v5[4:]],  # zeros: a tile of many values
        [v1[:, :1], v1[:, 1:2]],
        [np.zeros((4, 6)), np.zeros((4, 6))],
    ]
    for tiles_ in cases:
        per_device = [[t] for t in tiles_]
        named = {c.spec_value for c in index.candidates(per_device, limit=0)}
        assert index.values_held(per_device) == named


def test_a_tiny_value_finds_its_own_tile_before_earlier_near_zero_ones() -> None:
    """Matching floors the scale at 1, so a value of tiny elements (MaxText's query-kernel
    gradient behind a saturated softmax, ~1e-12) equals every near-zero tile; five earlier
    spec values of such tiles came first, and its own was not among the four tried."""
    rng = np.random.default_rng(0)
    own = 1e-12 * rng.standard_normal((4, 4))
    spec = {k: 1e-11 * rng.standard_normal((4, 4)) for k in range(1, 6)}
    spec[6] = own
    index = TileIndex([Trace(values=spec)], {k: (4, 4) for k in spec}, {k: k for k in spec})
    per_device = [[own[:2]], [own[2:]]]
    found = index.candidates(per_device)
    assert found and found[0].spec_value == 6, [c.spec_value for c in found]


def test_a_tiny_value_is_not_matched_with_unrelated_tiles_by_the_floor_alone() -> None:
    """A backward value on a far pipeline stage of a DP-32 step was ~1e-9 (the loss share
    1/512 and 14 stages of gradients): under matching's floor at 1 it "equalled" an AdamW
    g*g tile of ~1e-11, whose spec expansion, tried as its cut, ran to 10 GB. Matches of a
    value that small count only at its own magnitude; its own tile is still found."""
    rng = np.random.default_rng(0)
    spec = {k: 1e-11 * rng.standard_normal((4, 4)) for k in range(1, 4)}
    spec[4] = 5e-10 * rng.uniform(-1, 1, (4, 4))
    index = TileIndex([Trace(values=spec)], {k: (4, 4) for k in spec}, {k: k for k in spec})
    stray = 5e-10 * rng.uniform(-1, 1, (2, 4))  # a tile of no spec value
    assert index.tile_matches([stray]) == []
    assert index.candidates([[stray], [stray]]) == []
    assert index.tile_matches([spec[4][2:]]) == [(4, ((2, 4), (0, 4)))]
    assert [c.spec_value for c in index.candidates([[spec[4][:2]], [spec[4][2:]]])] == [4]
    # a value of ordinary size still matches at the floor (noise of a cancelling sum)
    near = 1e-3 * rng.standard_normal((2, 4))
    spec[5] = np.concatenate([near + 1e-10, near])
    index = TileIndex([Trace(values=spec)], {k: (4, 4) for k in spec}, {k: k for k in spec})
    assert index.tile_matches([near]) == [(5, ((0, 2), (0, 4))), (5, ((2, 4), (0, 4)))]


def test_a_tiny_value_is_compared_only_with_tiles_of_its_own_magnitude(monkeypatch) -> None:
    """At DP 64 a pipeline step's backward values are ~1e-10: near zero, every tiny tile of
    the program shared their projection key and peak under the floor at 1, and each was
    compared element by element (20 s of a 60 s proof). They are sorted out at the
    value's own magnitude: its own tile is found, and the 300 others are not compared."""
    from tv_ir.prover import correspond

    rng = np.random.default_rng(0)
    spec = {k: 4e-10 * rng.standard_normal((4, 4)) for k in range(300)}
    index = TileIndex([Trace(values=spec)], {k: (4, 4) for k in spec}, {k: k for k in spec})
    compared = []
    real = correspond.close_elementwise
    monkeypatch.setattr(
        correspond, "close_elementwise", lambda a, b: compared.append(1) or real(a, b)
    )
    assert index.tile_matches([spec[7][2:]]) == [(7, ((2, 4), (0, 4)))]
    assert len(compared) <= 2, len(compared)


def test_an_idle_device_is_looked_up_only_among_the_values_a_busy_one_holds(monkeypatch) -> None:
    # a pipeline's idle stage holds zeros, a zero tile of every one of 60 zero spec values;
    # the busy device (looked up first, having the larger values) names the one value both
    # hold, and the idle one is matched against that value's tiles only
    from tv_ir.prover import correspond

    rng = np.random.default_rng(0)
    data = np.zeros((4, 4))
    data[2:] = rng.standard_normal((2, 4))  # rows 0-1: a zero tile of the value itself
    spec = {0: data, **{k: np.zeros((4, 4)) for k in range(1, 61)}}
    order = {k: k for k in spec}
    index = TileIndex([Trace(values=spec)], {k: v.shape for k, v in spec.items()}, order)
    boxed = []
    real_tile_box = correspond.tile_box

    def counted(*args):
        boxed.append(args)
        return real_tile_box(*args)

    monkeypatch.setattr(correspond, "tile_box", counted)
    (c,) = index.candidates([[data[:2]], [data[2:]]], limit=0)
    assert c.spec_value == 0
    assert c.boxes == (((0, 2), (0, 4)), ((2, 4), (0, 4)))
    assert len(boxed) < 10, len(boxed)  # before: a box for every zero tile of all 61 values


def test_zeros_are_matched_with_every_zero_tile_without_comparing_them(monkeypatch) -> None:
    # an idle pipeline stage's zeros equal a zero tile of every one of 300 spec values (a
    # 405B-shaped step's walk looked each up and compared it, minutes in all): all are
    # named, and none is compared element by element
    from tv_ir.prover import correspond

    rng = np.random.default_rng(0)
    spec = {k: np.zeros((4, 4)) for k in range(300)}
    spec[300] = rng.standard_normal((4, 4))
    index = TileIndex([Trace(values=spec)], {k: (4, 4) for k in spec}, {k: k for k in spec})
    compared = []
    real = correspond.close_elementwise
    monkeypatch.setattr(
        correspond, "close_elementwise", lambda a, b: compared.append(1) or real(a, b)
    )
    assert index.values_held([[np.zeros((2, 4))], [np.zeros((2, 4))]]) == set(range(300))
    assert compared == []
    # a value of tiny elements (1e-11: within the comparison's tolerance of zero, TINY) is
    # held by its own value only, looked up at its own magnitude among 400 zero and tiny
    # values (it was held by all of them); a value of ordinary size whose key falls among
    # them (made so) is compared with none of them
    tiny = {300 + k: 10.0 ** -(11 + k % 3) * rng.standard_normal((4, 4)) for k in range(100)}
    spec |= tiny
    index = TileIndex([Trace(values=spec)], {k: (4, 4) for k in spec}, {k: k for k in spec})
    own = tiny[305]
    assert index.values_held([[own[:2]], [own[2:]]]) == {305}
    assert len(compared) <= 2
    compared.clear()
    r, _ = index._direction((2, 4))
    odd = np.zeros((2, 4))
    odd[0, :2] = [r[1], -r[0]]  # projects to zero, peak ~1
    assert index.values_held([[odd], [odd]]) == set()
    assert compared == []


def test_local_shapes_differing_in_unit_dimensions_share_one_index() -> None:
    # localisation looks up (2, 2), (1, 2, 2) and (2, 1, 2) values: the same tiles, in the
    # same element order; one index is built for them (each took a pass over every spec
    # value), and each finds what the others find
    rng = np.random.default_rng(1)
    spec = {1: rng.standard_normal((4, 2)), 2: rng.standard_normal((2, 1, 2, 2))}
    index = TileIndex(
        [Trace(values=spec)], {k: v.shape for k, v in spec.items()}, {1: 0, 2: 1}, loose_rank=True
    )
    piece = spec[1][2:]
    found = [
        sorted(index.tile_matches([np.reshape(piece, local)]))
        for local in [(2, 2), (1, 2, 2), (2, 1, 2), (1, 2, 1, 2)]
    ]
    assert found[0] and all(f == found[0] for f in found)
    assert len(index._by_local) == 1


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_near_equal_tiles_of_tiny_and_large_values_are_all_found(seed) -> None:
    """The look-up drops tiles whose largest magnitude is not the value's before comparing:
    it finds every tile a one-by-one comparison finds, with values from 1e-12 to 1e6, copies
    perturbed within the comparison's tolerance, zeros and non-finite elements."""
    from tv_ir.semantics.closeness import close_elementwise

    rng = np.random.default_rng(seed)
    base = rng.standard_normal((4, 4)) * 10.0 ** rng.integers(-12, 7)
    values = {
        1: base,
        2: base + 4e-10 * rng.standard_normal((4, 4)),  # close at scale 1
        3: base * (1 + 4e-10),
        4: np.where(rng.random((4, 4)) < 0.5, 0.0, base),
        5: np.zeros((4, 4)),
        6: np.where(rng.random((4, 4)) < 0.2, np.inf, base),
    }
    shapes = {k: (4, 4) for k in values}
    index = TileIndex([Trace(values=values)], shapes, {k: k for k in values}, loose_rank=True)
    for local in [(2, 2), (4, 4), (1, 4)]:
        every = index._tiles(local)
        for _, _, arrays in every:
            slow = {
                vid
                for vid, _, other in every
                if all(close_elementwise(a, b) for a, b in zip(arrays, other, strict=True))
            }
            found = index._matches(tuple(np.shape(arrays[0])), arrays)  # (tile_matches
            assert {m[0] for m in found} == slow  # then drops a TINY value's floor matches)


def test_spec_values_of_one_shape_are_tiled_together_as_each_alone():
    """The tile index cuts the spec values of one shape and dtype together
    (`_tiles_projected`): each value's tiles, projections and peaks are what cutting it
    alone gives, to the bit (inf and NaN elements, integers, several tile shapes, several
    runs, chunks smaller than the values)."""
    from tv_ir.prover import correspond as C

    rng = np.random.default_rng(5)
    values_of = []
    for vid in range(7):
        shape = (4, 6) if vid % 3 else (2, 6)
        runs = [rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4) for _ in range(2)]
        if vid == 2:
            runs[1][0, 0], runs[0][1, 3] = np.inf, np.nan
        values_of.append((vid, shape, runs))
    values_of.append((7, (4, 6), [np.arange(24).reshape(4, 6)] * 2))
    local = (2, 3)
    r = np.random.default_rng(1).standard_normal(6)
    for stack_bytes in (C.STACK_BYTES, 200):  # one stack per shape, or a value at a time
        old = C.STACK_BYTES
        C.STACK_BYTES = stack_bytes
        try:
            together = C._tiles_projected(values_of, local, True, r)
        finally:
            C.STACK_BYTES = old
        for vid, shape, runs in values_of:
            for tile in C.tile_shapes(shape, local, True):
                alone = [C.tile_rows(v, tile) for v in runs]
                key, peak, nonfinite = C._projected(alone, r)
                got = together[(vid, tile)]
                np.testing.assert_array_equal(got[0], key)
                np.testing.assert_array_equal(got[1], peak)
                np.testing.assert_array_equal(got[2], nonfinite)
                for a, b in zip(got[3], alone, strict=True):
                    np.testing.assert_array_equal(a, b)
