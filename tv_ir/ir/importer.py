"""Import StableHLO (text or bytecode) and HLO text into tv_ir, through jaxlib's MLIR bindings.

This is the only module that touches MLIR objects. Legacy ops are legalised with StableHLO's
own passes before conversion; attributes are decoded once into plain Python values.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from tv_ir.errors import BadInput, Unsupported
from tv_ir.ir import attrs as A
from tv_ir.ir.program import (
    UNKNOWN_LOC,
    Block,
    Function,
    Location,
    Module,
    Op,
    Region,
    TensorType,
    TokenType,
    TupleType,
    Value,
    walk,
)
from tv_ir.ir.quantized_types import DEQUANTIZE_TARGET, QUANTIZE_TARGET, lower_quantized_types
from tv_ir.ir.sources import pick_frame

_BYTECODE_MAGIC = b"ML\xefR"
# XLA's dumps print constants of more than a few elements as `{...}` unless asked not to;
# its HLO parser would then make up their values
ELIDED_CONSTANT = re.compile(r"constant\(\{\.\.\.\}\)")
_TERMINATORS = {"stablehlo.return", "func.return", "sdy.return", "mhlo.return"}
# CHLO ops the op table defines directly (decomposing them would turn a math function into a
# polynomial approximation, which the prover could only treat as an opaque polynomial).
CHLO_NATIVE = {"chlo.erf", "chlo.tan", "chlo.erf_inv", "chlo.lgamma", "chlo.digamma"}
# `custom_call @mhlo.<op>`: how XLA's HLO -> StableHLO conversion (torch_xla's export)
# spells an HLO op that StableHLO lacks, its attributes in `mhlo.attributes`. The math ops
# are the CHLO op of the same name, TopK is `mhlo.topk` (what HLO text imports to); XLA:CPU
# runs them as such (tests/test_conformance.py, records mhlo_custom_calls, mhlo_topk)
# (target -> (op, the attributes it may carry))
MHLO_CUSTOM_CALLS = {
    f"mhlo.{n}": (f"chlo.{n}", frozenset())
    for n in ("erf", "tan", "asin", "acos", "acosh", "asinh", "atanh", "sinh", "cosh")
} | {"mhlo.topk": ("mhlo.topk", frozenset({"k", "largest"}))}

_context = None


def mlir_context():
    """One MLIR context with every dialect jax registers (stablehlo, chlo, sdy, mhlo, func)."""
    global _context
    if _context is None:
        from jax._src.interpreters import mlir as jmlir
        from jaxlib.mlir.dialects import stablehlo

        _context = jmlir.make_ir_context()
        stablehlo.register_stablehlo_passes()
        _context.allow_unregistered_dialects = False
    return _context


def read_source(source: str | bytes | os.PathLike) -> tuple[str | bytes, str]:
    """Return (contents, display name) for a path, or pass text/bytes through."""
    if isinstance(source, (bytes, bytearray)):
        return bytes(source), "<bytes>"
    if isinstance(source, os.PathLike) or (isinstance(source, str) and _names_a_file(source)):
        path = Path(source)
        if not path.exists():
            raise BadInput(f"{path}: no such file")
        if path.is_dir():
            raise BadInput(f"{path}: is a directory, expected a .mlir, .mlirbc or .hlo file")
        data = path.read_bytes()
        if not data.strip():
            raise BadInput(f"{path}: file is empty")
        if data.startswith(_BYTECODE_MAGIC):
            return data, str(path)
        try:
            return data.decode("utf-8"), str(path)
        except UnicodeDecodeError:
            raise BadInput(f"{path}: not a StableHLO/MLIR or HLO file (binary content)") from None
    return source, "<text>"


# HLO text: a module header, or (as XLA's tests write them) the entry computation first
HLO_TEXT_STARTS = ("HloModule", "ENTRY")


def _names_a_file(source: str) -> bool:
    """A one-line string is a path when such a file exists (XLA's dumps are named
    `module_0000.jit_f....txt`) or when it does not start like program text."""
    if "\n" in source or len(source) >= 4096:
        return False
    try:
        if Path(source).exists():
            return True
    except (OSError, ValueError):
        return False
    return not source.lstrip().startswith(("module", "func.func", *HLO_TEXT_STARTS))


def parse_mlir(source: str | bytes | os.PathLike):
    """Parse into an `ir.Module` (jaxlib bindings), converting HLO text first."""
    from jaxlib.mlir import ir

    data, name = read_source(source)
    hlo_config = {}
    if isinstance(data, str) and data.lstrip().startswith(HLO_TEXT_STARTS):
        if not data.lstrip().startswith("HloModule"):  # XLA's parser wants the header line
            data = "HloModule module\n\n" + data
        hlo_config = _hlo_module_config(data)
        data = hlo_text_to_stablehlo_bytecode(data, name)
    if isinstance(data, bytes) and not data.startswith(_BYTECODE_MAGIC):
        raise BadInput(f"{name}: not a StableHLO/MLIR or HLO file (binary content)")
    if isinstance(data, str):
        _refuse_verifier_crashes(data, name)
        data = lower_quantized_types(data)
    ctx = mlir_context()
    with ctx:
        try:
            m = ir.Module.parse(data)
        except Exception as e:  # MLIRError: keep the first diagnostic line
            msg = _first_diagnostic(str(e)).replace('"-":', "line ")
            if '!"quant"' in msg:  # bytecode: lower_quantized_types reads text only
                raise Unsupported(
                    f"{name}: quantized types in MLIR bytecode (tv reads them in text)"
                ) from None
            raise BadInput(f"{name}: malformed IR: {msg}") from None
        try:  # parsing verifies too; this catches what conversions may have left
            ok = m.operation.verify()
        except Exception as e:  # MLIRError with the verifier's diagnostics
            ok, why = False, _first_diagnostic(str(e))
        else:
            why = "IR does not verify"
        if not ok:
            raise BadInput(f"{name}: invalid IR: {why}")
        _keep_hlo_config(m, hlo_config)
    return m, name


# XLA's SPMD partitioner names the entry computation it makes `<name>_spmd`
SPMD_ENTRY = re.compile(r"^\s*ENTRY\s+%?[\w.\-]+_spmd\b", re.MULTILINE)
SPMD_PARTITIONED_ATTR = "tv.spmd_partitioned"


def _hlo_module_config(text: str) -> dict[str, int]:
    """`num_partitions` from an HLO module's header line (its conversion to StableHLO drops
    it; per-device programs need it to know their devices), and whether the entry is XLA's
    SPMD partitioner output (`SPMD_PARTITIONED_ATTR`)."""
    header = text.lstrip().split("\n", 1)[0]
    m = re.search(r"\bnum_partitions=(\d+)", header)
    config = {"mhlo.num_partitions": int(m.group(1))} if m else {}
    if SPMD_ENTRY.search(text):
        config[SPMD_PARTITIONED_ATTR] = 1
    return config


def _keep_hlo_config(m, config: dict[str, int]) -> None:
    from jaxlib.mlir import ir

    i32 = ir.IntegerType.get_signless(32)
    for key, value in config.items():
        if key not in m.operation.attributes:
            m.operation.attributes[key] = ir.IntegerAttr.get(i32, value)


_EMPTY_A2A_GROUPS = re.compile(
    r"all_to_all[\s\S]{0,600}?replica_groups\s*=\s*dense<[^>]*>\s*:\s*tensor<(\d+)x(\d+)xi64>"
)


def _refuse_verifier_crashes(text: str, name: str) -> None:
    """Inputs on which jaxlib's MLIR verifier dies (SIGFPE) instead of reporting an error."""
    for m in _EMPTY_A2A_GROUPS.finditer(text):
        if int(m.group(1)) * int(m.group(2)) == 0:
            raise BadInput(
                f"{name}: all_to_all with empty replica_groups (its split count "
                "cannot be checked against them)"
            )


