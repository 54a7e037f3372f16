"""The examples in examples/jax/: each correct training step is proved through
`assert_equivalent`, each planted bug is refuted with the location of its `# BUG` line."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tv_ir.frontends.jax import NotEquivalentError, assert_equivalent

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "jax"
sys.path.insert(0, str(EXAMPLES))

# example module -> (function building the implementation, its arguments' source)
SHARD_MAP_STEPS = {
    "llama_dp": "dp_step",
    "llama_fsdp": "fsdp_step",
    "llama_tp_sp": "tp_sp_step",
}


def bug_line(module) -> int:
    lines = Path(module.__file__).read_text().splitlines()
    hits = [i for i, ln in enumerate(lines, 1) if re.search(r"# BUG\b", ln)]
    assert len(hits) == 1, f"{module.__file__}: expected one # BUG marker"
    return hits[0]


def step_and_args(name: str, bug: bool):
    example = importlib.import_module(name)
    llama = importlib.import_module("llama")
    step = getattr(example, SHARD_MAP_STEPS[name])(bug)
    return example, step, (llama.param_shapes(), llama.batch_shapes()), llama.train_step


@pytest.mark.parametrize("name", list(SHARD_MAP_STEPS))
def test_correct_step_proved(name):
    _, step, args, spec = step_and_args(name, bug=False)
    report = assert_equivalent(step, *args, spec=spec)
    assert report.stats.stages > 50


@pytest.mark.parametrize("name", list(SHARD_MAP_STEPS))
def test_planted_bug_refuted_at_its_line(name):
    example, step, args, spec = step_and_args(name, bug=True)
    with pytest.raises(NotEquivalentError) as err:
        assert_equivalent(step, *args, spec=spec)
    report = err.value.report
    assert report.counterexample is not None
    assert report.location.file == example.__file__
    assert report.location.line == bug_line(example), str(report.location.impl)
    assert f"{Path(example.__file__).name}:{bug_line(example)}" in str(err.value)


def test_script_prints_the_report():
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "llama_dp.py")], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("EQUIVALENT")


# AdamW's bias corrections divide by 1 - b1**t and 1 - b2**t, both zero at step count -1
# (an int32 input): `1 - b**t == 0` is `t == 0` for a constant base b > 0, b != 1, so the
# two guards are one condition (terms._power_equals); they were unrelated opaque atoms.
def test_adamw_fsdp_tp_on_2x4_proved():
    import llama_adamw_fsdp_tp as ex

    report = ex.verify_example(time_limit=300)
    assert report.verdict == "equivalent", report.reason
    assert "8 devices" in report.impl_name


# attention heads over "model": XLA reshards them with all_to_all over mesh-axes groups.
# Some devices hold 2-element tiles of AdamW's update that were NaN in both random runs
# (`sqrt(nu)` of a negative random moment) and matched the wrong spec values; one run with
# the moments non-negative (tv_ir.prover.simulate.with_non_negative_roots) tells them apart
def test_adamw_fsdp_tp_attention_heads_proved():
    import llama_adamw_fsdp_tp as ex

    report = ex.verify_example(attention_tp=True, time_limit=300)
    assert report.verdict == "equivalent", str(report)


def test_adamw_fsdp_tp_is_never_refuted():
    """Whatever the verdict, the correct step is never refuted."""
    import llama_adamw_fsdp_tp as ex

    report = ex.verify_example(time_limit=30)
    assert report.verdict in ("equivalent", "unknown"), str(report)


# examples verified through their own verify_example(bug=...)
VERIFY_EXAMPLES = ["llama_moe_ep", "llama_tokens"]
BUG_EXAMPLES = ["llama_moe_ep", "llama_tokens", "llama_pipeline", "llama_pipeline_jit"]


@pytest.mark.parametrize("name", VERIFY_EXAMPLES)
def test_example_proved(name):
    report = importlib.import_module(name).verify_example()
    assert report.verdict == "equivalent", str(report)
    assert report.stats.stages > 50


@pytest.mark.parametrize("name", BUG_EXAMPLES)
def test_example_bug_refuted_at_its_line(name):
    example = importlib.import_module(name)
    report = example.verify_example(bug=True)
    assert report.verdict == "not_equivalent", str(report)
    assert report.counterexample is not None
    assert report.location.file == example.__file__
    assert report.location.line == bug_line(example), str(report.location.impl)


# In a pipeline, device s at tick t holds layer s's activation of micro-batch t - s: a
# different spec value on each device; tv cuts each device at its own spec value
def test_pipeline_proved():
    import llama_pipeline

    report = llama_pipeline.verify_example()
    assert report.verdict == "equivalent", str(report)


# The same pipeline under jit with shardings (GSPMD pipelining: stacked layers over "stage",
# a state buffer shifted with jnp.roll). Each device's values are the vmapped layer's on a
# [1, ...] slice of the buffer, which the spec's values lack: matched up to unit dimensions
# (before, no value was cut and the terms grew past any memory). Its loss adds each
# micro-batch's mean over 8 tokens divided by 2, the micro-batch count: 8 x 2 was read as
# the vocabulary (8) times a micro-batch's rows, and the shrunk vocabulary made the reduced
# pair differ (checked again at real sizes). The chain is ambiguous now: nothing guessed
# (at this config every width is 8, so those classes keep their sizes).
def test_pipeline_under_jit_proved():
    import llama_pipeline_jit

    report = llama_pipeline_jit.verify_example(time_limit=120, memory_limit=2000)
    assert report.verdict == "equivalent", str(report)
    assert not any("did not carry over" in n for n in report.notes), report.notes


# The embedding gradient under data parallelism: a psum of per-device scatter-adds against
# one scatter-add over the batch, equal normal forms (a scatter-add is a sum of one term per
# update; before, Z3 timed out on nested selects)
def test_tokens_data_parallel_proved():
    import llama_tokens

    report = llama_tokens.verify_example(dp=True, timeout=5)
    assert report.verdict == "equivalent", str(report)


# lax.scan over the decoder's layers: the loop is unrolled before proving (passes/unroll.py),
# so each layer's values are cut-points (before that, one layer ran out of memory)
def test_scan_decoder_proved():
    import llama_scan

    report = llama_scan.verify_example(layers=2)
    assert report.verdict == "equivalent", str(report)


def test_scan_decoder_bug_named_at_the_scan():
    import inspect

    import llama_scan

    report = llama_scan.verify_example(bug=True, layers=1)
    assert report.verdict == "not_equivalent", str(report)
    # the loop's body holds no cut-point: tv names the scan, or the op reading its result
    lines, first = inspect.getsourcelines(llama_scan.scan_forward)
    assert report.location.file == llama_scan.__file__
    assert first <= report.location.line < first + len(lines), str(report.location.impl)


def test_only_what_reaches_a_root_is_non_negative_in_one_run() -> None:
    """AdamW's second moment reaches `sqrt` through a scaling and a sum; an activation
    reaches RMSNorm's `rsqrt` only through its square, and a weight not at all: one run
    makes the moment non-negative and leaves the others' signs alone."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from tv_ir.ir.importer import load
    from tv_ir.prover import simulate

    def step(nu, g, x, w):
        update = g / (jnp.sqrt(0.99 * nu + 0.01 * g * g) + 1e-8)
        normed = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-5)
        return update, normed @ w

    v = jax.ShapeDtypeStruct((4, 4), jnp.float32)
    fn = load(jax.jit(step).lower(v, v, v, v).as_text()).main
    assert simulate.under_roots(fn) == [0]
    inputs = [-np.ones((4, 4)) for _ in range(4)]
    out = simulate.with_non_negative_roots(fn, inputs)
    assert (out[0] == 1).all() and all((a == -1).all() for a in out[1:])
