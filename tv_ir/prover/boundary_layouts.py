"""The layouts of a per-device program's arguments and results, and its device count.

A program that came out of XLA's SPMD partitioner says where its values live in several
places, none of them complete: `mhlo.sharding` on `@main`'s arguments (HLO parameters keep
theirs), the module attributes `mhlo.spmd_parameters_shardings` / `mhlo.spmd_output_sharding`
(XLA's HloModuleProto; a tuple sharding for several results), the pre-partition module given
as the spec (its argument and result annotations), or the caller (`GivenLayouts`). Each value
takes its layout from the first of these that has one. Nothing is guessed: a value of a
program on several devices that none of them covers is bad input, naming it.

The device count is `mhlo.num_partitions` (an HLO module's `num_partitions=` header), else
the caller's, else what the shardings and collectives fix (`device_count`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tv_ir.errors import BadInput
from tv_ir.ir.attrs import MeshAxesGroups
from tv_ir.ir.program import Module, walk
from tv_ir.prover.placement import Placement

PARAMETERS_ATTR = "mhlo.spmd_parameters_shardings"
OUTPUT_ATTR = "mhlo.spmd_output_sharding"


@dataclass
class GivenLayouts:
    """What the caller says (`--num-partitions`, `--in-shardings`, `--out-shardings`)."""

    num_partitions: int | None = None
    in_shardings: list[str] | None = None
    out_shardings: list[str] | None = None

    @property
    def any(self) -> bool:
        return bool(self.num_partitions or self.in_shardings or self.out_shardings)


def says_per_device(spec: Module, impl: Module, given: GivenLayouts | None) -> bool:
    """Whether `impl` is a per-device program whose layouts are to be read here: it carries
    shardings or SPMD attributes of its own, the caller gave layouts, or it shows it is
    per-device (`per_device_evidence`). A partition count alone does not say it: a module in
    the global view (shardings only inside, on a nested jit) has one too."""
    from tv_ir.prover.placement import has_manual_computation

    main = impl.main
    if any(a.get("mhlo.sharding") for a in list(main.arg_attrs) + list(main.res_attrs)):
        return True
    if has_manual_computation(impl):  # shard_map: replicated on its mesh (Placement.from_module)
        return False
    if PARAMETERS_ATTR in impl.attrs or OUTPUT_ATTR in impl.attrs:
        return True
    if given is not None and given.any:
        return True
    return per_device_evidence(spec, impl) is not None


def boundary_placement(spec: Module, impl: Module, given: GivenLayouts | None = None) -> Placement:
    """The placement of a per-device `impl` checked against `spec` (see the module doc)."""
    args, results, n = boundary_shardings(spec, impl, given)
    return Placement.from_shardings(spec.main, args, results, n)


def boundary_shardings(
    spec: Module, impl: Module, given: GivenLayouts | None = None
) -> tuple[list[str], list[str], int]:
    """(argument shardings, result shardings, device count) of a per-device `impl` checked
    against `spec`, each from the first place that has it (see the module doc)."""
    given = given or GivenLayouts()
    main = impl.main
    n_args, n_results = len(main.arg_types), len(main.result_types)
    own_args = [a.get("mhlo.sharding") for a in main.arg_attrs]
    module_args = _list_attr(impl.attrs.get(PARAMETERS_ATTR), n_args, PARAMETERS_ATTR)
    own_results = [r.get("mhlo.sharding") for r in main.res_attrs]
    module_results = split_tuple_sharding(impl.attrs.get(OUTPUT_ATTR), n_results, OUTPUT_ATTR)
    spec_args, spec_results = _spec_annotations(spec, n_args, n_results)
    given_args = _given(given.in_shardings, n_args, "--in-shardings", "arguments")
    given_results = _given(given.out_shardings, n_results, "--out-shardings", "results")
    args = [
        _first(sources)
        for sources in zip(own_args, module_args, spec_args, given_args, strict=True)
    ]
    results = [
        _first(sources)
        for sources in zip(own_results, module_results, spec_results, given_results, strict=True)
    ]
    n = device_count(
        impl, [s for s in args + results if s], given.num_partitions or _spec_partitions(spec)
    )
    if n > 1:
        for what, strings, types, attrs, where in (
            ("argument", args, main.arg_types, main.arg_attrs, (PARAMETERS_ATTR, "--in-shardings")),
            (
                "result",
                results,
                main.result_types,
                main.res_attrs,
                (OUTPUT_ATTR, "--out-shardings"),
            ),
        ):
            for k, s in enumerate(strings):
                if not s:
                    name = attrs[k].get("jax.result_info") if what == "result" else None
                    label = f"{what} {k}" + (f" ({name})" if name else "")
                    raise BadInput(
                        f"per-device {label} ({types[k]}) has no layout on the {n} devices: "
                        f"no mhlo.sharding on it, no {where[0]} in the module, none on the "
                        f"spec's {what} (a pre-partition module), and no {where[1]}"
                    )
    fill = "{replicated}"
    return [s or fill for s in args], [s or fill for s in results], n


def split_tuple_sharding(text, count: int, what: str) -> list[str | None]:
    """One sharding string per value from a sharding of `count` values (a tuple sharding
    `{{...}, {...}}` for several, a plain one for one; a plain one for several applies to
    each); Nones when there is none."""
    if text is None:
        return [None] * count
    if not isinstance(text, str):
        raise BadInput(f"{what} must be a sharding string, got {text!r}")
    from jax._src.lib import xla_client as xc

    try:
        h = xc.HloSharding.from_string(text)
    except Exception:
        raise BadInput(f"{what}: malformed sharding {text!r}") from None
    elems = h.tuple_elements()
    if not elems:
        return [text] * count
    if len(elems) != count:
        raise BadInput(f"{what} {text!r} has {len(elems)} elements for {count} values")
    return [str(e) for e in elems]


def device_count(impl: Module, shardings: list[str], given: int | None = None) -> int:
    """`mhlo.num_partitions`, else `given`, else the devices the shardings tile over, else
    the devices the collectives' groups cover. A program that reads its partition id but
    shows none of these is bad input; otherwise (no device-dependent op, every layout
    replicated or on one device) each device computes the same, and the count is the
    fewest devices its maximal shardings name."""
    declared = int(impl.attrs.get("mhlo.num_partitions", 0) or 0)
    replicas = int(impl.attrs.get("mhlo.num_replicas", 1) or 1)
    tiled, at_least, partial = _sharding_devices(shardings)
    grouped, uses_device, bounds = _collective_devices(impl)
    at_least = max([at_least, *bounds])
    for n, source in ((declared, "mhlo.num_partitions"), (given, "--num-partitions")):
        if n:
            if tiled and tiled != n * replicas:
                raise BadInput(f"the shardings place {tiled} devices, {source} says {n}")
            if at_least > n * replicas:
                raise BadInput(f"the program names device {at_least - 1}, {source} says {n}")
            return n
    for n, source in ((tiled, "the shardings"), (grouped, "the collectives' groups")):
        if n:
            if at_least > n:
                raise BadInput(f"the program names device {at_least - 1} but {source} cover {n}")
            return n
    if uses_device:
        raise BadInput(
            f"the per-device program uses {uses_device} but nothing says on how many devices "
            "it runs (no mhlo.num_partitions, no tiled sharding): pass --num-partitions"
        )
    if partial:  # its value is the sum of every device's: the count changes the meaning
        raise BadInput(
            f"a {partial} layout's value is a sum over the devices, but nothing says on how "
            "many devices the program runs (no mhlo.num_partitions, no tiled sharding, no "
            "collective): pass --num-partitions"
        )
    return max(at_least, 1)


def _sharding_devices(shardings: list[str]) -> tuple[int, int, str]:
    """(devices a tiled sharding places, 0 if none; the fewest devices the maximal
    shardings allow; an unreduced sharding among them, "" if none)."""
    from jax._src.lib import xla_client as xc

    tiled: set[int] = set()
    at_least = 0
    partial = ""
    for s in shardings:
        try:
            h = xc.HloSharding.from_string(s)
        except Exception:
            raise BadInput(f"malformed sharding {s!r}") from None
        for e in h.tuple_elements() or [h]:
            if e.is_unreduced():
                partial = partial or str(e)
                continue
            if e.is_replicated() or e.is_manual() or e.is_unknown():
                continue
            if e.is_maximal():
                at_least = max(at_least, int(e.tile_assignment_devices()[0]) + 1)
            elif e.is_tiled():
                tiled.add(len(e.tile_assignment_devices()))
    if len(tiled) > 1:
        raise BadInput(f"the shardings place different device counts: {sorted(tiled)}")
    return (tiled.pop() if tiled else 0), at_least, partial


def _collective_devices(impl: Module) -> tuple[int, str | None, list[int]]:
    """(devices covered by the replica groups of group collectives, 0 if none; the first
    device-dependent op; lower bounds from collective_permute pairs)."""
    from tv_ir.ir.attrs import MeshAxesGroups
    from tv_ir.semantics.interpreters.process_grid import parse_mesh
    from tv_ir.semantics.ops.registry import COLLECTIVES, PROCESS_OPS

    meshes = impl.attrs.get("sdy.meshes") or {}
    covered, first, bounds = 0, None, []
    stack = [fn.body for fn in impl.functions.values()]
    while stack:
        block = stack.pop()
        for op in block.ops:
            stack.extend(r.block for r in op.regions)
            if op.name not in PROCESS_OPS and op.name not in COLLECTIVES:
                continue
            first = first or op.name
            groups = op.attrs.get("replica_groups")
            if isinstance(groups, MeshAxesGroups):  # groups over every device of a mesh
                ref = groups.mesh  # `@name` of a module's sdy.mesh, or an inlined mesh
                mesh = meshes.get(ref[1:]) if ref.startswith("@") else parse_mesh(ref)
                if mesh is not None:
                    covered = max(covered, int(np.prod([size for _, size in mesh.axes])))
            elif groups is not None and np.asarray(groups).size:
                ids = np.asarray(groups).reshape(-1)
                ids = ids[ids >= 0]
                if ids.size and sorted(ids.tolist()) == list(range(ids.size)):
                    covered = max(covered, int(ids.size))
                elif ids.size:
                    bounds.append(int(ids.max()) + 1)
            pairs = op.attrs.get("source_target_pairs")
            if pairs is not None and np.asarray(pairs).size:
                bounds.append(int(np.asarray(pairs).max()) + 1)
    return covered, first, bounds


def _spec_annotations(spec: Module, n_args: int, n_results: int):
    """The spec's own argument/result shardings when it is a pre-partition module of the
    same arity (Nones otherwise)."""
    main = spec.main
    if len(main.arg_types) != n_args or len(main.result_types) != n_results:
        return [None] * n_args, [None] * n_results
    return (
        [a.get("mhlo.sharding") for a in main.arg_attrs],
        [r.get("mhlo.sharding") for r in main.res_attrs],
    )


def _spec_partitions(spec: Module) -> int | None:
    """The partition count of a pre-partition spec (an SPMD module itself when it holds
    manual values: jaxlib's conversion of the per-device program drops the count)."""
    n = int(spec.attrs.get("mhlo.num_partitions", 0) or 0)
    return n if n > 1 else None


def _list_attr(value, count: int, what: str) -> list[str | None]:
    if value is None:
        return [None] * count
    values = list(value) if isinstance(value, (list, tuple)) else None
    if values is None or not all(isinstance(v, str) for v in values):
        raise BadInput(f"{what} must be a list of sharding strings, got {value!r}")
    if len(values) != count:
        raise BadInput(f"{what} has {len(values)} shardings for {count} arguments")
    return values


def _given(strings, count: int, flag: str, what: str) -> list[str | None]:
    if strings is None:
        return [None] * count
    if len(strings) != count:
        raise BadInput(f"{flag} gives {len(strings)} shardings, the program has {count} {what}")
    return [s or None for s in strings]


def _first(sources) -> str | None:
    return next((s for s in sources if s), None)


# what only a partitioned (per-device) program holds; a pre-partition module has the
# program's global view, device-independent (collectives appear there only inside shard_map
# bodies, which are recognised apart)
PER_DEVICE_ATTRS = ("mhlo.spmd_output_sharding", "mhlo.spmd_parameters_shardings")
GSPMD_MANUAL = ("SPMDFullToShardShape", "SPMDShardToFullShape")


def lost_device_order(impl: Module) -> str | None:
    """Why the device order of `impl`'s collectives may not be the one XLA ran (None when
    nothing says so). jaxlib 0.10.2's `hlo_to_stablehlo` turns XLA's mesh-axes replica groups
    (`replica_groups=mesh[...], device_ids=([4,2]T(1,0)) {...}`) into groups over an
    `sdy.mesh` without `device_ids`: iota order, which is not XLA's program when XLA's mesh
    ordered its devices otherwise, and nothing left in the module says whether it did (its
    layouts may all be in iota order while a mesh inside was not). So in a module from
    XLA's dump (its `mhlo.spmd_*` attributes) whose collectives name a mesh without a
    device order, a difference may be the conversion's, not XLA's."""
    if PARAMETERS_ATTR not in impl.attrs and OUTPUT_ATTR not in impl.attrs:
        return None
    meshes = impl.attrs.get("sdy.meshes") or {}
    unordered = sorted(
        {
            g.mesh.lstrip("@")
            for op in walk(impl.main.body)
            for g in [op.attrs.get("replica_groups")]
            if isinstance(g, MeshAxesGroups) and _order_matters(op.name, g, meshes)
        }
    )
    if not unordered:
        return None
    return (
        f"its collectives group devices over mesh @{unordered[0]}, which gives no device "
        "order: jaxlib's hlo_to_stablehlo drops the device_ids of XLA's mesh-axes replica "
        "groups, so this may not be the program XLA ran (its mesh may order its devices "
        "otherwise); check XLA's HLO text (tv check BEFORE AFTER.hlo), which keeps them"
    )


def _order_matters(op_name: str, groups: MeshAxesGroups, meshes: dict) -> bool:
    """Whether the devices' order on the mesh `groups` names (none given) changes what the
    collective does: not for an all-reduce over every device (one group, any order)."""
    from tv_ir.semantics.interpreters.process_grid import mesh_axes_groups

    mesh = meshes.get(groups.mesh.lstrip("@"))
    if mesh is None or mesh.device_ids is not None:
        return False
    if op_name != "stablehlo.all_reduce":
        return True
    try:
        return len(mesh_axes_groups(mesh, groups.axes)) > 1
    except BadInput:
        return True


def per_device_evidence(spec: Module, impl: Module) -> str | None:
    """Why `impl` must be a per-device program rather than a module to partition (None when
    nothing says so): results of other shapes than the spec's (a pre-partition module keeps
    global shapes), XLA's SPMD module attributes or `_spmd` entry name, or device-dependent ops
    (`partition_id`, `replica_id`, collectives) outside shard_map bodies."""
    from tv_ir.ir.importer import SPMD_PARTITIONED_ATTR
    from tv_ir.semantics.ops.registry import COLLECTIVES, PROCESS_OPS

    if impl.main.result_types != spec.main.result_types:
        return "its results have per-device shapes"
    if impl.attrs.get(SPMD_PARTITIONED_ATTR):
        return "it is XLA's SPMD partitioner output (an entry computation named *_spmd)"
    for key in PER_DEVICE_ATTRS:
        if key in impl.attrs:
            return f"it has {key}"
    found, manual = None, False
    stack = [fn.body for fn in impl.functions.values()]
    while stack:
        block = stack.pop()
        for op in block.ops:
            if op.name == "sdy.manual_computation" or (
                op.name == "stablehlo.custom_call"
                and op.attrs.get("call_target_name") in GSPMD_MANUAL
            ):
                manual = True
            elif found is None and (op.name in PROCESS_OPS or op.name in COLLECTIVES):
                found = op.name
            stack.extend(r.block for r in op.regions)
    return None if manual or found is None else f"it uses {found}"