def hlo_text_to_stablehlo_bytecode(text: str, name: str) -> bytes:
    from jax._src.lib import _jax
    from jax._src.lib import hlo as xhlo

    text = dense_mesh_replica_groups(text)
    if ELIDED_CONSTANT.search(text):
        raise BadInput(
            f"{name}: HLO text with elided constants (`constant({{...}})`): dump it again "
            "with XLA_FLAGS=--xla_dump_large_constants=true"
        )
    try:
        hm = xhlo.hlo_module_from_text(text)
    except Exception as e:
        raise BadInput(f"{name}: malformed HLO: {_first_diagnostic(str(e))}") from None
    return _jax.mlir.hlo_to_stablehlo(hm.as_serialized_hlo_module_proto())


def _first_diagnostic(msg: str) -> str:
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("error:"):
            return ln[len("error:") :].strip()
    return lines[-1] if lines else msg


def _legalize(m) -> None:
    """Legacy ops to current ones; CHLO to StableHLO where tv has no direct definition."""
    from jaxlib.mlir.passmanager import PassManager

    _mhlo_custom_calls_to_ops(m.operation)
    names = set()
    _collect_op_names(m.operation, names)
    passes = []
    if names & {
        "stablehlo.dot",
        "stablehlo.einsum",
        "stablehlo.unary_einsum",
        "stablehlo.broadcast",
        "stablehlo.create_token",
        "stablehlo.cross-replica-sum",
    }:
        passes.append("func.func(stablehlo-legalize-deprecated-ops)")
    if any(n.startswith("chlo.") and n not in CHLO_NATIVE for n in names):
        passes.append("func.func(chlo-legalize-to-stablehlo)")
    if passes:
        with m.context:
            PassManager.parse("builtin.module(" + ",".join(passes) + ")").run(m.operation)


