"""Hugging Face's GPT-2 (`transformers.GPT2LMHeadModel`, unmodified) under torch_xla SPMD:
Megatron tensor parallelism on a (2, 4) ("data", "model") mesh, batch over "data", its
language-model loss with dropout on (train mode) and the output head tied to the token
embedding, as GPT-2 has it. XLA partitions the model; tv proves the per-device program
equal to the unsharded model.

    python examples/torch_xla/hf_gpt2.py [--eval] [--fsdp] [--time-limit S]
    python examples/torch_xla/hf_gpt2.py --train sgd|adamw [--fsdp] [--bug] [--time-limit S]

`--train` verifies a whole training step instead (`tvx.TrainStep`: the loss, `backward()`
and the optimizer's update, dropout off); `--bug` plants a doubled loss in the partitioned
step's loss function and verifies it against the correct step (`spec=`).

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
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

VOCAB, POSITIONS, DIM, HEADS = 72, 16, 32, 4
BATCH, SEQ = 2, 6  # 12 tokens: no size equals another, so shape reduction can tell them apart


class LanguageModelLoss(torch.nn.Module):
    """The model's own loss on a batch of token ids (labels are the ids, shifted inside)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, labels=ids).loss


def megatron(fsdp: bool = False) -> dict[str, tuple]:
    """GPT-2's Conv1D weights are (in, out): column-parallel splits dim 1, row-parallel
    dim 0; with `fsdp` the other dimension (and the token embedding) over "data"."""
    d = "data" if fsdp else None
    specs = {
        "model.transformer.h.0.attn.c_attn.weight": (d, "model"),
        "model.transformer.h.0.attn.c_proj.weight": ("model", d),
        "model.transformer.h.0.mlp.c_fc.weight": (d, "model"),
        "model.transformer.h.0.mlp.c_proj.weight": ("model", d),
    }
    if fsdp:
        specs["model.transformer.wte.weight"] = ("data", None)
    return specs


def gpt2(dropout: float) -> GPT2LMHeadModel:
    """A one-layer GPT-2 of the sizes above (weights from the current torch seed)."""
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=POSITIONS,
        n_embd=DIM,
        n_layer=1,
        n_head=HEADS,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        loss_type="ForCausalLM",
    )
    return GPT2LMHeadModel(config)


def verify(dropout: float = 0.1, fsdp: bool = False, **options):
    torch.manual_seed(0)
    model = LanguageModelLoss(gpt2(dropout))
    model.train(dropout > 0)
    mesh = xs.Mesh(np.arange(8), (2, 4), ("data", "model"))
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    return tvx.verify(
        model, ids, mesh=mesh, shardings=megatron(fsdp), input_shardings=[("data", None)], **options
    )


def language_model_loss(model, ids):
    return model(input_ids=ids, labels=ids).loss


def doubled_loss(model, ids):
    return model(input_ids=ids, labels=ids).loss * 2.0  # BUG: the loss doubled


def _step(optimizer: str = "sgd", bug: bool = False, fsdp: bool = False):
    """The step, its example ids and `tvx.verify`'s keyword arguments (see `verify_step`)."""
    torch.manual_seed(0)
    model = gpt2(0.0).train(False)
    make = {
        "sgd": lambda ps: torch.optim.SGD(ps, lr=1e-2),
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2),
    }[optimizer]
    step = tvx.TrainStep(model, doubled_loss if bug else language_model_loss, make)
    spec = tvx.TrainStep(copy.deepcopy(model), language_model_loss, make) if bug else None
    mesh = xs.Mesh(np.arange(8), (2, 4), ("data", "model"))
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    shardings = {k.removeprefix("model."): v for k, v in megatron(fsdp).items()}
    return (
        step,
        ids,
        dict(
            mesh=mesh,
            shardings=shardings,
            input_shardings=[("data", None)],
            spec=spec,
        ),
    )


def verify_step(optimizer: str = "sgd", bug: bool = False, fsdp: bool = False, **options):
    """A training step of the model (loss, backward, `optimizer`'s update) under the same
    Megatron shardings (with `fsdp`, weights also split over "data"), against the unsharded
    step; with `bug`, the sharded step's loss function is `doubled_loss` and the spec's the
    correct one."""
    step, ids, kwargs = _step(optimizer, bug, fsdp)
    return tvx.verify(step, ids, **kwargs, **options)


def export_step(optimizer: str = "sgd", bug: bool = False, fsdp: bool = False):
    """The step as `tvx.export` gives it (the programs, without verifying; bench/op_census.py)."""
    step, ids, kwargs = _step(optimizer, bug, fsdp)
    return tvx.export(step, ids, **kwargs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eval", action="store_true", help="dropout off (eval mode)")
    ap.add_argument("--fsdp", action="store_true", help="weights also split over 'data'")
    ap.add_argument("--train", choices=("sgd", "adamw"), help="verify a training step")
    ap.add_argument("--bug", action="store_true", help="with --train: a doubled loss")
    ap.add_argument("--time-limit", type=float, default=300.0)
    ap.add_argument("--memory-limit", type=float, default=None, help="MB")
    a = ap.parse_args()
    t0 = time.perf_counter()
    limits = {"time_limit": a.time_limit, "memory_limit": a.memory_limit, "progress": True}
    if a.train:
        report = verify_step(a.train, a.bug, a.fsdp, **limits)
    else:
        report = verify(0.0 if a.eval else 0.1, a.fsdp, **limits)
    print(report)
    print(f"verify: {time.perf_counter() - t0:.1f} s")
    raise SystemExit(report.exit_code)


if __name__ == "__main__":
    main()
