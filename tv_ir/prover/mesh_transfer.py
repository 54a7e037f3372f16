"""Mesh reduction in a check: choose the reduced mesh on the real pair, apply the same
sizes to every pair the check runs (the shape-reduced pair, its witnesses, the real-size
replay), and name a counterexample's device by the real device it stands for."""

from __future__ import annotations

import numpy as np

from tv_ir.passes.mesh_reduction import MeshReduction, reduce_mesh

from .placement import Placement


def plan(spec, impl, placement) -> MeshReduction:
    """The mesh reduction of the real pair (`reduced` False when no axis shrinks)."""
    return reduce_mesh(spec, impl, placement)


def on_reduced_mesh(mesh: MeshReduction, spec, impl, placement):
    """(spec, impl, placement) of a pair on `mesh`'s reduced mesh, None when the pair
    cannot be read that way. Ops nothing reads are dropped (`dce`): a dead broadcast no
    axis splits keeps the real batch, 94 of a 126-layer witness's 95 million elements at
    TrainVerify's 7,168-device plan, and the witness was "too large to run"."""
    from tv_ir.passes import dce

    found = reduce_mesh(spec, impl, placement, sizes=mesh.reduced_mesh.sizes)
    if not found.reduced:
        return None
    spec, impl = dce.run(found.spec), dce.run(found.impl)
    return spec, impl, reduced_placement(found)


def reduced_placement(mesh: MeshReduction) -> Placement:
    """Where the reduced pair's arguments and results live: whole on every device (a
    shard_map program), or split as on the real mesh (a per-device program)."""
    if mesh.layouts is None:
        return Placement.replicated(mesh.spec.main, mesh.reduced_mesh.devices)
    return Placement(1, mesh.reduced_mesh.devices, *mesh.layouts)


def name_real_device(report, mesh: MeshReduction) -> None:
    """A counterexample found on the reduced mesh, named by the real device it stands for."""
    ce = report.counterexample
    if ce is None or ce.device is None:
        return
    device, coords = mesh.real_device(ce.device)
    reduced = dict(zip(mesh.reduced_mesh.names, mesh.reduced_mesh.coords(ce.device), strict=True))
    report.notes.append(
        f"found on the reduced mesh of {mesh.reduced_mesh.devices} devices at device "
        f"{ce.device} ({_coords(reduced)}), which stands for device {device} "
        f"({_coords(coords)}) of the real {mesh.real_mesh.devices}"
    )
    if ce.hang is not None and ce.hang_group:
        _name_real_hang(ce, mesh, ce.device)
    ce.device, ce.mesh_coords = device, coords


def _name_real_hang(ce, mesh: MeshReduction, reduced_device: int) -> None:
    """A hang's devices, found on the reduced mesh, named by the real devices each stands
    for (its run of them), in the real group of the real device `reduced_device` stands
    for: the device a bug is planted on is named with its coordinates."""
    from tv_ir.errors import renamed_devices

    named = mesh.coarse or mesh.real_mesh

    def name(d: int) -> str:
        at = zip(named.names, named.coords(d), strict=True)
        return f"device {d} ({', '.join(f'{k}={v}' for k, v in at)})"

    small, real = mesh.reduced_mesh, mesh.real_mesh
    # the axes the group does not run along: its real devices are at the representative's
    # coordinates there (other real devices at those reduced coordinates are other groups)
    fixed = [
        a for a in range(len(small.sizes)) if len({small.coords(d)[a] for d in ce.hang_group}) == 1
    ]
    at = real.coords(mesh.real_device(reduced_device)[0])

    def of_group(ids: list[int]) -> list[int]:
        return [d for d in ids if all(real.coords(d)[a] == at[a] for a in fixed)]

    group = of_group(mesh.real_devices(ce.hang_group))
    waiting = of_group(mesh.real_devices(ce.hang_waiting))
    ce.hang = renamed_devices(ce.hang, group, waiting, name)
    ce.hang_group, ce.hang_waiting = group, waiting


def runs_on_real_mesh(spec, impl, placement) -> bool:
    """Whether the real pair fits to run on every device of its mesh (`REPLAY_LIMIT`
    elements, the impl's counted once per device)."""
    from tv_ir.ir.program import elements

    from .real_size import REPLAY_LIMIT

    return elements(spec) + placement.num_devices * elements(impl) <= REPLAY_LIMIT