def _mhlo_custom_calls_to_ops(op) -> None:
    """Replace each `custom_call @mhlo.<op>` of MHLO_CUSTOM_CALLS by the op it stands for,
    with its `mhlo.attributes` as the op's attributes (the op's verifier checks them); any
    other custom_call, or one with attributes beyond the known ones, stays (unknown)."""
    from jaxlib.mlir import ir

    for r in op.regions:
        for b in r.blocks:
            for o in list(b.operations):
                o = o.operation
                if o.name != "stablehlo.custom_call":
                    _mhlo_custom_calls_to_ops(o)
                    continue
                target = ir.StringAttr(o.attributes["call_target_name"]).value
                if target not in MHLO_CUSTOM_CALLS or len(o.operands) != 1:
                    continue
                name, allowed = MHLO_CUSTOM_CALLS[target]
                attrs = {}
                if "mhlo.attributes" in o.attributes:
                    d = ir.DictAttr(o.attributes["mhlo.attributes"])
                    attrs = {d[i].name: d[i].attr for i in range(len(d))}
                if not set(attrs) <= allowed:  # an attribute tv does not know the meaning of
                    continue
                with ir.InsertionPoint(o), o.location:
                    new = ir.Operation.create(
                        name,
                        results=[r.type for r in o.results],
                        operands=[o.operands[0]],
                        attributes=attrs,
                    )
                    new.verify()  # attributes it does not take, wrong types: MLIRError
                for old, repl in zip(o.results, new.results, strict=True):
                    old.replace_all_uses_with(repl)
                o.erase()


def _collect_op_names(op, names: set) -> None:
    for r in op.regions:
        for b in r.blocks:
            for o in b.operations:
                names.add(o.operation.name)
                _collect_op_names(o.operation, names)


def load(source: str | bytes | os.PathLike | Any) -> Module:
    """Import a module from a path, text, bytecode, HLO text or an `ir.Module`."""
    is_ir = hasattr(source, "operation") and hasattr(source, "body")
    if not is_ir and not isinstance(source, (str, bytes, bytearray, os.PathLike)):
        raise BadInput(
            f"no module: expected a path, text, bytecode or ir.Module, got {type(source).__name__}"
        )
    if is_ir:
        mlir_module, name = source, "<ir.Module>"
        with mlir_context():
            mlir_module = _reparse(mlir_module)
    else:
        mlir_module, name = parse_mlir(source)
    with mlir_module.context:
        _legalize(mlir_module)
        module = _Converter(name).module(mlir_module)
    if not module.functions:
        raise BadInput(f"{name}: module has no functions")
    verify_spec_constraints(module, name)
    _partitions_of_abstract_mesh(module)
    return module


def _partitions_of_abstract_mesh(module: Module) -> None:
    """JAX lowers a shard_map on an `AbstractMesh` (a mesh without devices: past the host's,
    or to check a plan before having its machines) with `mhlo.num_partitions = 1`; its
    manual computations name the mesh, and a program of one partition cannot run them (XLA
    refuses it), so the program's device count is the mesh's."""
    if int(module.attrs.get("mhlo.num_partitions", 0) or 0) != 1:
        return
    if int(module.attrs.get("mhlo.num_replicas", 1) or 1) != 1:
        return
    devices = max((m.devices for m in (module.attrs.get("sdy.meshes") or {}).values()), default=1)
    if devices <= 1:
        return
    manual = any(
        op.name == "sdy.manual_computation"
        for fn in module.functions.values()
        for op in walk(fn.body)
    )
    if manual:
        module.attrs["mhlo.num_partitions"] = devices


def _compare_types(dtype: str) -> tuple[str, ...]:
    """The `compare_type`s the StableHLO spec allows for an element type (C3 of compare)."""
    if dtype == "i1" or dtype.startswith("ui"):
        return ("UNSIGNED",)
    if dtype.startswith("i"):
        return ("SIGNED",)
    if dtype.startswith("complex"):
        return ("FLOAT",)
    return ("FLOAT", "TOTALORDER")


def verify_spec_constraints(module: Module, name: str) -> None:
    """Refuse IR that breaks a StableHLO spec constraint jaxlib's MLIR verifier does not check
    but XLA's does: reading it some other way would verify a program XLA never runs.

    - `stablehlo.compare`: `compare_type` SIGNED for signed integers, UNSIGNED for unsigned
      integers and booleans, FLOAT or TOTALORDER for floats (XLA's HLO verifier).
    """
    stack = [fn.body for fn in module.functions.values()]
    while stack:
        block = stack.pop()
        for op in block.ops:
            stack.extend(r.block for r in op.regions)
            if op.name != "stablehlo.compare" or "compare_type" not in op.attrs:
                continue
            kind = str(getattr(op.attrs["compare_type"], "value", op.attrs["compare_type"]))
            t = op.operands[0].type
            allowed = _compare_types(getattr(t, "dtype", ""))
            if kind not in allowed:
                raise BadInput(
                    f"{name}: invalid IR: stablehlo.compare at {op.loc} compares {t} as "
                    f"{kind} (the StableHLO spec and XLA's verifier require "
                    f"{' or '.join(allowed)} for {getattr(t, 'dtype', t)})"
                )


