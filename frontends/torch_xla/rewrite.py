"""Edits of a captured module (jaxlib MLIR bindings): name the arguments, inline the values
the program only reads, point op locations at user source, set the partition count, and put
the arguments in a given order (to line a spec up with its implementation)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tv_ir.errors import BadInput

from .capture import Arg, Captured
from .locations import site_of


@dataclass
class Program:
    """A captured program as StableHLO text, with its argument and result names."""

    text: str
    arg_names: list[str]
    arg_kinds: list[str]
    outputs: list[str]
    name: str
    num_devices: int
    located_ops: int = 0  # ops placed at a user source line
    named_ops: int = 0  # ops with a torch op name


def build(cap: Captured, order: list[tuple[str, str]] | None = None) -> Program:
    """The captured module as text: named arguments (constants inlined), user locations,
    `mhlo.num_partitions`; with `order` ((name, type) pairs), arguments in that order (a
    name the program does not read becomes an unused argument)."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    from tv_ir.ir.importer import mlir_context

    ctx = mlir_context()
    with ctx, ir.Location.unknown():
        try:
            m = stablehlo.deserialize_portable_artifact(ctx, cap.bytecode)
        except Exception as e:
            raise BadInput(f"torch_xla's StableHLO did not parse: {e}") from None
        main = _main(m)
        block = main.regions[0].blocks[0]
        kept = _inline_constants(main, block, cap.args)
        if order is not None:
            kept = _reorder(main, block, kept, order)
        for arg, (name, _) in zip(block.arguments, kept, strict=True):
            arg.set_location(ir.Location.name(name))
        located, named = _relocate(main)
        if cap.num_devices > 1:
            i32 = ir.IntegerType.get_signless(32)
            m.operation.attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(i32, cap.num_devices)
            m.operation.attributes["mhlo.num_replicas"] = ir.IntegerAttr.get(i32, 1)
        text = m.operation.get_asm(enable_debug_info=True)
    return Program(
        text=text,
        arg_names=[n for n, _ in kept],
        arg_kinds=[k for _, k in kept],
        outputs=list(cap.outputs),
        name=cap.name,
        num_devices=cap.num_devices,
        located_ops=located,
        named_ops=named,
    )


def signature(prog_text: str) -> list[tuple[str, str]]:
    """(argument name, type) of `@main`, read back from a built program."""
    from jaxlib.mlir import ir

    from tv_ir.ir.importer import mlir_context

    with mlir_context():
        m = ir.Module.parse(prog_text)
        main = _main(m)
        block = main.regions[0].blocks[0]
        return [(ir.NameLoc(a.location).name_str, str(a.type)) for a in block.arguments]


def _main(m):
    for op in m.body.operations:
        if op.operation.name == "func.func" and op.attributes["sym_name"].value == "main":
            return op
    raise BadInput("torch_xla's module has no @main")


def _arg_attrs(main, n: int) -> list:
    from jaxlib.mlir import ir

    if "arg_attrs" in main.attributes:
        return list(ir.ArrayAttr(main.attributes["arg_attrs"]))
    return [ir.DictAttr.get({}) for _ in range(n)]


def _set_signature(main, block, attrs: list) -> None:
    from jaxlib.mlir import ir

    ftype = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
    new = ir.FunctionType.get([a.type for a in block.arguments], ftype.results)
    main.attributes["function_type"] = ir.TypeAttr.get(new)
    main.attributes["arg_attrs"] = ir.ArrayAttr.get(attrs)


def _inline_constants(main, block, args: list[Arg]) -> list[tuple[str, str]]:
    """Replace each "const" argument by a `stablehlo.constant` of its captured value."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    if len(args) != len(block.arguments):
        raise BadInput(
            f"torch_xla's module has {len(block.arguments)} arguments but {len(args)} inputs"
        )
    attrs = _arg_attrs(main, len(args))
    first = block.operations[0]
    for arg, info in zip(list(block.arguments), args, strict=True):
        if info.kind != "const":
            continue
        value = np.asarray(info.value)
        rtype = ir.RankedTensorType(arg.type)
        dense = ir.DenseElementsAttr.get(
            np.ascontiguousarray(value.reshape(rtype.shape)),
            type=rtype.element_type,
            shape=list(rtype.shape),
        )
        with ir.InsertionPoint(first):
            const = stablehlo.ConstantOp(dense).result
            _fold_converts(arg, value, rtype)
        arg.replace_all_uses_with(const)
    keep = [i for i, a in enumerate(args) if a.kind != "const"]
    for i in reversed(range(len(args))):
        if args[i].kind == "const":
            block.erase_argument(i)
    _set_signature(main, block, [attrs[i] for i in keep])
    return [(args[i].name, args[i].kind) for i in keep]


_NP_TYPES = {"f32": np.float32, "f16": np.float16, "f64": np.float64}


def _fold_converts(arg, value: np.ndarray, rtype) -> None:
    """`convert(c)` of a captured value becomes a constant of the converted type, rounded as
    the conversion rounds (what XLA's constant folding does): torch_xla hands Python floats
    over as f64 scalars, and tv reads a convert over the reals, so an unfolded
    `convert(0.001 : f64) : f32` would differ from XLA's folded f32 constant."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    for use in list(arg.uses):
        op = use.owner
        if op.name != "stablehlo.convert":
            continue
        out = ir.RankedTensorType(op.results[0].type)
        np_type = _NP_TYPES.get(str(out.element_type))
        if np_type is None:
            continue
        rounded = np.ascontiguousarray(value.reshape(out.shape).astype(np_type))
        dense = ir.DenseElementsAttr.get(rounded, type=out.element_type, shape=list(out.shape))
        op.results[0].replace_all_uses_with(stablehlo.ConstantOp(dense).result)


def _reorder(main, block, kept: list, order: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Arguments in the order of `order`'s names; missing names become unused arguments."""
    from jaxlib.mlir import ir

    attrs = _arg_attrs(main, len(kept))
    by_name = {name: i for i, (name, _) in enumerate(kept)}
    extra = [name for name, _ in kept if name not in {n for n, _ in order}]
    if extra:
        raise BadInput(f"spec reads {', '.join(extra)}, which the implementation does not have")
    old = list(block.arguments)
    new_attrs, new_kept = [], []
    for name, type_str in order:
        t = ir.Type.parse(type_str)
        new = block.add_argument(t, ir.Location.unknown())
        if name in by_name:
            i = by_name[name]
            if str(old[i].type) != type_str:
                raise BadInput(
                    f"{name} is {old[i].type} in spec but {type_str} in the implementation"
                )
            old[i].replace_all_uses_with(new)
            new_attrs.append(attrs[i])
            new_kept.append(kept[i])
        else:
            new_attrs.append(ir.DictAttr.get({}))
            new_kept.append((name, "unused"))
    for _ in old:
        block.erase_argument(0)
    _set_signature(main, block, new_attrs)
    return new_kept


def _relocate(main) -> tuple[int, int]:
    """Each op's location becomes NameLoc("fn/aten::op", FileLineColLoc(user file:line))."""
    from jaxlib.mlir import ir

    counts = [0, 0]

    def walk(op):
        for region in op.regions:
            for b in region.blocks:
                for o in b.operations:
                    site = site_of(o.location)
                    if site.name is not None:
                        counts[1] += 1
                        if site.file is not None:
                            counts[0] += 1
                            child = ir.Location.file(site.file, site.line, 0)
                            o.location = ir.Location.name(site.name, childLoc=child)
                        else:
                            o.location = ir.Location.name(site.name)
                    walk(o.operation)

    walk(main.operation)
    return counts[0], counts[1]
