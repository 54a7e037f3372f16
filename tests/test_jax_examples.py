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


def test_adamw_fsdp_tp_on_2x4_proved():
    import llama_adamw_fsdp_tp as ex

    report = ex.verify_example()
    assert report.verdict == "equivalent", report.reason
    assert "8 devices" in report.impl_name


# attention heads over "model": XLA reshards them with all_to_all over mesh-axes groups
def test_adamw_fsdp_tp_attention_heads_proved():
    import llama_adamw_fsdp_tp as ex

    report = ex.verify_example(attention_tp=True)
    assert report.verdict == "equivalent", str(report)
