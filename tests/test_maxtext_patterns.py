"""Patterns of MaxText's training step (issue #13), written as a user would in plain JAX, so
the suite covers them without MaxText installed (examples/maxtext_train_step.py runs the real
step in its own environment, docs/jax.md "MaxText")."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from tv_ir.frontends.jax import verify

from tv_ir.report import EQUIVALENT

F32 = jnp.float32
MASK = -0.7 * float(np.finfo(np.float32).max)  # MaxText's DEFAULT_MASK_VALUE


def test_guard_inputs_that_overflow_floats_are_no_counterexample():
    """Simulation draws guard inputs from the constants a program compares against; for
    MaxText that is its attention mask value (-0.7 * finfo(float32).max). Such an input
    overflows float64 a few multiplications later, and the two programs then differ by where
    the overflow happens, not over the reals: MaxText's step was refuted that way. Equal
    over the reals, the pair below differs in float64 only where x**16 overflows."""

    def masked(x):
        return jnp.where(x > MASK, x, 1.0)

    def spec(*xs):
        return sum(jnp.sum(masked(x) ** 8 * masked(x) ** 8 - masked(x) ** 16) for x in xs)

    def impl(*xs):
        return sum(jnp.sum(masked(x) - masked(x)) for x in xs)

    v = jax.ShapeDtypeStruct((4, 4), F32)
    report = verify(impl, v, v, v, v, spec=spec)
    assert report.verdict == EQUIVALENT, report
