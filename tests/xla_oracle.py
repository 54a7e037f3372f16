"""The reference for conformance tests: XLA on CPU running StableHLO text.

`run_xla(text, args)` compiles the module text with the jax client (cached per text) and
runs it on the first CPU device; `lower(fn, *args)` is `jax.jit(fn).lower(*args).as_text()`.
Also a few helpers to write StableHLO text by hand.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

_CACHE_SIZE = 256
_executables: OrderedDict[str, Any] = OrderedDict()


def _compile(text: str) -> Any:
    """A loaded executable for `text`, compiled once (LRU-cached by text)."""
    exe = _executables.get(text)
    if exe is not None:
        _executables.move_to_end(text)
        return exe
    from jax._src import compiler
    from jax._src.lib import xla_client as xc

    devs = jax.devices("cpu")
    opts = compiler.get_compile_options(num_replicas=1, num_partitions=1)
    exe = devs[0].client.compile_and_load(text, xc.DeviceList(tuple(devs[:1])), opts)
    _executables[text] = exe
    if len(_executables) > _CACHE_SIZE:
        _executables.popitem(last=False)
    return exe


def run_xla(text: str, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run the StableHLO module `text` on XLA:CPU; returns numpy arrays."""
    exe = _compile(text)
    dev = jax.devices("cpu")[0]
    with jax.enable_x64(True):  # keep 64-bit inputs 64-bit
        outs = exe.execute([jax.device_put(np.asarray(a), dev) for a in args])
        return [np.asarray(o) for o in outs]


def lower(fn: Callable, *args: Any) -> str:
    """StableHLO text of `jax.jit(fn)` traced at `args`."""
    return jax.jit(fn).lower(*args).as_text()


# -- writing StableHLO by hand -----------------------------------------------------------

MLIR_DTYPE = {
    "float32": "f32",
    "float64": "f64",
    "float16": "f16",
    "bfloat16": "bf16",
    "bool": "i1",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "ui8",
    "uint16": "ui16",
    "uint32": "ui32",
    "uint64": "ui64",
}


def ttype(shape: Sequence[int], dtype: Any) -> str:
    """MLIR tensor type: ttype((2, 3), np.float32) == 'tensor<2x3xf32>'."""
    et = MLIR_DTYPE.get(np.dtype(dtype).name, None) if not isinstance(dtype, str) else dtype
    if et is None:
        raise ValueError(f"no MLIR element type for {dtype}")
    dims = "".join(f"{d}x" for d in shape)
    return f"tensor<{dims}{et}>"


def module(args: Sequence[np.ndarray], results: Sequence[str], body: str) -> str:
    """A module whose @main takes arrays like `args` (%a0, %a1, ...) and returns `results`.

    `body` is the text of the ops; it must end with a `return`.
    """
    params = ", ".join(
        f"%a{i}: {ttype(np.shape(a), np.asarray(a).dtype)}" for i, a in enumerate(args)
    )
    res = ", ".join(results)
    return f"module {{\n  func.func public @main({params}) -> ({res}) {{\n{body}\n  }}\n}}\n"


def arr(x: Any) -> str:
    """An `array<i64: ...>` attribute."""
    return "array<i64" + (": " + ", ".join(str(int(v)) for v in x) if len(x) else "") + ">"


def dense2d(rows: Sequence[Sequence[int]]) -> str:
    """A `dense<[[...]]> : tensor<Nx2xi64>` attribute (padding)."""
    inner = ", ".join("[" + ", ".join(str(int(v)) for v in r) + "]" for r in rows)
    return f"dense<[{inner}]> : tensor<{len(rows)}x2xi64>"
