"""A GPT/Llama-style decoder block (RMSNorm, causal attention, SwiGLU MLP) with
Megatron-style tensor parallelism on a (2, 4) ("data", "model") mesh: column-parallel
q/k/v and gate/up projections, row-parallel output and down projections, batch split over
"data".

`ManualBlock` writes the row-parallel down projection by hand in a manually sharded region
(local matmul, then an all_reduce over "model"); its `bug` plants a missing or doubled
all_reduce or a wrong scale.

    python examples/torch_xla/gpt_block.py [OUT_DIR]   # verify; write the files for `tv`
"""

# ruff: noqa: I001  (tv_ir.frontends.torch_xla configures torch_xla: import it first)
from __future__ import annotations

import math
import sys

import tv_ir.frontends.torch_xla as tvx  # sets torch_xla's CPU runtime first

import torch  # noqa: E402
from torch import nn  # noqa: E402

from torch_common import all_reduce, automatic, axis_groups, manual, mesh_2x4  # noqa: E402

B, S, D, H, F = 2, 4, 8, 4, 16  # batch, sequence, model dim, heads, MLP dim

MESH = mesh_2x4(("data", "model"))
SHARDINGS = {
    "attn_q.weight": ("model", None),  # column-parallel: heads split over "model"
    "attn_k.weight": ("model", None),
    "attn_v.weight": ("model", None),
    "attn_o.weight": (None, "model"),  # row-parallel
    "mlp_gate.weight": ("model", None),
    "mlp_up.weight": ("model", None),
    "mlp_down.weight": (None, "model"),
}
INPUT_SHARDINGS = [("data", None, None)]


class RMSNorm(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * self.weight


class Block(nn.Module):
    def __init__(self, d: int = D, heads: int = H, ff: int = F):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.attn_q = nn.Linear(d, d, bias=False)
        self.attn_k = nn.Linear(d, d, bias=False)
        self.attn_v = nn.Linear(d, d, bias=False)
        self.attn_o = nn.Linear(d, d, bias=False)
        self.mlp_gate = nn.Linear(d, ff, bias=False)
        self.mlp_up = nn.Linear(d, ff, bias=False)
        self.mlp_down = nn.Linear(ff, d, bias=False)

    def attention(self, x):
        b, s, d = x.shape
        hd = d // self.heads

        def split(t):
            return t.view(b, s, self.heads, hd).transpose(1, 2)

        q, k, v = split(self.attn_q(x)), split(self.attn_k(x)), split(self.attn_v(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, -1e9)
        out = torch.softmax(scores, dim=-1) @ v
        return self.attn_o(out.transpose(1, 2).reshape(b, s, d))

    def down(self, h):
        return self.mlp_down(h)

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        h = self.norm2(x)
        return x + self.down(nn.functional.silu(self.mlp_gate(h)) * self.mlp_up(h))


class ManualBlock(Block):
    """The down projection as a manually sharded region with an explicit all_reduce."""

    def __init__(self, bug: str | None = None):
        super().__init__()
        self.bug = bug

    def down(self, h):
        groups = axis_groups(MESH, "model")
        h_local = manual(h, ("data", None, "model"), MESH)  # (B/2, S, F/4)
        w_local = manual(self.mlp_down.weight, (None, "model"), MESH)  # (D, F/4)
        y = h_local @ w_local.t()  # this device's partial sum over F
        if self.bug == "wrong_scale":
            y = all_reduce(y, groups, scale=1.0 / 4)  # a mean where a sum is needed
        elif self.bug != "missing_all_reduce":
            y = all_reduce(y, groups)
        if self.bug == "double_all_reduce":
            y = all_reduce(y, groups)
        return automatic(y, ("data", None, None), (h.shape[0], h.shape[1], D), MESH)


# A manual region whose all_reduce is missing is refuted. With its all_reduce (correct, doubled
# or wrongly scaled), torch_xla 2.9's manual region crashes XLA's SPMD partitioner (a CHECK
# failure in hlo_sharding.cc, in jaxlib's XLA and in torch_xla's own runtime alike), so those
# programs cannot be built at all; tests/test_torch_xla.py keeps the correct one as an xfail.
BUGS = ("missing_all_reduce",)
CRASHING_IN_XLA = (None, "double_all_reduce", "wrong_scale")


def example_input() -> torch.Tensor:
    return torch.randn(B, S, D, generator=torch.Generator().manual_seed(0))


def verify_auto(**options):
    """Automatic SPMD: XLA's partitioning of the block against its own unsharded meaning."""
    return tvx.verify(
        Block(), example_input(), mesh=MESH, shardings=SHARDINGS,
        input_shardings=INPUT_SHARDINGS, **options,
    )  # fmt: skip


def verify_manual(bug: str | None = None, **options):
    """The hand-written region (correct, or with `bug`) against the plain block."""
    return tvx.verify(
        ManualBlock(bug), example_input(), mesh=MESH, shardings=SHARDINGS,
        input_shardings=INPUT_SHARDINGS, spec=Block(), **options,
    )  # fmt: skip


def export(bug: str | None = None) -> tvx.Exported:
    model = ManualBlock(bug) if bug is not None else Block()
    return tvx.export(
        model, example_input(), mesh=MESH, shardings=SHARDINGS,
        input_shardings=INPUT_SHARDINGS, spec=Block(),
    )  # fmt: skip


if __name__ == "__main__":
    print(verify_auto())
    for bug in BUGS:
        print(f"--- manual region, bug={bug}")
        print(verify_manual(bug))
    if len(sys.argv) > 1:
        from partitioner_bugs import write_all

        write_all(sys.argv[1], "gpt_block", export, BUGS)