def _reparse(m):
    """Bring a module from another context (e.g. jax's) into ours via bytecode-free text."""
    from jaxlib.mlir import ir

    return ir.Module.parse(m.operation.get_asm(enable_debug_info=True))


class _Converter:
    def __init__(self, name: str):
        self.name = name
        self.values: dict[Any, Value] = {}

    def module(self, m) -> Module:
        funcs: dict[str, Function] = {}
        other: list[str] = []
        mod_attrs = {n: decode_attr(m.operation.attributes[n]) for n in m.operation.attributes}
        for op in m.body.operations:
            op = op.operation
            if op.name == "func.func":
                f = self.function(op)
                funcs[f.name] = f
            else:
                other.append(op.name)
                if op.name == "sdy.mesh":
                    mod_attrs.setdefault("sdy.meshes", {})[_sym_name(op)] = decode_attr(
                        op.attributes["mesh"]
                    )
        return Module(funcs, mod_attrs, self.name, other)

    def function(self, op) -> Function:
        from jaxlib.mlir import ir

        name = _sym_name(op)
        vis = (
            op.attributes["sym_visibility"].value if "sym_visibility" in op.attributes else "public"
        )
        ftype = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
        result_types = [convert_type(t) for t in ftype.results]
        arg_attrs = _dict_list(op, "arg_attrs", len(ftype.inputs))
        res_attrs = _dict_list(op, "res_attrs", len(ftype.results))
        if not op.regions or not op.regions[0].blocks:
            raise BadInput(
                f"{self.name}: function @{name} has no body (declarations not supported)"
            )
        block = self.block(op.regions[0].blocks[0])
        arg_names = [_arg_name(a) for a in op.regions[0].blocks[0].arguments]
        return Function(name, block, result_types, arg_attrs, res_attrs, arg_names, vis)

    def block(self, b) -> Block:
        args = []
        for a in b.arguments:
            v = Value(convert_type(a.type), _arg_name(a))
            self.values[a] = v
            args.append(v)
        ops: list[Op] = []
        results: list[Value] = []
        for o in b.operations:
            o = o.operation
            if o.name in _TERMINATORS:
                results = [self.values[x] for x in o.operands]
                continue
            ops.append(self.op(o))
        return Block(args, ops, results)

    def op(self, o) -> Op:
        operands = [self.values[x] for x in o.operands]
        attrs = {n: _attribute(o, n) for n in o.attributes}
        regions = [Region(self.block(r.blocks[0])) for r in o.regions if len(r.blocks)]
        name = o.name
        if name == "stablehlo.custom_call":  # quantize ops, as lower_quantized_types wrote them
            name = _QUANTIZE_OPS.get(attrs.get("call_target_name"), name)
        if name == "stablehlo.custom_call" and attrs.get("call_target_name") == "ragged_all_to_all":
            name, attrs = RAGGED_ALL_TO_ALL, _ragged_all_to_all_attrs(attrs)
        new = Op(name, operands, [], attrs, regions, convert_location(o.location, self.name))
        for i, r in enumerate(o.results):
            v = Value(convert_type(r.type), None, new, i)
            self.values[r] = v
            new.results.append(v)
        return new


_QUANTIZE_OPS = {
    QUANTIZE_TARGET: "stablehlo.uniform_quantize",
    DEQUANTIZE_TARGET: "stablehlo.uniform_dequantize",
}


# JAX's `lax.ragged_all_to_all` lowers to `custom_call @ragged_all_to_all` (XLA's HLO
# ragged-all-to-all), its groups and channel in `backend_config`
RAGGED_ALL_TO_ALL = "mhlo.ragged_all_to_all"


def _ragged_all_to_all_attrs(attrs: dict) -> dict:
    config = attrs.get("backend_config")
    if not isinstance(config, dict):
        raise Unsupported(
            "custom_call @ragged_all_to_all without its backend_config dictionary",
            op=RAGGED_ALL_TO_ALL,
        )
    out = {"replica_groups": config.get("replica_groups")}
    if int(config.get("channel_id", 0)) > 0:
        out["channel_handle"] = A.ChannelHandle(int(config["channel_id"]), 1)
    return out


def _attribute(o, name: str):
    try:
        return decode_attr(o.attributes[name])
    except TypeError as e:  # the bindings cannot hand out some attributes (complex constants)
        if "complex" in str(e) and o.name == "stablehlo.constant" and name == "value":
            return _complex_constant(o)
        if "complex" in str(e):
            raise Unsupported(
                f"{o.name}: a complex-valued {name} (complex numbers are not in the op table)",
                op=o.name,
            ) from None
        raise


