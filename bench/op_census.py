"""Op coverage: the StableHLO spec's ops, and an op census of real programs, against tv's op
table. Writes both tables into docs/ops.md (between marker comments).

    python bench/op_census.py            # lower the programs, rewrite both tables
    python bench/op_census.py --spec     # only the spec table (no lowering; what the test checks)

The spec list is the `## Ops` section of openxla/stablehlo's docs/spec.md (commit
3c9301c1, 2026-08-13). The census lowers the programs this repository ships (examples/jax,
tests/programs/transformer.py, examples/torch_xla) and a small HF-style torch model (tied
embeddings, LayerNorm, exact GELU, dropout, AdamW) under torch_xla, each in a subprocess, and
counts every op tv's importer hands on (after its legalisations), with custom calls by target.
tests/test_op_coverage.py checks that the spec table in docs/ops.md matches the op table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ops.md"
SPEC_BEGIN, SPEC_END = "<!-- spec-coverage:begin -->", "<!-- spec-coverage:end -->"
CENSUS_BEGIN, CENSUS_END = "<!-- census:begin -->", "<!-- census:end -->"

SPEC_OPS = """
abs add after_all all_gather all_reduce all_to_all and async_done async_start atan2
batch_norm_grad batch_norm_inference batch_norm_training bitcast_convert broadcast_in_dim
case cbrt ceil cholesky clamp collective_broadcast collective_permute collective_reduce
compare complex composite concatenate constant convert convolution cosine count_leading_zeros
custom_call divide dot_general dynamic_broadcast_in_dim dynamic_conv dynamic_gather
dynamic_iota dynamic_pad dynamic_reshape dynamic_slice dynamic_update_slice exponential
exponential_minus_one fft floor gather get_dimension_size get_tuple_element if imag infeed
iota is_finite log log_plus_one logistic map maximum minimum multiply negate not
optimization_barrier or outfeed pad partition_id popcnt power real recv reduce
reduce_precision reduce_scatter reduce_window remainder replica_id reshape reverse rng
rng_bit_generator round_nearest_afz round_nearest_even rsqrt scatter select
select_and_scatter send shift_left shift_right_arithmetic shift_right_logical sign sine slice
sort sqrt subtract tan tanh transpose triangular_solve tuple uniform_dequantize
uniform_quantize while xor
""".split()

# why a spec op has no semantics in tv (every unsupported spec op needs one)
UNSUPPORTED_WHY = {
    "collective_reduce": "newer than jaxlib 0.10.2's StableHLO",
    "infeed": "host I/O: values from outside the program",
    "outfeed": "host I/O: side effects",
    "recv": "host / cross-program communication",
    "send": "host / cross-program communication",
}

# supported ops XLA:CPU cannot translate: their records run the spec's definition on XLA
XLA_RUNS_DEFINITION = ("dynamic_conv", "uniform_dequantize", "uniform_quantize")

# what a supported spec op is limited to (a reader's first question)
SUPPORTED_NOTE = {
    "custom_call": "targets `Sharding`, `SPMDFullToShardShape`, `SPMDShardToFullShape`, "
    "`mhlo.topk` and the `mhlo.<math op>` targets; any other target is unknown",
    **{
        f"dynamic_{n}": "shape operands known, equal to the static result type"
        for n in ("broadcast_in_dim", "iota", "reshape")
    },
    "dynamic_pad": "padding operands known",
    "cholesky": "XLA:CPU's choices: the other triangle zero, NaN everywhere if a pivot fails",
    "dynamic_gather": "slice sizes known",
    "rng_bit_generator": "XLA's generators bit for bit; a known state, unsigned results",
    "bitcast_convert": "values that depend on the inputs: an opaque function of each "
    "element's bits, the same on both sides, its values known concretely (from integers to "
    "a wider type; from floats only to the same or a narrower width); XLA's float total-order "
    "comparison through bit casts (`select(bits < 0, 0x7fffffff - bits, bits)` on both sides "
    "of a signed compare) is read as `compare ..., TOTALORDER` (`passes/total_order_compare.py`)",
    "real": "complex operands too (see complex)",
    "complex": "complex values as pairs of real terms, never cut-points; complex outputs "
    "are unknown; ops on complex values: add/subtract/multiply/divide/negate/abs/exponential/"
    "select/convert, dot_general, reduce, iota, data movement, real/imag/fft",
    "imag": "see complex",
    "after_all": "tokens carry no value: ordering only (tv's programs have no side effects)",
    "async_start": "the body's op (a collective, in lockstep on every device, or a slice) "
    "applied to the operands; the future holds its results",
    "async_done": "see async_start",
    "dynamic_conv": "padding known: convolution with that padding; reference: XLA running "
    "the convolution (it cannot translate dynamic_conv)",
    "rng": "only where the spec fixes the numbers: UNIFORM over an integer interval [a, a + 1)"
    " with known bounds; otherwise unknown (implementation-defined numbers)",
    "uniform_quantize": "per-tensor and per-axis `!quant.uniform` types, held as storage "
    "integers; input-dependent floats are unknown (rounding); other ops on quantized types "
    "are refused; reference: XLA running the spec's `quantize` (it cannot translate the op)",
    "uniform_dequantize": "as uniform_quantize; proved symbolically: (q - zero_point) * "
    "scale; reference: XLA running the spec's `dequantize`",
    "fft": "FFT/IFFT/RFFT/IRFFT as the DFT sum (n^2 products per transformed dimension); "
    "coefficients in float64, exact where rational (0, +-1/2, +-1)",
    "sort": "input-dependent keys by a sorting network",
    "while": (
        "proved once by induction when spec and impl loop alike (docs/equivalence.md, Loops), "
        "else unrolled when the trip count is known"
    ),
    "if": "predicate known, or both branches as a select",
    "case": "index known",
    "all_gather": "SPMD programs",
    "all_reduce": "SPMD programs",
    "all_to_all": "SPMD programs",
    "collective_broadcast": "SPMD programs",
    "collective_permute": "SPMD programs",
    "reduce_scatter": "SPMD programs",
    "partition_id": "SPMD programs",
    "replica_id": "SPMD programs",
}


def registered() -> set[str]:
    import tv_ir.semantics.ops  # noqa: F401  (registers every evaluator)
    from tv_ir.semantics.ops.registry import COLLECTIVES, GLOBAL_VIEW, OPS, PROCESS_OPS

    return set(OPS) | set(PROCESS_OPS) | set(COLLECTIVES) | set(GLOBAL_VIEW)


def spec_table() -> str:
    """The spec's ops, each supported (with its limits) or not (with the reason)."""
    ops = registered()
    rows, n = [], 0
    for name in SPEC_OPS:
        if f"stablehlo.{name}" in ops:
            n += 1
            rows.append(f"| `{name}` | yes | {SUPPORTED_NOTE.get(name, '')} |")
        else:
            rows.append(f"| `{name}` | no | {UNSUPPORTED_WHY.get(name, '?')} |")
    indirect = ", ".join(f"`{o}`" for o in XLA_RUNS_DEFINITION)
    head = (
        f"{n} of the spec's {len(SPEC_OPS)} ops ({100 * n / len(SPEC_OPS):.0f}%) have "
        "semantics in tv, each with a conformance record against XLA:CPU (for "
        f"{indirect}, which XLA cannot translate, against XLA running their definition "
        "in other ops).\n\n"
        "| op | supported | limits / reason |\n|---|---|---|"
    )
    return head + "\n" + "\n".join(rows)


