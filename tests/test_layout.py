"""`Layout` against XLA's own placement of arrays on 8 CPU devices.

Oracles: `jax.device_put` with `GSPMDSharding` (HLO strings) and `NamedSharding` (sdy, via the
lowered module imported with `tv_ir.load`); XLA's partitioner placing a function result
(uneven shards, maximal, sub-axes, explicit `device_ids`); and a sharded dot with an unreduced
output (XLA leaves per-device partial sums). "Device" in a Layout is the partition id, i.e. the
position in the program's device assignment, so every test permutes the devices.
"""

from __future__ import annotations

import math
from functools import cache

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import tv_ir
from tv_ir.errors import BadInput, Unsupported
from tv_ir.ir.attrs import SdyAxis, SdyMesh, SdySharding
from tv_ir.semantics.layout import Layout

N = 8
DEVICES = jax.devices()
SETTINGS = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}


def factorizations(n: int, parts: int) -> list[tuple[int, ...]]:
    """Ordered factorizations of n into `parts` factors >= 1."""
    if parts == 1:
        return [(n,)]
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return [(d, *r) for d in divisors for r in factorizations(n // d, parts - 1)]


def in_bounds(buffer: np.ndarray, layout: Layout, p: int) -> np.ndarray:
    """The logical part of a (possibly padded) device buffer."""
    return np.asarray(buffer)[tuple(slice(0, n) for n in layout.local_shape(p))]


def check_placement(layout: Layout, arr: np.ndarray, shards: dict[int, np.ndarray]) -> None:
    """Each partition's shard is `layout.shard`; `assemble` gives `arr` back."""
    assert sorted(shards) == list(range(N))
    for p in layout.holders:
        assert np.array_equal(in_bounds(shards[p], layout, p), layout.shard(arr, p)), (layout, p)
        padded = layout.shard(arr, p, pad=0.0)
        assert padded.shape == layout.tile_shape
        assert np.array_equal(in_bounds(padded, layout, p), layout.shard(arr, p))
    per_device = [shards[p] for p in range(N)]
    assert np.array_equal(layout.assemble(per_device), arr)
    assert layout.replicas_agree(per_device)
    assert np.array_equal(layout.assemble([layout.shard(arr, p) for p in range(N)]), arr)


def jax_shards(x: jax.Array, order: list) -> dict[int, np.ndarray]:
    """Shard data by partition id (position of its device in `order`)."""
    return {order.index(s.device): np.asarray(s.data) for s in x.addressable_shards}


# -- XLA's partitioner placing a result: a module returning its replicated argument ---------


@cache
def _executable(text: str, order: tuple[int, ...], shardy: bool):
    from jax._src import compiler
    from jax._src.lib import xla_client as xc

    devs = [DEVICES[i] for i in order]
    opts = compiler.get_compile_options(
        num_replicas=1, num_partitions=N, device_assignment=np.array(devs).reshape(1, N)
    )
    opts.executable_build_options.use_shardy_partitioner = shardy
    return DEVICES[0].client.compile_and_load(text, xc.DeviceList(tuple(devs)), opts)


def xla_result_placement(
    arr: np.ndarray, result_attr: str, order: list[int], mesh: str = ""
) -> dict[int, np.ndarray]:
    """Per-partition device buffers of `return x` whose result has sharding `result_attr`."""
    t = "tensor<" + "".join(f"{d}x" for d in arr.shape) + "f32>"
    shardy = result_attr.startswith("sdy")
    arg = (
        "sdy.sharding = #sdy.sharding<@mesh, [" + ", ".join("{}" for _ in arr.shape) + "]>"
        if shardy
        else 'mhlo.sharding = "{replicated}"'
    )
    text = (
        f"module @m attributes {{mhlo.num_partitions = {N} : i32, mhlo.num_replicas = 1 : i32}}"
        " {\n"
        f"  {mesh}\n"
        f"  func.func public @main(%a: {t} {{{arg}}}) -> ({t} {{{result_attr}}}) {{\n"
        f"    return %a : {t}\n  }}\n}}\n"
    )
    exe = _executable(text, tuple(order), shardy)
    devs = [DEVICES[i] for i in order]
    x = jax.device_put(arr, NamedSharding(Mesh(np.array(devs), ("all",)), P()))
    outs = exe.execute_sharded([x]).disassemble_into_single_device_arrays()[0]
    return {devs.index(o.device): np.asarray(o) for o in outs}


# -- drawing HLO shardings ------------------------------------------------------------------


@st.composite
def hlo_shardings(draw, even: bool):
    """(sharding string, global shape): tiles, partial replication, any device order."""
    rank = draw(st.integers(1, 3))
    grid = draw(st.sampled_from(factorizations(N, rank + 1)))
    tiles, repl = grid[:rank], grid[rank]
    last = repl > 1 or draw(st.booleans())
    dims = list(tiles) + ([repl] if last else [])
    order = draw(st.sampled_from(["iota", "transposed", "explicit"]))
    if order == "iota":
        devices = f"<=[{N}]"
    elif order == "transposed":
        k = draw(st.integers(2, 3))
        reshape = draw(st.sampled_from([f for f in factorizations(N, k) if 1 not in f]))
        perm = draw(st.permutations(range(len(reshape))))
        devices = f"<=[{','.join(map(str, reshape))}]T({','.join(map(str, perm))})"
    else:
        devices = ",".join(map(str, draw(st.permutations(range(N)))))
    text = f"{{devices=[{','.join(map(str, dims))}]{devices}"
    text += " last_tile_dim_replicate}" if last else "}"
    if even:
        shape = tuple(t * draw(st.integers(1, 3)) for t in tiles)
    else:
        shape = tuple(draw(st.integers(1, 9)) for _ in tiles)
    return text, shape


@settings(max_examples=40, **SETTINGS)
@given(hlo_shardings(even=True), st.permutations(range(N)), st.integers(0, 2**31))
def test_hlo_sharding_matches_device_put(case, order, seed) -> None:
    from jax._src import sharding_impls as si
    from jax._src.lib import xla_client as xc

    text, shape = case
    arr = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    devs = [DEVICES[i] for i in order]
    x = jax.device_put(arr, si.GSPMDSharding(devs, xc.HloSharding.from_string(text)))
    layout = Layout.from_hlo_sharding(text, shape, N)
    check_placement(layout, arr, jax_shards(x, devs))


@settings(max_examples=30, **SETTINGS)
@given(hlo_shardings(even=False), st.permutations(range(N)))
def test_hlo_sharding_uneven_matches_xla_partitioner(case, order) -> None:
    text, shape = case
    arr = np.arange(math.prod(shape), dtype=np.float32).reshape(shape) + 1
    layout = Layout.from_hlo_sharding(text, shape, N)
    check_placement(layout, arr, xla_result_placement(arr, f'mhlo.sharding = "{text}"', order))


@settings(max_examples=60, **SETTINGS)
@given(st.one_of(hlo_shardings(even=True), hlo_shardings(even=False)))
def test_box_array_and_distinct_boxes_are_the_boxes(case) -> None:
    # built from the tiling's own arrays (`_tiled`), or converted once per box object: the
    # same boxes as the tuples, and the distinct ones in the order devices first hold them
    text, shape = case
    layout = Layout.from_hlo_sharding(text, shape, N)
    want = np.asarray(layout.boxes, dtype=np.int64).reshape(N, len(shape), 2)
    np.testing.assert_array_equal(layout.box_array, want)
    assert layout.distinct_boxes == list(dict.fromkeys(layout.boxes))
    again = Layout(layout.global_shape, N, layout.boxes, layout.tile_shape)  # no cache given
    np.testing.assert_array_equal(again.box_array, want)
    assert again.distinct_boxes == layout.distinct_boxes


@pytest.mark.parametrize("device", [0, 3, 7])
def test_maximal_matches_xla_partitioner(device: int) -> None:
    arr = np.arange(15, dtype=np.float32).reshape(3, 5)
    text = f"{{maximal device={device}}}"
    layout = Layout.from_hlo_sharding(text, arr.shape, N)
    assert layout.maximal == device and layout.holders == (device,)
    check_placement(
        layout, arr, xla_result_placement(arr, f'mhlo.sharding = "{text}"', [*range(N)])
    )


def test_uneven_boxes_follow_xla() -> None:
    # 7 rows over 4 shards: ceil(7/4) = 2 -> 2,2,2,1; 3 rows over 4 shards: 1,1,1,0
    lay = Layout.from_hlo_sharding("{devices=[4,2]<=[8]}", (7, 3), N)
    assert lay.tile_shape == (2, 2)
    assert lay.box(7) == ((6, 7), (2, 3)) and lay.local_shape(7) == (1, 1)
    lay = Layout.from_hlo_sharding("{devices=[4,1,2]<=[8] last_tile_dim_replicate}", (3, 5), N)
    assert lay.box(6) == ((3, 3), (0, 5)) and lay.local_shape(6) == (0, 5)


# -- sdy: NamedSharding lowered by jax, imported by tv_ir --------------------------------------


@st.composite
def named_shardings(draw):
    """(mesh axis sizes, partition spec entries): each dim gets an ordered subset of axes."""
    k = draw(st.integers(1, 3))
    sizes = draw(st.sampled_from(factorizations(N, k)))
    names = [f"ax{i}" for i in range(k)]
    rank = draw(st.integers(1, 3))
    free = list(names)
    spec = []
    for _ in range(rank):
        n = draw(st.integers(0, min(2, len(free))))
        axes = draw(st.permutations(free))[:n]
        free = [a for a in free if a not in axes]
        spec.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return dict(zip(names, sizes, strict=True)), spec


def lowered_sdy(s: NamedSharding, arr: np.ndarray):
    """(SdySharding, meshes) as tv_ir imports them from `jit(identity).lower(...)`."""
    text = jax.jit(lambda x: x, in_shardings=s).lower(arr).as_text()
    module = tv_ir.load(text)
    return module.main.arg_attrs[0]["sdy.sharding"], module.attrs["sdy.meshes"]


def shard_count(axes: dict[str, int], entry) -> int:
    if entry is None:
        return 1
    return math.prod(axes[a] for a in ((entry,) if isinstance(entry, str) else entry))


@settings(max_examples=30, **SETTINGS)
@given(named_shardings(), st.permutations(range(N)), st.data())
def test_sdy_sharding_matches_device_put(case, order, data) -> None:
    axes, spec = case
    devs = [DEVICES[i] for i in order]
    mesh = Mesh(np.array(devs).reshape(tuple(axes.values())), tuple(axes))
    shape = tuple(shard_count(axes, e) * data.draw(st.integers(1, 2)) for e in spec)
    arr = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    s = NamedSharding(mesh, P(*spec))
    sharding, meshes = lowered_sdy(s, arr)
    assert isinstance(sharding, SdySharding) and isinstance(meshes[sharding.mesh], SdyMesh)
    assert meshes[sharding.mesh].axes == tuple(axes.items())
    layout = Layout.from_sdy(sharding, meshes, shape)
    check_placement(layout, arr, jax_shards(jax.device_put(arr, s), list(mesh.devices.flat)))


@settings(max_examples=20, **SETTINGS)
@given(named_shardings(), st.permutations(range(N)), st.data())
def test_sdy_sharding_uneven_matches_xla_partitioner(case, order, data) -> None:
    """Uneven dims: XLA's placement for the HloSharding jax derives from the same spec."""
    axes, spec = case
    mesh = Mesh(np.array([DEVICES[i] for i in order]).reshape(tuple(axes.values())), tuple(axes))
    s = NamedSharding(mesh, P(*spec))
    even = tuple(shard_count(axes, e) for e in spec)
    sharding, meshes = lowered_sdy(s, np.zeros(even, np.float32))
    shape = tuple(data.draw(st.integers(1, 9)) for _ in spec)
    arr = np.arange(math.prod(shape), dtype=np.float32).reshape(shape) + 1
    hlo = str(s._to_xla_hlo_sharding(len(shape)))
    layout = Layout.from_sdy(sharding, meshes, shape)
    shards = xla_result_placement(arr, f'mhlo.sharding = "{hlo}"', order)
    check_placement(layout, arr, shards)


# -- sdy: explicit device_ids and sub-axes, placed by XLA's Shardy partitioner ------------------


@st.composite
def sdy_texts(draw):
    """(mesh text, sharding text, shape) with sub-axes and a permuted device_ids list."""
    k = draw(st.integers(1, 3))
    sizes = draw(st.sampled_from([f for f in factorizations(N, k) if 1 not in f]))
    names = [f"m{i}" for i in range(k)]
    pieces = []  # (name, pre_size, size, whole): whole axes, or an axis split in 2 or 3 factors
    for name, size in zip(names, sizes, strict=True):
        splits = [(size,)] + factorizations(size, 2) + factorizations(size, 3)
        split = draw(st.sampled_from([f for f in splits if 1 not in f]))
        pre = 1
        for f in split:
            pieces.append((name, pre, f, len(split) == 1))
            pre *= f
    pieces = draw(st.permutations(pieces))
    rank = draw(st.integers(1, 3))
    dims: list[list] = [[] for _ in range(rank)]
    for piece in pieces:
        i = draw(st.integers(-1, rank - 1))  # -1: not used (replicated)
        if i >= 0:
            dims[i].append(piece)
    for axes in dims:  # Shardy rejects adjacent sub-axes that merge into one
        for (n1, p1, s1, _), (n2, p2, _, _) in zip(axes, axes[1:], strict=False):
            assume(n1 != n2 or p2 != p1 * s1)
    shape = [math.prod(f for _, _, f, _ in axes) * draw(st.integers(1, 2)) for axes in dims]
    ids = draw(st.permutations(range(N)))
    ids_text = f", device_ids=[{', '.join(map(str, ids))}]" if list(ids) != [*range(N)] else ""
    mesh = "<[" + ", ".join(f'"{n}"={s}' for n, s in zip(names, sizes, strict=True)) + "]"

    def ref(piece) -> str:
        name, pre, size, whole = piece
        return f'"{name}"' if whole else f'"{name}":({pre}){size}'

    sharding = "<@mesh, [" + ", ".join("{" + ", ".join(map(ref, d)) + "}" for d in dims) + "]>"
    return f"sdy.mesh @mesh = {mesh}{ids_text}>", sharding, tuple(shape)


@settings(max_examples=25, **SETTINGS)
@given(sdy_texts())
def test_sdy_device_ids_and_sub_axes_match_xla_partitioner(case) -> None:
    mesh_text, sharding_text, shape = case
    arr = np.arange(math.prod(shape), dtype=np.float32).reshape(shape) + 1
    t = "tensor<" + "".join(f"{d}x" for d in shape) + "f32>"
    module = tv_ir.load(
        f"module {{\n  {mesh_text}\n  func.func @main(%a: {t} "
        f"{{sdy.sharding = #sdy.sharding{sharding_text}}}) -> {t} {{\n"
        f"    return %a : {t}\n  }}\n}}\n"
    )
    sharding = module.main.arg_attrs[0]["sdy.sharding"]
    meshes = module.attrs["sdy.meshes"]
    assert str(sharding) == sharding_text
    assert mesh_text == f"sdy.mesh @mesh = {meshes['mesh']}"
    layout = Layout.from_sdy(sharding, meshes, shape)
    result = f"sdy.sharding = #sdy.sharding{sharding_text}"
    check_placement(layout, arr, xla_result_placement(arr, result, [*range(N)], mesh_text))


# -- unreduced: XLA's partial sums from a dot with an unreduced output -----------------------


@settings(max_examples=12, **SETTINGS)
@given(st.sampled_from([(2, 4), (4, 2), (2, 2, 2), (8,)]), st.data())
def test_unreduced_matches_xla_partial_sums(sizes, data) -> None:
    import jax.numpy as jnp

    names = [f"u{i}" for i in range(len(sizes))]
    axes = dict(zip(names, sizes, strict=True))
    perm = data.draw(st.permutations(names))
    n_red = data.draw(st.integers(1, len(names)))
    reduce_axes, rest = list(perm[:n_red]), list(perm[n_red:])
    row = data.draw(st.sampled_from([None, *rest]))
    order = data.draw(st.permutations(range(N)))
    mesh = Mesh(
        np.array([DEVICES[i] for i in order]).reshape(sizes),
        tuple(names),
        axis_types=(jax.sharding.AxisType.Explicit,) * len(names),
    )
    k = math.prod(axes[a] for a in reduce_axes)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    a = rng.standard_normal((4, 2 * k)).astype(np.float32)
    b = rng.standard_normal((2 * k, 3)).astype(np.float32)
    red = tuple(reduce_axes) if len(reduce_axes) > 1 else reduce_axes[0]
    so = NamedSharding(mesh, P(row, None, unreduced=set(reduce_axes)))
    f = jax.jit(lambda a, b: jnp.dot(a, b, out_sharding=so))
    with jax.set_mesh(mesh):
        da = jax.device_put(a, NamedSharding(mesh, P(row, red)))
        db = jax.device_put(b, NamedSharding(mesh, P(red, None)))
        module = tv_ir.load(f.lower(da, db).as_text())
        out = f(da, db)
    sharding = module.main.res_attrs[0]["sdy.sharding"]
    assert {x.name for x in sharding.unreduced} == set(reduce_axes)
    layout = Layout.from_sdy(sharding, module.attrs["sdy.meshes"], (4, 3))
    assert all(len(g) == k for g in layout.unreduced)
    devs = list(mesh.devices.flat)
    shards = {devs.index(s.device): np.asarray(s.data) for s in out.addressable_shards}
    per_device = [shards[p] for p in range(N)]
    close = lambda x, y: np.allclose(x, y, atol=1e-4)  # noqa: E731
    assert close(layout.assemble(per_device), a @ b)
    assert layout.replicas_agree(per_device, close)
    # a single device's partial is not the value whenever k > 1
    assert not close(np.asarray(per_device[layout.unreduced[0][0]]), (a @ b)[: shards[0].shape[0]])


# -- hand-made: unreduced and manual HLO forms, tuples, object arrays, errors ----------------


def partial_sums(layout: Layout, arr: np.ndarray, rng) -> list[np.ndarray]:
    """Random per-device values whose sum over each unreduced group is the group's box."""
    out: list = [None] * layout.num_devices
    for g in layout.unreduced:
        box = layout.shard(arr, g[0])
        parts = [rng.standard_normal(box.shape) for _ in g[1:]]
        out[g[0]] = box - sum(parts, np.zeros(box.shape))
        for d, v in zip(g[1:], parts, strict=True):
            out[d] = v
    return out


@pytest.mark.parametrize(
    "text,groups",
    [
        ("{unreduced}", [tuple(range(8))]),
        ("{devices=[2,2,2]<=[8] last_tile_dims={unreduced}}", [(0, 1), (2, 3), (4, 5), (6, 7)]),
        (
            "{devices=[2,1,2,2]<=[8] last_tile_dims={unreduced, replicated}}",
            [(0, 2), (1, 3), (4, 6), (5, 7)],
        ),
        ("{devices=[1,2,4]<=[4,2]T(1,0) last_tile_dims={unreduced}}", [(0, 2, 4, 6), (1, 3, 5, 7)]),
    ],
)
def test_unreduced_groups_sum_to_the_value(text: str, groups) -> None:
    rng = np.random.default_rng(0)
    arr = rng.standard_normal((4, 6))
    layout = Layout.from_hlo_sharding(text, arr.shape, N)
    assert sorted(layout.unreduced) == groups
    per_device = partial_sums(layout, arr, rng)
    assert np.allclose(layout.assemble(per_device), arr)
    assert layout.replicas_agree(per_device, np.allclose)
    assert np.array_equal(layout.assemble([layout.shard(arr, d) for d in range(N)]), arr)
    if len(layout.unreduced) > 1 and layout.box(groups[0][0]) == layout.box(groups[1][0]):
        per_device[groups[1][0]] = per_device[groups[1][0]] + 1.0
        assert not layout.replicas_agree(per_device, np.allclose)


def test_manual_layouts() -> None:
    arr = np.arange(12.0).reshape(3, 4)
    full = Layout.from_hlo_sharding("{manual}", arr.shape, N)
    assert full.manual == tuple((d,) for d in range(N))
    values = [arr + d for d in range(N)]
    assert [v.tolist() for v in full.assemble_instances(values)] == [v.tolist() for v in values]
    with pytest.raises(ValueError):
        full.assemble(values)
    # manual over the last tile dim: 2 instances, each tiled 2 ways along dim 0 and replicated 2
    part = Layout.from_hlo_sharding(
        "{devices=[2,1,2,2]<=[8] last_tile_dims={manual, replicated}}", (4, 4), N
    )
    assert part.manual == ((0, 1, 4, 5), (2, 3, 6, 7))
    assert part.box(0) == part.box(1) == ((0, 2), (0, 4)) and part.box(4) == ((2, 4), (0, 4))
    a, b = np.zeros((4, 4)), np.ones((4, 4))
    per_device = [part.shard(a if d in part.manual[0] else b, d) for d in range(N)]
    got = part.assemble_instances(per_device)
    assert np.array_equal(got[0], a) and np.array_equal(got[1], b)
    # sdy manual axes: instances by the manual axis, boxes by the remaining ones
    mesh = SdyMesh((("x", 2), ("y", 4)))
    s = SdySharding("mesh", ((SdyAxis("x"), SdyAxis("y", 1, 2)), ()))
    inner = Layout.from_sdy(s, {"mesh": mesh}, (4, 3), manual_axes=("x",))
    assert inner.manual == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert [inner.box(d)[0] for d in range(4)] == [(0, 2), (0, 2), (2, 4), (2, 4)]


def test_tuple_shardings() -> None:
    text = "{{replicated}, {devices=[2,4]<=[8]}, {maximal device=1}}"
    shapes = [(2, 2), (4, 8), (3,)]
    layouts = Layout.from_hlo_sharding(text, shapes, N)
    assert [str(x) for x in layouts] == [
        "{replicated} on (2,2)",
        "{devices=[2,4]<=[8]} on (4,8)",
        "{maximal device=1} on (3)",
    ]
    assert layouts[0].is_replicated and layouts[1].box(5) == ((2, 4), (2, 4))
    # a non-tuple sharding on a tuple value applies to every element
    both = Layout.from_hlo_sharding("{devices=[2,4]<=[8]}", [(4, 8), (2, 4)], N)
    assert [x.tile_shape for x in both] == [(2, 2), (1, 1)]
    with pytest.raises(BadInput):
        Layout.from_hlo_sharding(text, (2, 2), N)
    with pytest.raises(BadInput):
        Layout.from_hlo_sharding(text, shapes[:2], N)


def test_object_arrays_and_custom_add() -> None:
    arr = np.array([[f"e{i}{j}" for j in range(4)] for i in range(2)], dtype=object)
    layout = Layout.from_hlo_sharding(
        "{devices=[1,2,4]<=[8] last_tile_dims={unreduced}}", (2, 4), N
    )
    per_device = [layout.shard(arr, d, zero="") for d in range(N)]
    assert per_device[1].tolist() == [["", ""], ["", ""]] and per_device[0].dtype == object
    joined = layout.assemble(per_device, add=lambda a, b: a + b)
    assert joined.tolist() == arr.tolist()
    tiled = Layout.from_hlo_sharding("{devices=[2,2,2]<=[8] last_tile_dim_replicate}", (2, 4), N)
    assert tiled.shard(arr, 3).tolist() == [["e02", "e03"]]
    assert tiled.assemble([tiled.shard(arr, d) for d in range(N)]).tolist() == arr.tolist()


def test_str() -> None:
    lay = Layout.from_hlo_sharding(
        '{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate metadata={op_name="x"}}',
        (8, 16),
        N,
    )
    assert str(lay) == "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate} on (8,16)"
    s = SdySharding("mesh", ((SdyAxis("data"),), ()), replicated=(SdyAxis("model"),))
    lay = Layout.from_sdy(s, SdyMesh((("data", 2), ("model", 4))), (8, 16))
    assert str(lay) == 'sdy <@mesh, [{"data"}, {}], replicated={"model"}> on (8,16)'


def test_sdy_attribute_decoding() -> None:
    arg = '{sdy.sharding = #sdy.sharding<@mesh, [{"a", ?}, {"b":(1)2}p1], replicated={"b":(2)2}>}'
    res = '{sdy.sharding = #sdy.sharding<mesh<["x"=8]>, [{}, {}], unreduced={"x"}>}'
    sh = '[<@mesh, [{"a"}, {}]>]'
    text = f"""module {{
  sdy.mesh @mesh = <["a"=2, "b"=4], device_ids=[7, 6, 5, 4, 3, 2, 1, 0]>
  sdy.mesh @one = <[], device_ids=[3]>
  func.func @main(%a: tensor<8x4xf32> {arg}) -> (tensor<8x4xf32> {res}) {{
    %0 = sdy.manual_computation(%a) in_shardings={sh} out_shardings={sh}
        manual_axes={{"a"}} (%x: tensor<4x4xf32>) {{
      sdy.return %x : tensor<4x4xf32>
    }} : (tensor<8x4xf32>) -> tensor<8x4xf32>
    return %0 : tensor<8x4xf32>
  }}
}}"""
    m = tv_ir.load(text)
    assert m.attrs["sdy.meshes"] == {
        "mesh": SdyMesh((("a", 2), ("b", 4)), (7, 6, 5, 4, 3, 2, 1, 0)),
        "one": SdyMesh((), (3,)),
    }
    arg = m.main.arg_attrs[0]["sdy.sharding"]
    assert arg == SdySharding(
        "mesh",
        ((SdyAxis("a"),), (SdyAxis("b", 1, 2),)),
        replicated=(SdyAxis("b", 2, 2),),
        open_dims=(0,),
        priorities=(None, 1),
    )
    assert str(arg) == '<@mesh, [{"a", ?}, {"b":(1)2}p1], replicated={"b":(2)2}>'
    res = m.main.res_attrs[0]["sdy.sharding"]
    assert res.mesh == SdyMesh((("x", 8),)) and res.unreduced == (SdyAxis("x"),)
    assert Layout.from_sdy(res, None, (8, 4)).unreduced == (tuple(range(8)),)
    op = m.main.body.ops[0]
    assert op.attrs["manual_axes"] == ("a",)
    assert op.attrs["in_shardings"] == [SdySharding("mesh", ((SdyAxis("a"),), ()))]
    lay = Layout.from_sdy(arg, m.attrs["sdy.meshes"], (8, 4))
    assert lay.box(7) == ((0, 4), (0, 2)) and lay.box(0) == ((4, 8), (2, 4))
    one = Layout.from_sdy(SdySharding("one", ((), ())), m.attrs["sdy.meshes"], (8, 4), 8)
    assert one.maximal == 3


@pytest.mark.parametrize(
    "text",
    [
        "garbage",
        "",
        "{devices=[2,2]<=[3]}",
        "{devices=[2]0,1,2}",
        "{devices=[2,2]0,0,1,1}",
        "{devices=[2,4]<=[8]}",  # rank 2 on a rank-1 value
        "{devices=[8]<=[8]}",  # 8 devices, program has 4... checked below with n=4
        "{maximal device=-1}",
        "{maximal device=9}",
        "{devices=[2,1]<=[2]T(1,0)}",
    ],
)
def test_malformed_hlo_shardings(text: str) -> None:
    n = 4 if text == "{devices=[8]<=[8]}" else N
    with pytest.raises(BadInput) as e:
        Layout.from_hlo_sharding(text, (8,), n)
    assert "\n" not in str(e.value) and str(e.value).strip()


def test_malformed_sdy_and_unsupported() -> None:
    mesh = SdyMesh((("a", 2), ("b", 4)))
    with pytest.raises(BadInput):
        Layout.from_sdy(SdySharding("nope", ((),)), {"mesh": mesh}, (4,))
    with pytest.raises(BadInput):
        Layout.from_sdy(SdySharding("mesh", ((SdyAxis("c"),),)), mesh, (4,))
    with pytest.raises(BadInput):
        Layout.from_sdy(SdySharding("mesh", ((SdyAxis("b", 1, 3),),)), mesh, (4,))
    with pytest.raises(BadInput):
        Layout.from_sdy(SdySharding("mesh", ((SdyAxis("a"),), (SdyAxis("a"),))), mesh, (4, 4))
    with pytest.raises(BadInput):
        Layout.from_sdy(SdySharding("mesh", ((SdyAxis("a"),),)), mesh, (4, 4))
    with pytest.raises(Unsupported):
        Layout.from_hlo_sharding("{unknown}", (4,), N)


def test_a_sharding_is_read_once_per_shape_and_device_count() -> None:
    # a per-device program's arguments share a few shardings: each layout is built once
    # (8,192 devices' boxes), and a different shape or device count is its own layout
    text = "{devices=[64,16,8]<=[8192]}"
    a = Layout.from_hlo_sharding(text, (128, 32, 16))
    assert Layout.from_hlo_sharding(text, (128, 32, 16)) is a
    assert a.box(8191) == ((126, 128), (30, 32), (14, 16))
    other = Layout.from_hlo_sharding(text, (64, 16, 8))
    assert other is not a and other.box(8191) == ((63, 64), (15, 16), (7, 8))
    pair = Layout.from_hlo_sharding("{{replicated}, {maximal device=3}}", [(2,), (4,)], 8)
    assert isinstance(pair, list) and pair[1].maximal == 3