_COMPLEX_PAIR = re.compile(r"\(\s*([^,()]+?)\s*,\s*([^,()]+?)\s*\)")


def _complex_constant(o) -> np.ndarray:
    """A complex constant's value, read from its printed form (the bindings cannot hand the
    attribute out): `dense<(re, im)>` (splat), `dense<[(re, im), ...]>` or the hex blob of
    interleaved parts; as complex128, each part rounded to the element type."""
    from jaxlib.mlir import ir

    t = ir.RankedTensorType(o.results[0].type)
    shape, et = tuple(t.shape), str(t.element_type)
    part = {"complex<f32>": np.dtype(np.float32), "complex<f64>": np.dtype(np.float64)}.get(et)
    if part is None:
        raise Unsupported(f"a constant of {et}", op=o.name)
    text = o.get_asm(large_elements_limit=None)
    body = text[text.index("dense<") + len("dense<") : text.rindex(">", 0, text.rindex(":"))]
    body = body.strip()
    n = int(np.prod(shape, dtype=np.int64))
    if body.startswith('"0x'):
        parts = np.frombuffer(bytes.fromhex(body.strip('"')[2:]), dtype=part)
    else:
        pairs = _COMPLEX_PAIR.findall(body)
        parts = np.array([_element(x, part) for p in pairs for x in p], dtype=part)
    parts = parts.astype(np.float64)
    values = parts[0::2] + 0j
    values.imag = parts[1::2]
    if values.size == 1 and n != 1:
        return np.broadcast_to(values.reshape(()), shape)
    if values.size != n:
        raise BadInput(f"complex constant {body[:80]}: read {values.size} elements, expected {n}")
    return values.reshape(shape)


def _sym_name(op) -> str:
    return op.attributes["sym_name"].value


def _dict_list(op, key: str, n: int) -> list[dict]:
    if key not in op.attributes:
        return [{} for _ in range(n)]
    return [decode_attr(d) for d in op.attributes[key]]


def _arg_name(a) -> str | None:
    try:
        loc = a.location
        if hasattr(loc, "name_str"):
            return loc.name_str
    except Exception:
        pass
    return None


_DTYPE_RE = re.compile(r"^(bf16|f\d+\w*|i\d+|ui\d+|si\d+|index|complex<.*>)$")


def convert_type(t):
    from jaxlib.mlir import ir

    s = str(t)
    if s == "!stablehlo.token":
        return TokenType()
    if s.startswith("tuple<"):
        tt = ir.TupleType(t)
        return TupleType(tuple(convert_type(tt.get_type(i)) for i in range(tt.num_types)))
    if s.startswith("!stablehlo.future<"):  # the value it will hold (ops/asynchronous.py)
        inner = [convert_type(ir.Type.parse(x)) for x in _top_level_split(s[18:-1])]
        return inner[0] if len(inner) == 1 else TupleType(tuple(inner))
    try:
        rt = ir.RankedTensorType(t)
    except Exception:
        raise BadInput(
            f"unsupported type {s} (only static ranked tensors, tokens, tuples)"
        ) from None
    if not rt.has_static_shape:
        raise BadInput(f"dynamic shape {s} not supported (tv needs static shapes)")
    et = str(rt.element_type)
    if et.startswith("si"):
        et = "i" + et[2:]
    return TensorType(tuple(rt.shape), et)