# -- the census ---------------------------------------------------------------------------

# name -> (group, what to lower); each group runs in its own subprocess
PROGRAMS = {
    "jax llama train step (spec)": "jax",
    "jax examples (8 sharded steps)": "jax",
    "jax transformer block + grad": "jax",
    "jax idioms (exact GELU, top_k router, rbg dropout, attention)": "jax",
    "jax MoE token exchange (shard_map ragged_all_to_all, fft mixing)": "jax",
    "torch_xla gpt_block (Megatron)": "torch",
    "torch_xla MLP DP+FSDP AdamW step": "torch",
    "torch_xla HF-style model (LayerNorm, exact GELU, dropout, tied embeddings) + AdamW": "torch",
    "torch_xla transformers GPT2LMHeadModel AdamW step (Megatron + FSDP)": "torch",
    "torch_xla transformers LlamaForCausalLM AdamW step (Megatron + FSDP)": "torch",
}


def count_ops(text: str) -> Counter:
    """Ops of a program as tv imports it (legalised), custom calls by target."""
    import tv_ir
    from tv_ir.ir.program import walk

    c: Counter = Counter()
    module = tv_ir.load(text)
    for f in module.functions.values():
        for op in walk(f.body):
            if op.name == "stablehlo.custom_call":
                c[f"stablehlo.custom_call @{op.attrs.get('call_target_name')}"] += 1
            else:
                c[op.name] += 1
    return c


