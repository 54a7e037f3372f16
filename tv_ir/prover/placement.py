"""Where the implementation's arguments and results live: one Layout each, on N devices.

A single-device implementation is the case N = 1 with every value whole on device 0, so the
prover has one code path for rewrites and for distributed programs.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import numpy as np

from tv_ir.ir.attrs import SdyAxis, SdySharding
from tv_ir.ir.program import Function, Module, TensorType
from tv_ir.semantics.layout import Layout

from ..errors import BadInput, Unsupported


@dataclass
class Placement:
    num_replicas: int
    num_partitions: int
    args: list[Layout]
    results: list[Layout]

    @property
    def num_devices(self) -> int:
        return self.num_replicas * self.num_partitions

    @property
    def distributed(self) -> bool:
        return self.num_devices > 1

    @classmethod
    def single_device(cls, spec: Function) -> Placement:
        return cls(
            1,
            1,
            [Layout.replicated(_shape(t), 1) for t in spec.arg_types],
            [Layout.replicated(_shape(t), 1) for t in spec.result_types],
        )

    @classmethod
    def replicated(cls, spec: Function, n: int) -> Placement:
        """Every argument and result whole on each of n partitions (a global-signature
        program that distributes itself, e.g. a `jax.shard_map` module)."""
        return cls(
            1,
            n,
            [Layout.replicated(_shape(t), n) for t in spec.arg_types],
            [Layout.replicated(_shape(t), n) for t in spec.result_types],
        )

    @classmethod
    def from_shardings(
        cls, spec: Function, arg_shardings: list[str], out_shardings: list[str], n: int
    ) -> Placement:
        """Layouts from HloSharding strings (argument / result order), on n partitions."""

        def layouts(strings, types, what):
            if len(strings) != len(types):
                raise BadInput(f"{len(strings)} {what} shardings for {len(types)} {what}s")
            out = []
            for s, t in zip(strings, types, strict=True):
                lay = Layout.from_hlo_sharding(s, _shape(t), n)
                if isinstance(lay, list) or lay.manual:
                    raise Unsupported(f"{what} sharding {s} (tuple or manual) at the boundary")
                out.append(lay)
            return out

        return cls(
            1,
            n,
            layouts(arg_shardings, spec.arg_types, "argument"),
            layouts(out_shardings, spec.result_types, "result"),
        )

    @classmethod
    def from_sdy(cls, spec: Function, annotated: Module) -> Placement:
        """Layouts from the `sdy.sharding`s of a Shardy-annotated function (`annotated.main`),
        on the devices of its mesh; for the per-device program Shardy's passes make of it.

        An argument that reaches `sdy.all_reduce` / `sdy.reduce_scatter` (through other
        global-view ops only) holds partial sums over the reduced axes: it is unreduced
        over them, whatever its sharding says.
        """
        fn = annotated.main
        meshes = annotated.attrs.get("sdy.meshes") or {}
        n = _sdy_devices(fn, meshes)
        partial = _partial_axes(fn)

        def layouts(attrs, types, partial_axes):
            out = []
            for k, (a, t) in enumerate(zip(attrs, types, strict=True)):
                s = a.get("sdy.sharding")
                axes = partial_axes.get(k, ())
                if s is None and not axes:
                    out.append(Layout.replicated(_shape(t), n))
                    continue
                if s is None:
                    s = SdySharding(_only_mesh(meshes), tuple(() for _ in _shape(t)))
                if axes:
                    s = dataclasses.replace(
                        s, unreduced=tuple(s.unreduced) + tuple(SdyAxis(x) for x in axes)
                    )
                out.append(Layout.from_sdy(s, meshes, _shape(t), n))
            return out

        return cls(
            1,
            n,
            layouts(fn.arg_attrs, spec.arg_types, partial),
            layouts(fn.res_attrs, spec.result_types, {}),
        )

    @classmethod
    def from_module(cls, spec: Function, impl: Module) -> Placement:
        """A per-device module's own `mhlo.sharding` argument/result attributes, if any.

        A module without them whose program holds `sdy.manual_computation`s (shard_map), or
        GSPMD `@SPMDFullToShardShape` custom calls, runs on every device of its mesh with its
        global arguments and results replicated.

        On several devices every result must carry its `mhlo.sharding`: a result's layout is
        not guessed (replicated and unreduced copies look alike), it is bad input.
        """
        main = impl.main
        args = [a.get("mhlo.sharding") for a in main.arg_attrs]
        if not any(args):
            if has_manual_computation(impl):
                return cls.replicated(spec, _mesh_devices(impl))
            return cls.single_device(spec)
        n = int(impl.attrs.get("mhlo.num_partitions", 0)) or _devices_in(args)
        results = [r.get("mhlo.sharding") for r in main.res_attrs]
        if n > 1:
            for k, (r, attrs) in enumerate(zip(results, main.res_attrs, strict=True)):
                if not r:
                    name = attrs.get("jax.result_info")
                    what = f"result {k}" + (f" ({name})" if name else "")
                    raise BadInput(
                        f"per-device {what} ({main.result_types[k]}) has no mhlo.sharding, so "
                        f"its layout on the {n} devices is unknown (XLA's HLO dumps do not "
                        "record result shardings; from Python, pass placement=)"
                    )
        results = [r or "{replicated}" for r in results]
        return cls.from_shardings(spec, [a or "{replicated}" for a in args], results, n)

    def shard_inputs(self, inputs: list) -> list[list]:
        """Per-device argument lists [device][arg] from global inputs.

        Symbolic inputs of an unreduced layout are split into arbitrary partial sums: fresh
        symbols on all but the first device of each group, the first holding the rest, so a
        proof holds for every way the devices may share the value. A maximal layout's value
        is on its device only: the other devices' buffers hold anything (fresh symbols;
        zeros when concrete), so a program that reads them is not proved.
        """
        out = [
            [lay.shard(x, d, pad=_zero_like(x)) for lay, x in zip(self.args, inputs, strict=True)]
            for d in range(self.num_devices)
        ]
        for k, (lay, x) in enumerate(zip(self.args, inputs, strict=True)):
            if lay.unreduced and np.asarray(x).dtype == object:
                _split_partial_sums(lay, k, out)
            if lay.maximal is not None:
                _absent_elsewhere(lay, k, out)
        return out

    def assemble_outputs(self, per_device: list[list], add=None) -> list:
        """Each output's logical value (a replicated box: its first holder's copy)."""
        return [
            lay.assemble([per_device[d][k] for d in range(self.num_devices)], add)
            for k, lay in enumerate(self.results)
        ]

    def output_copies(self, per_device: list[list], add=None) -> list[list[tuple]]:
        """Per output, every copy the devices hold: [(device, box, value)] (`Layout.copies`).
        An output is right only if every copy equals its box of the spec output."""
        return [
            lay.copies([per_device[d][k] for d in range(self.num_devices)], add)
            for k, lay in enumerate(self.results)
        ]


def _shape(t) -> tuple:
    return tuple(t.shape) if isinstance(t, TensorType) else ()


def _split_partial_sums(lay: Layout, k: int, per_device: list[list]) -> None:
    from tv_ir.semantics import terms as T
    from tv_ir.semantics.symbolic import SymbolicAlgebra

    alg = SymbolicAlgebra()
    for group in lay.unreduced:
        first = per_device[group[0]][k]
        shape = lay.local_shape(group[0])
        box = tuple(slice(0, m) for m in shape)
        rest = np.array(first, dtype=object)
        for d in group[1:]:
            part = np.full(lay.tile_shape, T.ZERO, dtype=object)
            key = T.Key("partial", (k, d), _dtype_of(first), f"partial.arg{k}.dev{d}")
            part[box] = T.symbol_array(key, shape)
            per_device[d][k] = part
            rest[box] = alg.subtract(rest[box], part[box])
        per_device[group[0]][k] = rest


def _absent_elsewhere(lay: Layout, k: int, per_device: list[list]) -> None:
    """Argument k on the devices that do not hold its maximal layout: meaningless."""
    from tv_ir.semantics import terms as T

    for d, args in enumerate(per_device):
        if d == lay.maximal:
            continue
        x = np.asarray(args[k])
        if x.dtype == object:
            key = T.Key("absent", (k, d), _dtype_of(x), f"absent.arg{k}.dev{d}")
            args[k] = T.symbol_array(key, x.shape)
        else:
            args[k] = np.zeros_like(x)


def _sdy_devices(fn: Function, meshes: dict) -> int:
    """Devices of the mesh the function's shardings use (else the module's largest)."""
    names = {
        s.mesh
        for a in list(fn.arg_attrs) + list(fn.res_attrs)
        if (s := a.get("sdy.sharding")) is not None and isinstance(s.mesh, str)
    }
    sizes = [meshes[m].devices for m in names if m in meshes]
    sizes = sizes or [m.devices for m in meshes.values()]
    return max(sizes, default=1)


def _only_mesh(meshes: dict) -> str:
    if len(meshes) != 1:
        raise Unsupported("a partial-sum argument without a sharding naming its mesh")
    return next(iter(meshes))


def _partial_axes(fn: Function) -> dict[int, tuple[str, ...]]:
    """Argument index -> mesh axes it is reduced over by sdy.all_reduce / reduce_scatter."""
    from tv_ir.semantics.ops.registry import GLOBAL_VIEW
    from tv_ir.semantics.ops.sharding import REDUCING

    root = {v.id: k for k, v in enumerate(fn.body.args)}
    partial: dict[int, list[str]] = {}
    for op in fn.body.ops:
        if op.name not in GLOBAL_VIEW or not op.operands:
            continue
        k = root.get(op.operands[0].id)
        if k is None:
            continue
        root[op.results[0].id] = k
        if op.name in REDUCING:
            key = "reduction_axes" if op.name == "sdy.all_reduce" else "reduce_scatter_axes"
            text = str(getattr(op.attrs.get(key), "text", ""))
            if ":(" in text:
                raise Unsupported(f"{op.name} over sub-axes ({text})", op=op.name, loc=op.loc)
            for axis in re.findall(r'"([^"]+)"', text):
                if axis not in partial.setdefault(k, []):
                    partial[k].append(axis)
    return {k: tuple(v) for k, v in partial.items()}


def _zero_like(x):
    x = np.asarray(x)
    if x.dtype == object:
        from tv_ir.semantics import terms as T

        return T.ZERO
    return np.zeros((), x.dtype)


def _devices_in(shardings: list) -> int:
    n = 1
    for s in shardings:
        if s and "devices=[" in s:
            dims = s.split("devices=[", 1)[1].split("]", 1)[0]
            n = max(n, int(np.prod([int(x) for x in dims.split(",")])))
    return n


def has_manual_computation(module: Module) -> bool:
    def walk(block) -> bool:
        for op in block.ops:
            if op.name == "sdy.manual_computation" or (
                op.name == "stablehlo.custom_call"
                and op.attrs.get("call_target_name") == "SPMDFullToShardShape"
            ):
                return True
            if any(walk(r.block) for r in op.regions):
                return True
        return False

    return any(walk(fn.body) for fn in module.functions.values())


def _mesh_devices(module: Module) -> int:
    """`mhlo.num_partitions`, else the largest mesh's device count."""
    n = int(module.attrs.get("mhlo.num_partitions", 0))
    if n:
        return n
    meshes = module.attrs.get("sdy.meshes") or {}
    return max((m.devices for m in meshes.values()), default=1)


def _dtype_of(arr) -> str | None:
    """The element type of an array of input symbols (from their Keys)."""
    from tv_ir.semantics import terms as T

    for e in np.asarray(arr).reshape(-1):
        a = T.as_atom(e) if isinstance(e, T.Poly) else None
        if a is not None and a.kind == "sym" and isinstance(a.args[0], T.Key):
            return a.args[0].dtype
    return None
