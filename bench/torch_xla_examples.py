"""Export + verification time of the torch_xla examples beside torch_xla's own compile time.

    .venv/bin/python bench/torch_xla_examples.py

For each example: capture as StableHLO (`export`), XLA partitioning + proof (`verify`), and
torch_xla compiling the same sharded program for its 8 CPU devices (`CompileTime` from
torch_xla's metrics, one run with `torch_xla.sync()`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import tv_ir.frontends.torch_xla as tvx  # noqa: E402, I001  (configures torch_xla first)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "torch_xla"))

import gpt_block  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.debug.metrics as met  # noqa: E402
import torch_xla.distributed.spmd as xs  # noqa: E402
import train_dp_fsdp  # noqa: E402


def torch_xla_compile_seconds(run) -> float:
    """Run the sharded program once on torch_xla; its compile time in seconds."""
    met.clear_all()
    run()
    torch_xla.sync()
    data = met.metric_data("CompileTime")
    return data[1] / 1e9 if data else float("nan")


def _sharded(model, mesh, shardings):
    model = model.to(torch_xla.device())
    for name, p in model.named_parameters():
        if name in shardings:
            xs.mark_sharding(p, mesh, shardings[name])
    return model


def _inputs(args, mesh, specs):
    out = []
    for a, s in zip(args, specs, strict=True):
        a = a.to(torch_xla.device())
        if s is not None:
            xs.mark_sharding(a, mesh, s)
        out.append(a)
    return out


def gpt_run():
    m = _sharded(gpt_block.Block(), gpt_block.MESH, gpt_block.SHARDINGS)
    (x,) = _inputs([gpt_block.example_input()], gpt_block.MESH, gpt_block.INPUT_SHARDINGS)
    m(x).sum().item()


def train_run():
    t = train_dp_fsdp
    m = _sharded(t.MLP(), t.MESH, t.SHARDINGS)
    x, y = _inputs(list(t.example_inputs()), t.MESH, t.INPUT_SHARDINGS)
    opt = t.adamw(list(m.parameters()))
    loss = t.mse(m, x, y)
    loss.backward()
    opt.step()
    torch_xla.sync()
    loss.item()


EXAMPLES = {
    "gpt_block (Megatron TP, forward)": (lambda: gpt_block.export(None), gpt_run),
    "train_dp_fsdp (AdamW step)": (lambda: train_dp_fsdp.export(None), train_run),
}


def main() -> None:
    print(
        f"{'example':36} {'export s':>9} {'verify s':>9} {'verdict':>12} {'torch_xla compile':>18}"
    )
    for name, (export, run) in EXAMPLES.items():
        t0 = time.perf_counter()
        exp = export()
        t1 = time.perf_counter()
        exp.spec = None  # verify the partitioning against the program's own meaning
        report = tvx.check_exported(exp)
        t2 = time.perf_counter()
        compile_s = torch_xla_compile_seconds(run)
        print(f"{name:36} {t1 - t0:9.2f} {t2 - t1:9.2f} {report.verdict:>12} {compile_s:18.2f}")


if __name__ == "__main__":
    main()