def _top_level_split(text: str) -> list[str]:
    """`a<b, c>, d` -> ["a<b, c>", "d"]: split at commas outside angle brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "<") - (ch == ">")
        if ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return parts + [text[start:].strip()]


def convert_location(loc, source: str = "-") -> Location:
    """JAX locations: NameLoc(name stack, CallSiteLoc(NameLoc(fn, FileLineColLoc), caller)).

    A callsite stack lists frames innermost first; the frame reported is the innermost that
    is the user's (`tv_ir.ir.sources.pick_frame`): library shims (optax, flax) are skipped when
    a caller is the user's code, and tv's own files are never named."""
    name = None
    frames: list = []  # (file, line, function), innermost first

    def visit(l, fn_name=None):
        nonlocal name
        cls = type(l).__name__
        if cls == "NameLoc":
            n = l.name_str
            if name is None and ("/" in n or n.startswith("jit")):
                name = n
            visit(l.child_loc, n)
        elif cls == "CallSiteLoc":
            visit(l.callee, fn_name)
            visit(l.caller, fn_name)
        elif cls == "FileLineColLoc":
            frames.append((l.filename, l.start_line, fn_name))
        elif cls == "FusedLoc":
            for x in l.locations:
                visit(x, fn_name)
        elif cls == "OpaqueLoc":
            pass

    try:
        visit(loc)
    except Exception:
        return UNKNOWN_LOC
    found = pick_frame(frames)
    if found is not None:
        f, line, fn = found
        f = source if f in ("-", "") else f
        return Location(f, line, name, fn if fn != name else None)
    return Location(None, None, name, None) if name else UNKNOWN_LOC


def decode_attr(a) -> Any:
    """An MLIR attribute as a plain Python value."""
    from jaxlib.mlir import ir
    from jaxlib.mlir._mlir_libs import _stablehlo as S

    if isinstance(a, ir.BoolAttr):
        return bool(a.value)
    if isinstance(a, ir.IntegerAttr):
        return int(a.value)
    if isinstance(a, ir.FloatAttr):
        return float(a.value)
    if isinstance(a, ir.StringAttr):
        return a.value
    if isinstance(a, ir.DenseI64ArrayAttr) or isinstance(a, ir.DenseI32ArrayAttr):
        return tuple(int(x) for x in a)
    if isinstance(a, ir.DenseF64ArrayAttr):
        return tuple(float(x) for x in a)
    if isinstance(a, ir.DenseBoolArrayAttr):
        return tuple(bool(x) for x in a)
    if isinstance(a, ir.DenseElementsAttr):
        return _dense_to_numpy(a)
    if isinstance(a, ir.DictAttr):
        return {a[i].name: decode_attr(a[i].attr) for i in range(len(a))}
    if isinstance(a, ir.ArrayAttr):
        return [decode_attr(x) for x in a]
    if isinstance(a, ir.FlatSymbolRefAttr):
        return a.value
    if isinstance(a, ir.TypeAttr):
        return str(a.value)
    if isinstance(a, ir.UnitAttr):
        return True
    if S.DotDimensionNumbers.isinstance(a):
        d = S.DotDimensionNumbers(a)
        return A.DotDims(
            tuple(d.lhs_batching_dimensions),
            tuple(d.rhs_batching_dimensions),
            tuple(d.lhs_contracting_dimensions),
            tuple(d.rhs_contracting_dimensions),
        )
    if S.GatherDimensionNumbers.isinstance(a):
        d = S.GatherDimensionNumbers(a)
        return A.GatherDims(
            tuple(d.offset_dims),
            tuple(d.collapsed_slice_dims),
            tuple(d.operand_batching_dims),
            tuple(d.start_indices_batching_dims),
            tuple(d.start_index_map),
            int(d.index_vector_dim),
        )
    if S.ScatterDimensionNumbers.isinstance(a):
        d = S.ScatterDimensionNumbers(a)
        return A.ScatterDims(
            tuple(d.update_window_dims),
            tuple(d.inserted_window_dims),
            tuple(d.input_batching_dims),
            tuple(d.scatter_indices_batching_dims),
            tuple(d.scattered_dims_to_operand_dims),
            int(d.index_vector_dim),
        )
    if S.ConvDimensionNumbers.isinstance(a):
        d = S.ConvDimensionNumbers(a)
        return A.ConvDims(
            d.input_batch_dimension,
            d.input_feature_dimension,
            tuple(d.input_spatial_dimensions),
            d.kernel_input_feature_dimension,
            d.kernel_output_feature_dimension,
            tuple(d.kernel_spatial_dimensions),
            d.output_batch_dimension,
            d.output_feature_dimension,
            tuple(d.output_spatial_dimensions),
        )
    if S.ChannelHandle.isinstance(a):
        c = S.ChannelHandle(a)
        return A.ChannelHandle(int(c.handle), int(c.channel_type))
    sdy_value = _decode_sdy(a)
    if sdy_value is not None:
        return sdy_value
    if S.ReplicaGroupMeshAxesAttr.isinstance(a):
        r = S.ReplicaGroupMeshAxesAttr(a)
        return A.MeshAxesGroups(str(r.mesh), tuple(str(x) for x in r.axes))
    for kind in (
        "ComparisonDirectionAttr",
        "ComparisonTypeAttr",
        "PrecisionAttr",
        "TransposeAttr",
        "FftTypeAttr",
        "RngAlgorithmAttr",
        "RngDistributionAttr",
    ):
        cls = getattr(S, kind, None)
        if cls is not None and cls.isinstance(a):
            return A.EnumAttr(kind, cls(a).value)
    return A.OpaqueAttr(str(a))


def _decode_sdy(a) -> Any:
    """Shardy attributes (shardings, meshes, manual axes) as `attrs` records; None otherwise."""
    from jaxlib.mlir.dialects import sdy

    if sdy.TensorShardingAttr.isinstance(a):
        return _sdy_sharding(sdy.TensorShardingAttr(a))
    if sdy.TensorShardingPerValueAttr.isinstance(a):
        shardings = sdy.TensorShardingPerValueAttr(a).shardings
        return [_sdy_sharding(sdy.TensorShardingAttr(t)) for t in shardings]
    if sdy.MeshAttr.isinstance(a):
        return _sdy_mesh(sdy.MeshAttr(a))
    if sdy.ManualAxesAttr.isinstance(a):
        return tuple(str(x) for x in sdy.ManualAxesAttr(a))
    if sdy.AxisRefAttr.isinstance(a):
        return _sdy_axis(a)
    return None


def _sdy_mesh(m) -> A.SdyMesh:
    from jaxlib.mlir.dialects import sdy

    axes = tuple((sdy.MeshAxisAttr(x).name, int(sdy.MeshAxisAttr(x).size)) for x in m.axes)
    ids = tuple(int(d) for d in m.device_ids)
    return A.SdyMesh(axes, ids if ids else None)


def _sdy_axis(x) -> A.SdyAxis:
    from jaxlib.mlir.dialects import sdy

    ref = sdy.AxisRefAttr(x)
    info = ref.sub_axis_info
    if info is None:
        return A.SdyAxis(ref.name)
    info = sdy.SubAxisInfoAttr(info)
    return A.SdyAxis(ref.name, int(info.pre_size), int(info.size))


def _sdy_sharding(ts) -> A.SdySharding:
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import sdy

    ref = ts.mesh_or_ref
    if isinstance(ref, ir.FlatSymbolRefAttr):
        mesh: str | A.SdyMesh = ref.value
    elif sdy.MeshAttr.isinstance(ref):
        mesh = _sdy_mesh(sdy.MeshAttr(ref))
    else:
        mesh = str(ref).lstrip("@")
    dims, open_dims, prios = [], [], []
    for i, d in enumerate(ts.dimension_shardings):
        d = sdy.DimensionShardingAttr(d)
        dims.append(tuple(_sdy_axis(x) for x in d.axes))
        if not d.is_closed:
            open_dims.append(i)
        prios.append(None if d.priority is None else int(d.priority))
    return A.SdySharding(
        mesh,
        tuple(dims),
        tuple(_sdy_axis(x) for x in ts.replicated_axes),
        tuple(_sdy_axis(x) for x in ts.unreduced_axes),
        tuple(open_dims),
        tuple(prios) if any(p is not None for p in prios) else (),
    )


def _dense_to_numpy(a) -> np.ndarray:
    from jaxlib.mlir import ir

    t = ir.ShapedType(a.type)
    et = str(t.element_type)
    if et.startswith("complex"):
        raise Unsupported(f"a constant of {et} (complex numbers are not in the op table)")
    dt = _small_float_dtype(et) if et != "f16" else None
    if dt is not None:
        # the bindings cannot hand these buffers to numpy: read the printed form, each
        # element rounded to the type (the exact value of its bits), then widened
        shape = tuple(t.shape)
        if a.is_splat:  # a broadcast view: a splat of any size costs one element
            return np.broadcast_to(np.float64(_splat_value(a, dt)), shape)
        values = _printed_elements(str(a), dt, int(np.prod(shape, dtype=np.int64)))
        return values.reshape(shape)
    arr = np.array(a)
    if arr.dtype.kind == "f":
        arr = arr.astype(np.float64)
    if arr.shape != tuple(t.shape):  # splat: a broadcast view, one element whatever its size
        arr = np.broadcast_to(arr.reshape(-1)[:1].reshape(()), tuple(t.shape))
    return arr


def _small_float_dtype(et: str):
    """The ml_dtypes type of bf16 and the f8/f6/f4 types (None for other types)."""
    if et != "bf16" and not re.fullmatch(r"f[468]E\d+M\d+\w*", et):
        return None
    import ml_dtypes

    name = "bfloat16" if et == "bf16" else "float" + et[1] + "_" + et[2:].lower()
    dt = getattr(ml_dtypes, name, None)
    if dt is None:
        raise BadInput(f"constant of element type {et}: not a type tv can read")
    return np.dtype(dt)


_ELEMENT = re.compile(r"0x[0-9A-Fa-f]+|[-+]?(?:inf|nan)|[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _printed_elements(text: str, dt: np.dtype, n: int) -> np.ndarray:
    """The elements of a printed dense attribute (`dense<[[1.5, 2.0], ...]>`, or the hex
    blob `dense<"0x...">`), as float64 values of type `dt`."""
    body = text[text.index("dense<") + len("dense<") : text.rindex(">", 0, text.rindex(":"))]
    body = body.strip()
    if body.startswith('"0x'):
        raw = bytes.fromhex(body.strip('"')[2:])
        values = np.frombuffer(raw, dtype=np.dtype(f"uint{dt.itemsize * 8}")).view(dt)
    else:
        values = np.array([_element(tok, dt) for tok in _ELEMENT.findall(body)], dtype=dt)
    if values.size != n:
        raise BadInput(f"constant {text[:80]}: read {values.size} elements, expected {n}")
    return values.astype(np.float64)


def _element(tok: str, dt: np.dtype):
    """One printed element: a decimal (rounded to the type) or hex bits (MLIR prints
    infinities and NaNs that way)."""
    if tok.startswith("0x"):
        return np.array([int(tok, 16)], dtype=f"uint{dt.itemsize * 8}").view(dt)[0]
    return np.array(float(tok)).astype(dt)


def _splat_value(a, dt) -> float:
    text = str(a)
    m = re.search(r"dense<([^>]*)>", text)
    s = m.group(1).strip() if m else "0"
    return float(np.float64(_element(s, np.dtype(dt))))


def extract_function(text: str, name: str, num_partitions: int | None = None) -> str:
    """A module holding only function @name, renamed @main (meshes and other top-level ops
    kept), e.g. to hand one function of a multi-function module to XLA."""
    from jaxlib.mlir import ir

    module, source = parse_mlir(text)
    with module.context:
        found = False
        for op in list(module.body.operations):
            op = op.operation
            if op.name != "func.func":
                continue
            if _sym_name(op) == name:
                op.attributes["sym_name"] = ir.StringAttr.get("main")
                found = True
            else:
                op.erase()
        if not found:
            raise BadInput(f"{source}: no function @{name}")
        if num_partitions is not None:
            i32 = ir.IntegerType.get_signless(32)
            module.operation.attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(
                i32, num_partitions
            )
            module.operation.attributes["mhlo.num_replicas"] = ir.IntegerAttr.get(i32, 1)
    return module.operation.get_asm(enable_debug_info=True)


# `replica_groups=mesh['a'=4,'b'=2], device_ids=([2,4]T(1,0)) {'a'}`: XLA's mesh-axes replica
# groups. jaxlib's HLO -> StableHLO conversion keeps the axes but drops the device order,
# so tv writes them out as the dense groups XLA means before converting.
_MESH_GROUPS = re.compile(
    r"replica_groups=mesh\[(?P<axes>[^\]]*)\](?:,\s*device_ids=\((?P<ids>[^()]*(?:\([^()]*\))?)\))?"
    r"\s*\{(?P<group>[^}]*)\}"
)


def dense_mesh_replica_groups(text: str) -> str:
    """HLO text with mesh-axes replica groups replaced by XLA's flattened dense groups."""
    return _MESH_GROUPS.sub(lambda m: "replica_groups=" + _dense_groups(m), text)


