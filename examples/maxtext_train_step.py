"""MaxText's own jitted training step, verified against itself: XLA's SPMD partitioning of
the step on an fsdp x tensor (x expert) mesh of 8 CPU devices is proved equal to the
unpartitioned step.

Runs in a separate environment with MaxText 0.2.4 (Python 3.12; see docs/jax.md, "MaxText"):

    DECOUPLE_GCLOUD=TRUE /work/envs/maxtext/bin/python examples/maxtext_train_step.py \
        [--layers 1] [--emb 32] [--seq 8] [--heads 2] [--head-dim 12] [--vocab 20] \
        [--batch 4] [--fsdp 4] [--tensor 2] [--expert 1] [--experts 0] [--topk 2] \
        [--time-limit S] [--memory-limit MB] [--progress] [--no-verify] [--dump FILE] \
        [KEY=VALUE ...]

The step is built as MaxText's `train_compile.py` builds it (its NNX Llama-2 decoder, AdamW
with a warmup-cosine schedule and global-norm clipping, scanned layers, full remat, its
logical-axis rules), on host CPU devices instead of a TPU topology. Extra KEY=VALUE
arguments are MaxText config overrides. Prints MaxText's compile time of the same step, then
the report, the seconds verify took and the process's peak resident memory.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import sys
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("DECOUPLE_GCLOUD", "TRUE")  # no Google Cloud clients installed

import jax  # noqa: E402
from flax.linen import partitioning as nn_partitioning  # noqa: E402
from jax.sharding import AxisType, Mesh  # noqa: E402
from maxtext.configs import pyconfig  # noqa: E402
from maxtext.trainers.pre_train import train, train_compile  # noqa: E402
from maxtext.utils import maxtext_utils, sharding  # noqa: E402
from tv_ir.frontends.jax import verify  # noqa: E402

BASE_CONFIG = os.path.join(os.path.dirname(pyconfig.__file__), "base.yml")


def config_argv(args: argparse.Namespace) -> list[str]:
    """MaxText's command line for a small Llama-2 on CPU."""
    return [
        "maxtext",
        BASE_CONFIG,
        "run_name=tv",
        f"base_output_directory={os.path.join(tempfile.gettempdir(), 'maxtext_output')}",
        "hardware=cpu",
        "skip_jax_distributed_system=true",
        "enable_checkpointing=false",
        "jax_cache_dir=",  # no persistent compilation cache: the compile time is measured
        "dataset_type=synthetic",
        *decoder_argv(args),
        f"base_num_decoder_layers={args.layers}",
        f"base_emb_dim={args.emb}",
        f"base_mlp_dim={args.emb * 2}",
        f"base_num_query_heads={args.heads}",
        f"base_num_kv_heads={args.heads}",
        f"head_dim={args.head_dim}",
        f"vocab_size={args.vocab}",
        f"max_target_length={args.seq}",
        f"per_device_batch_size={args.batch / (args.fsdp * args.tensor * args.expert)}",
        f"ici_fsdp_parallelism={args.fsdp}",
        f"ici_tensor_parallelism={args.tensor}",
        f"ici_expert_parallelism={args.expert}",
        "ici_data_parallelism=1",
        "scan_layers=true",
        "remat_policy=full",
        "attention=dot_product",
        "enable_dropout=false",
        "steps=100",
        *args.overrides,
    ]


def decoder_argv(args: argparse.Namespace) -> list[str]:
    """The decoder: dense Llama-2, or with `--experts N` MaxText's Mixtral block (a routed
    MoE MLP of N experts, top-k routing, each expert's MLP as wide as the dense one)."""
    if not args.experts:
        return ["decoder_block=llama2"]
    return [
        "decoder_block=mixtral",
        f"num_experts={args.experts}",
        f"num_experts_per_tok={args.topk}",
        f"base_moe_mlp_dim={args.emb * 2}",
    ]


