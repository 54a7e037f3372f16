"""A concrete comparison of the two programs on random inputs (the checks beside a proof, the
confirmation at larger sizes, the run at the real layer count) first runs them keeping their
outputs alone: the devices' values stay batched and nothing is traced. Only when outputs
differ are they run again with every value kept, to tell whether a run overflowed (then no
difference counts) and where they part ways (tv_ir.prover.localise.outputs_agree). A
replayed counterexample, which most likely differs, is traced at once."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import tv_ir.prover.localise as localise
from tv_ir.pipeline import prepare
from tv_ir.prover.placement import Placement


def _pair(spec, impl, *args):
    s = prepare(jax.jit(spec).lower(*args).as_text(), "spec")
    i = prepare(jax.jit(impl).lower(*args).as_text(), "impl")
    return s, i, Placement.single_device(s.main)


def _softmax(x):
    e = jnp.exp(x.astype(jnp.float32))
    return e / e.sum()


def _stable_softmax(x):
    f = x.astype(jnp.float32)
    e = jnp.exp(f - f.max())
    return e / e.sum()


def _traced_runs(monkeypatch) -> list[bool]:
    """Whether each spec run kept its values."""
    kept: list[bool] = []
    real = localise.run_traced

    def counted(module, inputs, values=True):
        kept.append(values)
        return real(module, inputs, values)

    monkeypatch.setattr(localise, "run_traced", counted)
    return kept


def test_agreeing_outputs_are_not_traced(monkeypatch) -> None:
    x = np.arange(4, dtype=np.int32)
    spec, impl, place = _pair(_softmax, _stable_softmax, x)
    kept = _traced_runs(monkeypatch)
    assert not localise.differs(spec, impl, place, [x])
    assert localise.refutation(spec, impl, place, [x], outputs_first=True) is None
    assert kept == [False, False]  # the outputs agreed: no run kept its values


def test_outputs_that_differ_by_an_overflow_alone_are_no_difference(monkeypatch) -> None:
    """exp of the largest int32 is infinite in float64: the spec's output is NaN, the stable
    softmax's a number. Over the reals they agree, so this input shows no difference; telling
    so needs the values the untraced runs do not keep."""
    x = np.array([2**31 - 1, 0, 1, 2], dtype=np.int32)
    spec, impl, place = _pair(_softmax, _stable_softmax, x)
    kept = _traced_runs(monkeypatch)
    assert not localise.outputs_agree(spec, impl, place, [x])
    assert not localise.differs(spec, impl, place, [x])
    assert localise.refutation(spec, impl, place, [x], outputs_first=True) is None
    assert kept == [False, False, True, False, True]


def test_a_difference_is_found_and_located(monkeypatch) -> None:
    x = np.arange(4, dtype=np.int32)
    spec, impl, place = _pair(_softmax, lambda x: _softmax(x) * 2, x)
    assert localise.differs(spec, impl, place, [x])
    kept = _traced_runs(monkeypatch)
    found = localise.refutation(spec, impl, place, [x])
    assert found is not None and found[1] is not None  # a counterexample, located
    assert kept[0] is True  # a replay is traced at once, not run twice
    kept.clear()
    assert localise.differs(spec, impl, place, [x], outputs_first=False)
    assert kept == [True]
