"""torch_xla programs through the ops torch_xla emits for everyday layers: `nn.LayerNorm`
(stablehlo.batch_norm_training, and batch_norm_grad in its backward), exact GELU
(custom_call @mhlo.erf), dropout (rng_bit_generator), tied embeddings."""

from __future__ import annotations

import os

import pytest

# the front end first: it sets torch_xla's environment before import
import tv_ir.frontends.torch_xla as tvx  # noqa: I001

if not os.environ.get("CI"):
    pytest.importorskip("torch_xla")
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import tv_ir  # noqa: E402
from tv_ir.ir.program import walk  # noqa: E402
from tv_ir.semantics.ops.registry import OPS  # noqa: E402


class Tiny(nn.Module):
    """An HF-style decoder layer: tied embeddings, pre-norm MLP with exact GELU, dropout."""

    def __init__(self, vocab: int = 32, d: int = 16):
        super().__init__()
        self.emb, self.ln, self.ln_f = nn.Embedding(vocab, d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.act, self.drop = nn.GELU(), nn.Dropout(0.1)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        h = self.emb(ids)
        h = h + self.drop(self.down(self.act(self.up(self.ln(h)))))
        return self.head(self.ln_f(h))


def _loss(model, ids):
    logits = model(ids)
    return nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), ids.view(-1))


def test_training_step_emits_the_ops_tv_now_has():
    torch.manual_seed(0)
    step = tvx.TrainStep(Tiny().train(), _loss, lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    text = tvx.export(step, torch.randint(0, 32, (2, 8))).impl.text
    for op in ("batch_norm_training", "batch_norm_grad", "rng_bit_generator", "@mhlo.erf"):
        assert op in text, op
    module = tv_ir.load(text)  # every op has semantics: nothing would be unsupported
    names = {op.name for f in module.functions.values() for op in walk(f.body)}
    assert names <= set(OPS) | {"stablehlo.custom_call", "func.return"}, names


def test_forward_with_dropout_proved_and_another_epsilon_refuted():
    torch.manual_seed(0)
    ids = torch.randint(0, 32, (2, 8))
    text = tvx.export(Tiny().train(), ids).impl.text
    assert tv_ir.check(text, text, time_limit=120).verdict == "equivalent"
    wrong = text.replace("epsilon = 9.99999974E-6", "epsilon = 1.000000e-03", 1)
    assert wrong != text
    assert tv_ir.check(text, wrong, time_limit=120).verdict == "not_equivalent"
