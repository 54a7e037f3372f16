"""Where the implementation's arguments and results live: one Layout each, on N devices.

A single-device implementation is the case N = 1 with every value whole on device 0, so the
prover has one code path for rewrites and for distributed programs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import BadInput, Unsupported
from ..ir import Function, Module, TensorType
from ..layout import Layout


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
    def from_module(cls, spec: Function, impl: Module) -> Placement:
        """A per-device module's own `mhlo.sharding` argument/result attributes, if any.

        A module without them whose program holds `sdy.manual_computation`s (shard_map), or
        GSPMD `@SPMDFullToShardShape` custom calls, runs on every device of its mesh with its
        global arguments and results replicated.
        """
        main = impl.main
        args = [a.get("mhlo.sharding") for a in main.arg_attrs]
        if not any(args):
            if _has_manual_computation(impl):
                return cls.replicated(spec, _mesh_devices(impl))
            return cls.single_device(spec)
        n = int(impl.attrs.get("mhlo.num_partitions", 0)) or _devices_in(args)
        results = [r.get("mhlo.sharding") or "{replicated}" for r in main.res_attrs]
        return cls.from_shardings(spec, [a or "{replicated}" for a in args], results, n)

    def shard_inputs(self, inputs: list) -> list[list]:
        """Per-device argument lists [device][arg] from global inputs."""
        return [
            [lay.shard(x, d, pad=_zero_like(x)) for lay, x in zip(self.args, inputs, strict=True)]
            for d in range(self.num_devices)
        ]

    def assemble_outputs(self, per_device: list[list], add=None) -> list:
        return [
            lay.assemble([per_device[d][k] for d in range(self.num_devices)], add)
            for k, lay in enumerate(self.results)
        ]


def _shape(t) -> tuple:
    return tuple(t.shape) if isinstance(t, TensorType) else ()


def _zero_like(x):
    x = np.asarray(x)
    if x.dtype == object:
        from .. import terms as T

        return T.ZERO
    return np.zeros((), x.dtype)


def _devices_in(shardings: list) -> int:
    n = 1
    for s in shardings:
        if s and "devices=[" in s:
            dims = s.split("devices=[", 1)[1].split("]", 1)[0]
            n = max(n, int(np.prod([int(x) for x in dims.split(",")])))
    return n


def _has_manual_computation(module: Module) -> bool:
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
    sizes = [int(np.prod([s for _, s in m.axes])) for m in meshes.values()]
    return max(sizes, default=1)
