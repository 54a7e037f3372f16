"""Run Shardy's own partitioning passes (registered in jaxlib) on a Shardy-annotated module.

This is the second partitioner tv can check besides XLA's (`partitioner.py`): the pass
pipelines of openxla/shardy's executable tests, run through jaxlib's pass manager. The
output is the per-device program of every function (collectives explicit, shardings
dropped); the layouts of its arguments and results are the `sdy.sharding`s of the input.

jaxlib 0.10.2 carries an older Shardy than openxla/shardy's head: `sdy-resolve-permutation-
factors` and `sdy-convert-global-to-local` have no replica/partition-count options (programs
run on partitions only) and `sdy-resolve-single-device-sharding` does not exist.
"""

from __future__ import annotations

import json

from tv_ir.errors import BadInput

# name -> pass pipeline (`{halo}`: whether permutation factors may use halo exchange)
PIPELINES = {
    # sharded ops -> explicit reshards -> collectives -> per-device shapes
    "partitioner": (
        "builtin.module("
        "func.func(sdy-insert-explicit-reshards{{enable-full-version=true}}),"
        "sdy-resolve-permutation-factors{{enable-halo-exchange={halo}}},"
        "func.func(sdy-reshard-to-collectives,sdy-pad-for-divisibility),"
        "sdy-convert-global-to-local,sdy-inline-meshes,sdy-drop-sharding-and-mesh)"
    ),
    # explicit sdy collectives only: global shapes -> per-device shapes
    "global-to-local": (
        "builtin.module(sdy-convert-global-to-local,sdy-inline-meshes,sdy-drop-sharding-and-mesh)"
    ),
    # a single-device rewrite: implicit gather/scatter batch dims made explicit
    "gather-scatter-batching": "builtin.module(func.func(sdy-explicit-gather-scatter-batching))",
}


def run_shardy(text: str, pipeline: str = "partitioner", halo_exchange: bool = True) -> str:
    """The module (a path or text) after one of Shardy's PIPELINES, as text with source
    locations."""
    from jaxlib.mlir.passmanager import PassManager

    from tv_ir.ir.importer import _first_diagnostic, parse_mlir

    if pipeline not in PIPELINES:
        raise BadInput(f"unknown Shardy pipeline {pipeline!r} (one of {', '.join(PIPELINES)})")
    module, name = parse_mlir(text)
    spec = PIPELINES[pipeline].format(halo=str(halo_exchange).lower())
    with module.context:
        try:
            PassManager.parse(spec).run(module.operation)
        except Exception as e:  # MLIRError: the pass's first diagnostic
            msg = _first_diagnostic(str(e)).replace('"-":', "line ")
            raise BadInput(f"{name}: Shardy's {pipeline} passes failed: {msg}") from None
    text = module.operation.get_asm(enable_debug_info=True)
    if name != "<text>":  # locations name the input file (its lines), not "-"
        text = text.replace('loc("-":', f"loc({json.dumps(name)}:")
    return text