def build_step(config):
    """The jitted train step and its abstract arguments, as `train_compile.py` makes them,
    on a mesh of the host's devices."""
    device_mesh = maxtext_utils.create_device_mesh(config, jax.devices())
    axis_type = AxisType.Auto
    mesh = Mesh(device_mesh, config.mesh_axes, axis_types=(axis_type,) * len(config.mesh_axes))
    shaped_args, _, state_shardings, _, model = train_compile.get_shaped_inputs(mesh, config)
    params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(
        config, state_shardings
    )
    input_state_shardings = sharding.build_zero1_input_state_mesh_shardings(
        config, state_shardings, params_shardings
    )
    data_sharding = sharding.get_input_data_sharding(config, mesh)
    func, in_shard, out_shard, static_argnums, donate_argnums = (
        maxtext_utils.get_functional_train_with_signature(
            train.train_step, data_sharding, input_state_shardings, model, config, params_shardings
        )
    )
    jitted = jax.jit(
        func,
        in_shardings=in_shard,
        out_shardings=out_shard,
        static_argnums=static_argnums,
        donate_argnums=donate_argnums,
    )
    return mesh, jitted, shaped_args


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--emb", type=int, default=32)
    parser.add_argument("--seq", type=int, default=8)
    parser.add_argument("--heads", type=int, default=2)
    # sizes that are no other dimension's (nor a shard's): a constant equal to a dimension's
    # size keeps that dimension at its real size (docs/jax.md, "Real sizes")
    parser.add_argument("--head-dim", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=20)
    parser.add_argument("--batch", type=int, default=4, help="global batch")
    parser.add_argument("--fsdp", type=int, default=4)
    parser.add_argument("--tensor", type=int, default=2)
    parser.add_argument("--expert", type=int, default=1, help="expert parallelism")
    parser.add_argument(
        "--experts", type=int, default=0, help="MoE: Mixtral block with this many experts"
    )
    parser.add_argument("--topk", type=int, default=2, help="MoE: experts per token")
    parser.add_argument("--time-limit", type=float, default=1800)
    parser.add_argument("--memory-limit", type=float, default=7000)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--progress", action="store_true", help="stage counts on stderr")
    parser.add_argument("--no-verify", action="store_true", help="only compile")
    parser.add_argument("--dump", help="write the step's StableHLO to this file")
    parser.add_argument("overrides", nargs="*", help="MaxText config KEY=VALUE")
    args = parser.parse_args()

    config = pyconfig.initialize(config_argv(args))
    mesh, jitted, shaped_args = build_step(config)

    def context():  # as train_compile.py compiles: the mesh (new and old API) and the rules
        return jax.set_mesh(mesh), mesh, nn_partitioning.axis_rules(config.logical_axis_rules)

    with contextlib.ExitStack() as stack:
        for c in context():
            stack.enter_context(c)
        t0 = time.perf_counter()
        lowered = jitted.lower(*shaped_args)
        try:
            lowered.compile()
            compiled = "lower + compile"
        except jax.errors.JaxRuntimeError as e:  # MoE's ragged_all_to_all: not on XLA:CPU
            compiled = f"lower (XLA:CPU cannot compile it: {str(e).splitlines()[0]})"
        compile_s = time.perf_counter() - t0
    print(f"MaxText train step: {compiled} {compile_s:.1f} s", flush=True)
    if args.dump:  # the annotated StableHLO verify reads, for `tv partition FILE`
        with open(args.dump, "w") as f:
            f.write(lowered.as_text(debug_info=True))
    if args.no_verify:
        return

    options = {"time_limit": args.time_limit, "memory_limit": args.memory_limit}
    if args.timeout is not None:
        options["timeout"] = args.timeout
    if args.progress:
        options["progress"] = lambda line: print(line, file=sys.stderr, flush=True)
    with contextlib.ExitStack() as stack:
        for c in context():
            stack.enter_context(c)
        t0 = time.perf_counter()
        report = verify(jitted, *shaped_args, **options)
        verify_s = time.perf_counter() - t0
    print(report)
    print(
        f"verdict {report.verdict}: verify {verify_s:.1f} s, peak {peak_mb():.0f} MB "
        f"(MaxText {compiled.split(' (')[0]} {compile_s:.1f} s)"
    )


if __name__ == "__main__":
    main()