def _jax_programs() -> dict[str, list[str]]:
    sys.path.insert(0, str(ROOT / "examples" / "jax"))
    sys.path.insert(0, str(ROOT / "bench"))
    sys.path.insert(0, str(ROOT / "tests"))
    import jax
    import jax.numpy as jnp
    import numpy as np
    from tv_ir.frontends.jax import verify  # noqa: F401  (8 CPU devices)

    out: dict[str, list[str]] = {}
    import llama

    import examples as bench_examples

    out["jax llama train step (spec)"] = [
        jax.jit(llama.train_step).lower(llama.param_shapes(), llama.batch_shapes()).as_text()
    ]
    texts = []
    for row, (module, kwargs) in bench_examples.ROWS.items():
        if "(" in row or "--" in row:
            continue  # variants of a row already counted
        step, args = bench_examples.step_and_args(module, kwargs)
        texts.append(step.lower(*args).as_text())
    out["jax examples (8 sharded steps)"] = texts
    from programs import transformer

    out["jax transformer block + grad"] = [transformer.lower("spec", grad=g) for g in (0, 1)]

    def idioms(x, router, w):
        h = jax.nn.gelu(x @ w, approximate=False)
        gates, experts = jax.lax.top_k(jax.nn.softmax(x @ router), 2)
        keep = jax.random.bernoulli(jax.random.key(0, impl="rbg"), 0.9, h.shape)
        h = jnp.where(keep, h / 0.9, 0)
        q = h.reshape(2, 4, 2, 8)
        a = jax.nn.dot_product_attention(q, q, q, is_causal=True)
        return a.sum() + (gates * experts).sum()

    x, r, w = np.zeros((8, 16), np.float32), np.zeros((16, 4), np.float32), np.zeros((16, 16))
    out["jax idioms (exact GELU, top_k router, rbg dropout, attention)"] = [
        jax.jit(jax.grad(idioms)).lower(x, r, w.astype(np.float32)).as_text()
    ]
    out["jax MoE token exchange (shard_map ragged_all_to_all, fft mixing)"] = [_moe_exchange()]
    return out


def _moe_exchange() -> str:
    """Tokens routed to experts on 2 devices as MaxText's MoE does it (group sizes from the
    router, `ragged_all_to_all` both ways), with FNet-style Fourier token mixing first."""
    from functools import partial

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:2]), ("expert",))

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=(P("expert"), P("expert")), out_specs=P("expert"))
    def exchange(tokens, sizes):
        mixed = jnp.fft.fft2(tokens).real
        offsets = jnp.cumsum(sizes) - sizes
        recv = jax.lax.all_to_all(sizes, "expert", 0, 0, tiled=True)
        out_offsets = jax.lax.all_to_all(offsets, "expert", 0, 0, tiled=True)
        buf = jnp.zeros_like(mixed)
        routed = jax.lax.ragged_all_to_all(
            mixed, buf, offsets, sizes, out_offsets, recv, axis_name="expert"
        )
        return jax.lax.ragged_all_to_all(
            routed * 2, buf, out_offsets, recv, offsets, sizes, axis_name="expert"
        )

    return exchange.lower(np.zeros((8, 4), np.float32), np.zeros(4, np.int32)).as_text()