def _dense_groups(m: re.Match) -> str:
    names, sizes = [], []
    for item in m.group("axes").split(","):
        name, size = item.strip().rsplit("=", 1)
        names.append(name.strip().strip("'\""))
        sizes.append(int(size))
    n = int(np.prod(sizes, dtype=np.int64))
    devices = _device_order(m.group("ids"), n).reshape(sizes)
    per_axis: dict[int, list[tuple[int, int]]] = {}
    for ref in re.findall(r"'([^']+)'(?::\((\d+)\)(\d+))?", m.group("group")):
        axis = names.index(ref[0])
        full = sizes[axis]
        pre, size = (int(ref[1]), int(ref[2])) if ref[1] else (1, full)
        per_axis.setdefault(axis, []).append((pre, size))
    # reshape every grouped axis into [pad, sub, pad, sub, ..., rest] (XLA's
    # ComputeReindexedAxes), then move the grouped sub-axes last, in the order listed
    shape, grouped, order = [], [], []
    for axis, full in enumerate(sizes):
        if axis not in per_axis:
            shape.append(full)
            continue
        prefix = 1
        mine = {}
        for pre, size in sorted(per_axis[axis]):
            if pre != prefix:
                shape.append(pre // prefix)
                prefix = pre
            mine[(pre, size)] = len(shape)
            shape.append(size)
            prefix *= size
        if prefix != full:
            shape.append(full // prefix)
        grouped += [mine[ps] for ps in per_axis[axis]]
    order = [d for d in range(len(shape)) if d not in grouped] + grouped
    per_group = int(np.prod([shape[d] for d in grouped], dtype=np.int64))
    flat = devices.reshape(shape).transpose(order).reshape(-1, per_group)
    return "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in flat.tolist()) + "}"


def _device_order(ids: str | None, n: int) -> np.ndarray:
    """A mesh's device assignment: iota, `[dims]T(perm)` (iota reshaped and transposed), or
    an explicit list."""
    if ids is None:
        return np.arange(n)
    ids = ids.strip()
    m = re.fullmatch(r"\[([\d,\s]+)\](?:T\(([\d,\s]+)\))?", ids)
    if m:
        dims = [int(x) for x in m.group(1).split(",")]
        perm = [int(x) for x in m.group(2).split(",")] if m.group(2) else list(range(len(dims)))
        return np.arange(n).reshape(dims).transpose(perm).reshape(-1)
    if re.fullmatch(r"[\d,\s]+", ids):
        return np.array([int(x) for x in ids.split(",")])
    raise BadInput(f"mesh device_ids ({ids}) in HLO replica groups: form not understood")
