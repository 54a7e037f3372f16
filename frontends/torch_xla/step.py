"""`TrainStep`: a model, a loss and an optimizer captured as one training-step program."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class TrainStep:
    """One optimizer step: `loss = loss_fn(model, *args)`, `loss.backward()`, `opt.step()`.

    `optimizer` builds the optimizer from the parameters, e.g.
    `lambda ps: torch.optim.AdamW(ps, lr=1e-3)`. The captured program maps the parameters,
    the optimizer state and the arguments to the loss, the updated parameters and the
    updated optimizer state. `warmup` steps run (and are materialised) before the captured
    one, so that optimizer state (AdamW moments) is an input rather than zeros.
    """

    def __init__(
        self,
        model: Any,
        loss_fn: Callable[..., Any],
        optimizer: Callable[[Any], Any],
        warmup: int = 0,
    ):
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.warmup = warmup

    def __repr__(self) -> str:
        return f"TrainStep({type(self.model).__name__}, {_name(self.loss_fn)})"


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
