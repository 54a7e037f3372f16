"""The spec program as a graph: which op defines a value, which ops use it, op signatures.

Read by the stage prover to relate an implementation op to the spec ops it may mirror
(`mirrored_ops`) or repeat (`repeated_stages`); built once per proof, on first use."""

from __future__ import annotations

from tv_ir.ir.program import Module, Op
from tv_ir.ir.structure import attr_key, op_signature


class SpecGraph:
    def __init__(self, spec: Module) -> None:
        self._spec = spec
        self._defining: dict[int, tuple[Op, int]] | None = None  # value -> (op, result)
        self._users: dict[int, list[Op]] = {}
        self._signatures: dict[int, tuple] = {}  # id(op) -> op_signature(op)
        self._shape_free: dict[int, tuple] = {}  # id(op) -> shape_free_signature(op)

    def definition(self, vid: int) -> tuple[Op, int] | None:
        """(op, result index) defining spec value `vid`; None for an argument."""
        self._index()
        return self._defining.get(vid)

    def users(self, vid: int) -> list[Op]:
        """The top-level spec ops that read value `vid`, in program order."""
        self._index()
        return self._users.get(vid, [])

    def signature(self, op: Op) -> tuple:
        """`op_signature(op)`, remembered (any op: the implementation's too)."""
        s = self._signatures.get(id(op))
        if s is None:
            s = self._signatures[id(op)] = op_signature(op)
        return s

    def shape_free_signature(self, op: Op) -> tuple:
        s = self._shape_free.get(id(op))
        if s is None:
            s = self._shape_free[id(op)] = shape_free_signature(op)
        return s

    def _index(self) -> None:
        if self._defining is not None:
            return
        self._defining = {}
        for op in self._spec.main.body.ops:
            for j, r in enumerate(op.results):
                self._defining[r.id] = (op, j)
            for u in op.operands:
                users = self._users.setdefault(u.id, [])
                if not users or users[-1] is not op:
                    users.append(op)


def shape_free_signature(op: Op) -> tuple:
    """What an op computes whatever the shapes: its name, attributes and element types (for
    an element-wise op, or a dot holding its whole contraction, a block of the operands
    gives the same block of the result)."""
    return (
        op.name,
        tuple(sorted((k, attr_key(v)) for k, v in op.attrs.items())),
        tuple(str(getattr(v.type, "dtype", v.type)) for v in op.operands),
        tuple(str(getattr(v.type, "dtype", v.type)) for v in op.results),
    )
