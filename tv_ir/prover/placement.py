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
        """A per-device module's own `mhlo.sharding` argument/result attributes, if any."""
        main = impl.main
        args = [a.get("mhlo.sharding") for a in main.arg_attrs]
        if not any(args):
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