def differs_on_real_mesh(spec, impl, placement, seed: int = 0):
    """The real pair run on random inputs on every device of its mesh: a difference
    (`refutation(...)`'s result) or None. It does not depend on the proof on the reduced
    mesh, so a check computes it beside that proof."""
    from .real_size import _differs

    return _differs(spec, impl, placement, seed)


NOT_RUN = object()  # `confirm_on_real_mesh`'s `found` when nothing ran it beforehand


def larger_sizes(mesh: MeshReduction) -> tuple[int, ...] | None:
    """The reduced mesh with each shrunk axis at its next divisor of the real size (2 -> 4
    of 64), or None when that is the real mesh."""
    grown = []
    for r, n in zip(mesh.reduced_mesh.sizes, mesh.real_mesh.sizes, strict=True):
        grown.append(next(d for d in range(r + 1, n + 1) if n % d == 0) if r < n else r)
    return None if tuple(grown) == tuple(mesh.real_mesh.sizes) else tuple(grown)


def on_larger_mesh(mesh: MeshReduction, spec, impl, placement):
    """(the real pair on `larger_sizes`, the sizes) when the real mesh is too large to run
    and that pair runs (`runs_on_real_mesh`); else None. The mesh reduction's template
    argument says the pair agrees there as it does on the reduced mesh: running it checks
    the argument on one more instance (a count of devices, a ring's reach that the template
    did not follow shows there)."""
    from tv_ir.ir.program import elements

    from .real_size import REPLAY_LIMIT

    sizes = larger_sizes(mesh)
    if sizes is None or runs_on_real_mesh(spec, impl, placement):
        return None
    small = mesh.reduced_mesh.devices
    grow = int(np.prod(sizes)) / small
    estimate = grow * (elements(mesh.spec) + small * elements(mesh.impl))
    if estimate > 2 * REPLAY_LIMIT:  # what the shapes along the axes grow to, about
        return None
    found = reduce_mesh(spec, impl, placement, sizes=sizes)
    if not found.reduced:
        return None
    from tv_ir.passes import dce

    pair = (dce.run(found.spec), dce.run(found.impl), reduced_placement(found))
    return (pair, sizes) if runs_on_real_mesh(*pair) else None


def differs_on_larger_mesh(mesh: MeshReduction, spec, impl, placement, seed: int = 0):
    """None when there is no larger mesh to run (`on_larger_mesh`), else (a difference
    (`refutation(...)`'s result) or None, the larger mesh's sizes)."""
    from .real_size import _differs

    found = on_larger_mesh(mesh, spec, impl, placement)
    if found is None:
        return None
    pair, sizes = found
    return _differs(*pair, seed), sizes


