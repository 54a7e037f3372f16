"""A training step (MLP, mean-squared loss, backward, AdamW) under data parallelism +
FSDP on a (2, 4) ("data", "fsdp") mesh: the batch split over both axes, every weight
split along its first dimension over "fsdp" (XLA all-gathers it for the matmuls and
reduce-scatters / all-reduces the gradients).

    python examples/torch_xla/train_dp_fsdp.py [OUT_DIR]   # verify; write files for `tv`
"""

# ruff: noqa: I001  (tv_ir.frontends.torch_xla configures torch_xla: import it first)
from __future__ import annotations

import sys

import tv_ir.frontends.torch_xla as tvx  # sets torch_xla's CPU runtime first

import torch  # noqa: E402
from torch import nn  # noqa: E402

from torch_common import mesh_2x4  # noqa: E402

B, D, F = 8, 4, 8
MESH = mesh_2x4(("data", "fsdp"))
SHARDINGS = {"up.weight": ("fsdp", None), "down.weight": ("fsdp", None)}
BATCH = (("data", "fsdp"), None)
INPUT_SHARDINGS = [BATCH, BATCH]


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(D, F, bias=False)
        self.down = nn.Linear(F, D, bias=False)

    def forward(self, x):
        return self.down(torch.tanh(self.up(x)))


def mse(model, x, y):
    err = model(x) - y
    return (err * err).mean()


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)


def step() -> tvx.TrainStep:
    return tvx.TrainStep(MLP(), mse, adamw)


def example_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, D, generator=g), torch.randn(B, D, generator=g)


def verify(**options):
    """XLA's partitioning of the step against the step's own unsharded meaning."""
    return tvx.verify(
        step(), *example_inputs(), mesh=MESH, shardings=SHARDINGS,
        input_shardings=INPUT_SHARDINGS, **options,
    )  # fmt: skip


def export(bug: str | None = None) -> tvx.Exported:
    return tvx.export(
        step(), *example_inputs(), mesh=MESH, shardings=SHARDINGS,
        input_shardings=INPUT_SHARDINGS, spec=step(),
    )  # fmt: skip


if __name__ == "__main__":
    print(verify())
    if len(sys.argv) > 1:
        from partitioner_bugs import write_all

        write_all(sys.argv[1], "train_dp_fsdp", export, ())