def _hf_style_step():
    import torch
    import torch.nn as nn
    import tv_ir.frontends.torch_xla as tvx

    class Tiny(nn.Module):
        def __init__(self, vocab=32, d=16):
            super().__init__()
            self.emb, self.ln, self.ln_f = nn.Embedding(vocab, d), nn.LayerNorm(d), nn.LayerNorm(d)
            self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.act, self.drop = nn.GELU(), nn.Dropout(0.1)
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.emb.weight  # tied

        def forward(self, ids):
            h = self.emb(ids)
            h = h + self.drop(self.down(self.act(self.up(self.ln(h)))))
            return self.head(self.ln_f(h))

    def loss(model, ids):
        logits = model(ids)
        return nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), ids.view(-1))

    step = tvx.TrainStep(Tiny().train(), loss, lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    return tvx.export(step, torch.randint(0, 32, (2, 8)))


def _torch_programs() -> dict[str, list[str]]:
    sys.path.insert(0, str(ROOT / "examples" / "torch_xla"))
    import tv_ir.frontends.torch_xla  # noqa: F401, I001  (configures torch_xla first)
    import gpt_block
    import train_dp_fsdp

    def both(e):
        return [e.impl.text] + ([e.spec.text] if e.spec is not None else [])

    return {
        "torch_xla gpt_block (Megatron)": both(gpt_block.export()),
        "torch_xla MLP DP+FSDP AdamW step": both(train_dp_fsdp.export()),
        "torch_xla HF-style model (LayerNorm, exact GELU, dropout, tied embeddings) + AdamW": [
            _hf_style_step().impl.text
        ],
        **_transformers_programs(),
    }


def _transformers_programs() -> dict[str, list[str]]:
    """transformers' own GPT-2 and Llama training steps (examples/torch_xla/hf_*.py), when
    transformers is installed (the `hf` extra)."""
    try:
        import hf_gpt2
        import hf_llama
    except ImportError:
        return {}
    return {
        "torch_xla transformers GPT2LMHeadModel AdamW step (Megatron + FSDP)": [
            hf_gpt2.export_step("adamw", fsdp=True).impl.text
        ],
        "torch_xla transformers LlamaForCausalLM AdamW step (Megatron + FSDP)": [
            hf_llama.export_step("adamw", fsdp=True).impl.text
        ],
    }


def worker(group: str) -> None:
    programs = _jax_programs() if group == "jax" else _torch_programs()
    counts = {
        name: dict(sum((count_ops(t) for t in texts), Counter()))
        for name, texts in programs.items()
    }
    print("CENSUS " + json.dumps(counts), flush=True)


def run_group(group: str) -> dict:
    p = subprocess.run(
        [sys.executable, __file__, "--worker", group], capture_output=True, text=True, cwd=ROOT
    )
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("CENSUS ")]
    if not lines:
        raise SystemExit(f"census of {group} failed:\n{p.stderr[-3000:]}")
    return json.loads(lines[-1][len("CENSUS ") :])


def known_custom_calls() -> set[str]:
    from tv_ir.ir.importer import MHLO_CUSTOM_CALLS
    from tv_ir.semantics.interpreters.spmd import _GSPMD

    return {"Sharding", "mhlo.sharding", *_GSPMD, *MHLO_CUSTOM_CALLS}


# ops the importer and the interpreters handle structurally (not op-table entries)
STRUCTURAL = {"func.func", "func.return", "stablehlo.return", "sdy.mesh", "sdy.return"}


def supported(name: str, ops: set[str]) -> bool:
    if name.startswith("stablehlo.custom_call @"):
        return name.split("@", 1)[1] in known_custom_calls()
    return name in ops or name in STRUCTURAL or name == "sdy.manual_computation"


def census_table(counts: dict) -> str:
    ops = registered()
    total: Counter = Counter()
    for c in counts.values():
        total.update(c)
    lines = ["| program | ops (distinct) | unsupported |", "|---|---|---|"]
    for name, c in counts.items():
        bad = sorted(o for o in c if not supported(o, ops))
        lines.append(
            f"| {name} | {sum(c.values())} ({len(c)}) | {', '.join(f'`{o}`' for o in bad) or '-'} |"
        )
    lines += ["", "| op | count | supported |", "|---|---|---|"]
    for name, n in sorted(total.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"| `{name}` | {n} | {'yes' if supported(name, ops) else '**no**'} |")
    return "\n".join(lines)


def replace_between(text: str, begin: str, end: str, body: str) -> str:
    a, b = text.index(begin) + len(begin), text.index(end)
    return text[:a] + "\n" + body + "\n" + text[b:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", action="store_true", help="only the spec table (no lowering)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if a.worker:
        worker(a.worker)
        return
    doc = replace_between(DOC.read_text(), SPEC_BEGIN, SPEC_END, spec_table())
    if not a.spec:
        counts = run_group("jax") | run_group("torch")
        doc = replace_between(doc, CENSUS_BEGIN, CENSUS_END, census_table(counts))
        print(census_table(counts))
    DOC.write_text(doc)
    print(spec_table().splitlines()[0])


if __name__ == "__main__":
    main()