def confirm_on_real_mesh(
    report,
    mesh: MeshReduction,
    spec,
    impl,
    placement,
    seed: int = 0,
    found=NOT_RUN,
    larger=NOT_RUN,
    reduced=None,
):
    """A verdict on the reduced mesh, run concretely on every device of the real one when
    that fits (`runs_on_real_mesh`): a proof whose programs differ there is refuted there; a
    refutation whose programs agree there on random inputs is `unknown` (the caller then
    checks the real mesh as given). `found`: `differs_on_real_mesh`'s result, when it was
    computed beside the proof. Where the real mesh is too large, a proof is run on a larger
    reduced mesh instead, when that fits (`differs_on_larger_mesh`, whose result `larger`
    is when computed beside the proof): a difference there makes it `unknown`; and so does
    a count of devices `uniform_sum` finds on `reduced`, the pair the proof was on."""
    from tv_ir.report.result import EQUIVALENT, NOT_EQUIVALENT, UNKNOWN, Report

    from .real_size import refuted_by_replay

    if report.verdict not in (EQUIVALENT, NOT_EQUIVALENT):
        return report
    if not runs_on_real_mesh(spec, impl, placement):
        sizes = None  # the larger mesh the proof's pair ran on, if it did
        if report.verdict == EQUIVALENT:
            if larger is NOT_RUN:
                larger = differs_on_larger_mesh(mesh, spec, impl, placement, seed)
            if larger is not None:
                differs, sizes = larger
                if differs is not None:
                    return _differs_on_larger_mesh(report, mesh, sizes)
        elif report.verdict == NOT_EQUIVALENT:
            if larger is NOT_RUN:
                larger = differs_on_larger_mesh(mesh, spec, impl, placement, seed)
            if (
                larger is not None
                and larger[0] is None
                and not _counterexample_differs_on_larger_mesh(report, mesh, spec, impl, placement)
            ):
                return _agrees_on_larger_mesh(report, mesh, larger[1])
            if larger is not None:
                sizes = larger[1]
        where = uniform_sum(mesh, *reduced, seed=seed) if reduced is not None else None
        if where is not None:
            what = "proved" if report.verdict == EQUIVALENT else "refuted"
            out = Report(
                UNKNOWN,
                stats=report.stats,
                reason=f"{what} on the reduced mesh, but its {where} adds a value equal on "
                "every device of its groups over an axis the mesh reduction shrank (a count "
                "of devices, which the reduced mesh has fewer of): the verdict does not carry "
                f"over, and the real mesh ({mesh.real_mesh.devices} devices) is too large to "
                "run; check with --whole-mesh (reduce_mesh=False)",
            )
            out.notes.append(out.reason)
            return out
        larger_too = (
            f"; checked concretely on a larger reduced mesh ({_grown(mesh, sizes)}) too"
            if sizes is not None
            else ""
        )
        report.notes.append(
            f"the real mesh ({mesh.real_mesh.devices} devices) is too large to run concretely"
            f"{larger_too}: the verdict rests on the mesh reduction's template "
            "(docs/equivalence.md)"
        )
        return report
    if found is NOT_RUN:
        found = differs_on_real_mesh(spec, impl, placement, seed)
    if report.verdict == EQUIVALENT and found is None:
        report.notes.append("checked concretely on every device of the real mesh too")
        return report
    if report.verdict == NOT_EQUIVALENT:
        replayed = _replayed(report, mesh, spec, impl, placement)
        if replayed is not None or found is not None:
            report.counterexample, report.location, report.outputs = replayed or found
            report.notes.append(
                "replayed on every device of the real mesh ("
                + (
                    "the reduced counterexample, each device's block from the reduced device "
                    "standing for it)"
                    if replayed is not None
                    else "random inputs)"
                )
            )
            return report
    if found is not None:  # proved on the reduced mesh, but the real one differs
        return refuted_by_replay(
            found,
            report,
            "proved on the reduced mesh, but the programs differ on the real one: the mesh "
            "reduction does not carry over for this pair (replayed on the real mesh)",
        )
    out = Report(
        UNKNOWN,
        stats=report.stats,
        reason="mesh reduction: refuted on the reduced "
        "mesh, but the programs agree on the real mesh on random inputs",
    )
    out.notes.append(out.reason)
    return out


def uniform_sum(mesh: MeshReduction, spec, impl, placement, seed: int = 0) -> str | None:
    """Where the reduced pair (on `mesh`'s reduced mesh) adds, over an axis the reduction
    shrank, a value equal on every device of each group on random inputs (not all zero):
    a count of those devices that no rule of the template saw (`psum(clip(x, 1, 1))`). Such
    a sum is n x the value for n devices, so the pair on the reduced mesh is no instance of
    the real one. Returns where, or None (also when the pair is too large to run)."""
    from tv_ir.errors import ProgramHangs
    from tv_ir.ir.program import elements, walk
    from tv_ir.passes.mesh_reduction.template import generating_axes
    from tv_ir.passes.shape_reduction.ranges import sums

    from .real_size import REPLAY_LIMIT
    from .simulate import Trace, random_inputs, run_traced_devices

    small, real = mesh.reduced_mesh, mesh.real_mesh
    shrunk = {a for a, (r, n) in enumerate(zip(small.sizes, real.sizes, strict=True)) if r < n}
    adds = []
    for op in walk(impl.main.body):
        if op.name != "stablehlo.all_reduce" or not sums(op):
            continue
        groups = op.attrs.get("replica_groups")
        if not isinstance(groups, np.ndarray) or groups.ndim != 2 or groups.shape[1] < 2:
            continue
        axes = generating_axes(small, groups, True)
        if axes is not None and shrunk & set(axes):
            adds.append((op, groups))
    if not adds or elements(spec) + placement.num_devices * elements(impl) > REPLAY_LIMIT:
        return None
    x = random_inputs(spec.main, np.random.default_rng(seed))
    trace = Trace()
    try:
        run_traced_devices(
            impl,
            placement.shard_inputs(x),
            placement.num_replicas,
            placement.num_partitions,
            trace=trace,
        )
    except ProgramHangs:
        pass  # on these inputs the devices part ways: the sums that ran before are checked
    for op, groups in adds:
        held = trace.values.get(op.operands[0].id)
        if held is None:
            continue
        first = [np.asarray(held[g[0]]) for g in groups]
        if not any(v.any() for v in first):
            continue  # a sum of zeros is zero at any count
        if all(
            np.array_equal(v, np.asarray(held[d]), equal_nan=v.dtype.kind == "f")
            for v, g in zip(first, groups, strict=True)
            for d in g[1:]
        ):
            return f"all_reduce at {op.loc}"
    return None


