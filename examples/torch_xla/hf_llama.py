"""Hugging Face's Llama (`transformers.LlamaForCausalLM`, unmodified: RMSNorm, rotary
embeddings, grouped-query attention, SwiGLU) under torch_xla SPMD: Megatron tensor
parallelism on a (2, 4) ("data", "model") mesh, the batch over "data". XLA partitions the
model; tv proves the per-device program equal to the unsharded model.

    python examples/torch_xla/hf_llama.py [--fsdp] [--time-limit S]
    python examples/torch_xla/hf_llama.py --train sgd|adamw [--fsdp] [--bug] [--time-limit S]

`--train` verifies a whole training step (`tvx.TrainStep`: the loss, `backward()` and the
optimizer's update); `--bug` plants a loss scaled by the data-parallel width in the
partitioned step's loss function (a gradient averaged twice, written the other way round)
and verifies it against the correct step (`spec=`).

Needs the `hf` extra (`pip install 'tv-ir[torch,hf]'`, transformers 4.57.1).
"""

# ruff: noqa: I001  (tv_ir.frontends.torch_xla configures torch_xla: import it first)
from __future__ import annotations

import argparse
import copy
import time

import tv_ir.frontends.torch_xla as tvx  # sets torch_xla's CPU runtime first

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch_xla.distributed.spmd as xs  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

VOCAB, DIM, FFN, HEADS, KV_HEADS = 72, 64, 96, 8, 4
BATCH, SEQ = 2, 6  # 12 tokens: no size equals another, so shape reduction can tell them apart


def megatron(fsdp: bool = False) -> dict[str, tuple]:
    """nn.Linear weights are (out, in): column-parallel splits dim 0 (q, k, v, gate, up),
    row-parallel dim 1 (o, down); with `fsdp` the other dimension (and the token
    embedding) over "data"."""
    d = "data" if fsdp else None
    layer = "model.layers.0."
    specs = {
        f"{layer}self_attn.q_proj.weight": ("model", d),
        f"{layer}self_attn.k_proj.weight": ("model", d),
        f"{layer}self_attn.v_proj.weight": ("model", d),
        f"{layer}self_attn.o_proj.weight": (d, "model"),
        f"{layer}mlp.gate_proj.weight": ("model", d),
        f"{layer}mlp.up_proj.weight": ("model", d),
        f"{layer}mlp.down_proj.weight": (d, "model"),
    }
    if fsdp:
        specs["model.embed_tokens.weight"] = ("data", None)
    return specs


def llama() -> LlamaForCausalLM:
    """A one-layer Llama of the sizes above (weights from the current torch seed)."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=DIM,
        intermediate_size=FFN,
        num_hidden_layers=1,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=16,
        attn_implementation="eager",
    )
    return LlamaForCausalLM(config).train(False)


def language_model_loss(model, ids):
    return model(input_ids=ids, labels=ids).loss


def loss_times_dp(model, ids):
    return model(input_ids=ids, labels=ids).loss * 2.0  # BUG: scaled by the 2 data shards


class LanguageModelLoss(torch.nn.Module):
    """The model's own loss on a batch of token ids (labels are the ids, shifted inside)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return language_model_loss(self.model, ids)


def verify(fsdp: bool = False, **options):
    """The model's loss (its forward) under Megatron TP, the batch over "data"."""
    torch.manual_seed(0)
    model = LanguageModelLoss(llama())
    mesh = xs.Mesh(np.arange(8), (2, 4), ("data", "model"))
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    return tvx.verify(
        model,
        ids,
        mesh=mesh,
        shardings={f"model.{k}": v for k, v in megatron(fsdp).items()},  # inside the wrapper
        input_shardings=[("data", None)],
        **options,
    )


def _step(optimizer: str = "adamw", bug: bool = False, fsdp: bool = False):
    """The step, its example ids and `tvx.verify`'s keyword arguments (see `verify_step`)."""
    torch.manual_seed(0)
    model = llama()
    make = {
        "sgd": lambda ps: torch.optim.SGD(ps, lr=1e-2),
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2),
    }[optimizer]
    step = tvx.TrainStep(model, loss_times_dp if bug else language_model_loss, make)
    spec = tvx.TrainStep(copy.deepcopy(model), language_model_loss, make) if bug else None
    mesh = xs.Mesh(np.arange(8), (2, 4), ("data", "model"))
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    return (
        step,
        ids,
        dict(
            mesh=mesh,
            shardings=megatron(fsdp),
            input_shardings=[("data", None)],
            spec=spec,
        ),
    )


def verify_step(optimizer: str = "adamw", bug: bool = False, fsdp: bool = False, **options):
    """A training step (loss, backward, `optimizer`'s update) under the same shardings,
    against the unsharded step; with `bug`, the sharded step's loss function is
    `loss_times_dp` and the spec's the correct one."""
    step, ids, kwargs = _step(optimizer, bug, fsdp)
    return tvx.verify(step, ids, **kwargs, **options)


def export_step(optimizer: str = "adamw", bug: bool = False, fsdp: bool = False):
    """The step as `tvx.export` gives it (the programs, without verifying; bench/op_census.py)."""
    step, ids, kwargs = _step(optimizer, bug, fsdp)
    return tvx.export(step, ids, **kwargs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fsdp", action="store_true", help="weights also split over 'data'")
    ap.add_argument("--train", choices=("sgd", "adamw"), help="verify a training step")
    ap.add_argument("--bug", action="store_true", help="with --train: a loss scaled by 2")
    ap.add_argument("--time-limit", type=float, default=300.0)
    ap.add_argument("--memory-limit", type=float, default=None, help="MB")
    a = ap.parse_args()
    t0 = time.perf_counter()
    limits = {"time_limit": a.time_limit, "memory_limit": a.memory_limit, "progress": True}
    if a.train:
        report = verify_step(a.train, a.bug, a.fsdp, **limits)
    else:
        report = verify(a.fsdp, **limits)
    print(report)
    print(f"verify: {time.perf_counter() - t0:.1f} s")
    raise SystemExit(report.exit_code)


if __name__ == "__main__":
    main()