def _grown(mesh: MeshReduction, sizes) -> str:
    """The axes a larger reduced mesh grew, with their sizes there ("x: 4")."""
    return ", ".join(
        f"{name}: {n}"
        for name, n, r in zip(mesh.real_mesh.names, sizes, mesh.reduced_mesh.sizes, strict=True)
        if n != r
    )


def _differs_on_larger_mesh(report, mesh: MeshReduction, sizes):
    """A proof on the reduced mesh whose pair differs on a larger one (`sizes`)."""
    return _unknown_past_larger_mesh(
        report, mesh, f"proved on the reduced mesh, but on a larger one ({_grown(mesh, sizes)}) "
        "the programs differ on random inputs"
    )  # fmt: skip


def _unknown_past_larger_mesh(report, mesh: MeshReduction, what: str):
    """`unknown`: what the larger mesh showed (`what`) says the reduction does not carry
    over, and the real mesh is too large to run."""
    from tv_ir.report.result import UNKNOWN, Report

    out = Report(
        UNKNOWN,
        stats=report.stats,
        reason=f"{what}: the mesh reduction does not carry over for this pair, and the real "
        f"mesh ({mesh.real_mesh.devices} devices) is too large to run; check with "
        "--whole-mesh (reduce_mesh=False)",
    )
    out.notes.append(out.reason)
    return out


def _counterexample_differs_on_larger_mesh(report, mesh: MeshReduction, spec, impl, placement):
    """Whether the reduced counterexample, blown up to the real mesh and cut to the larger
    reduced one (`larger_sizes`), still shows a difference there (True when it cannot be
    carried there: nothing then says it does not)."""
    from .localise import differs

    ce = report.counterexample
    sizes = larger_sizes(mesh)
    if ce is None or sizes is None or len(ce.inputs) != len(mesh.arg_axes):
        return True
    found = reduce_mesh(spec, impl, placement, sizes=sizes)
    if not found.reduced:
        return True
    try:
        inputs = [
            found.picked(mesh.blown_up(x, axes), axes) if axes else x
            for x, axes in zip(ce.inputs.values(), mesh.arg_axes, strict=True)
        ]
        if any(
            getattr(x, "shape", None) != tuple(t.shape)
            for x, t in zip(inputs, found.spec.main.arg_types, strict=True)
        ):
            return True
    except (ValueError, IndexError):
        return True
    from tv_ir.passes import dce

    pair = (dce.run(found.spec), dce.run(found.impl), reduced_placement(found))
    return differs(*pair, inputs, outputs_first=False)


def _agrees_on_larger_mesh(report, mesh: MeshReduction, sizes):
    """A refutation on the reduced mesh whose pair agrees on a larger one (`sizes`), on the
    same counterexample and on random inputs."""
    return _unknown_past_larger_mesh(
        report, mesh, f"refuted on the reduced mesh, but on a larger one ({_grown(mesh, sizes)}) "
        "the programs agree on the same counterexample and on random inputs"
    )  # fmt: skip


def _replayed(report, mesh: MeshReduction, spec, impl, placement):
    """The reduced counterexample blown up to the real mesh, localised there, or None."""
    from .localise import refutation

    ce = report.counterexample
    if ce is None or len(ce.inputs) != len(mesh.arg_axes):
        return None
    try:
        inputs = [
            mesh.blown_up(x, axes) if axes else x
            for x, axes in zip(ce.inputs.values(), mesh.arg_axes, strict=True)
        ]
        if any(
            getattr(x, "shape", None) != tuple(t.shape)
            for x, t in zip(inputs, spec.main.arg_types, strict=True)
        ):
            return None
        return refutation(spec, impl, placement, inputs)
    except (ValueError, IndexError):
        return None


def _coords(c: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in c.items())
