"""`--memory-limit MB` / `memory_limit=`: over budget the verdict is `unknown`, and a proof
stopped midway by its memory or time limit names the implementation op being proved (with
its line) and the spec candidate it was being compared with."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from tv_ir.frontends.jax import verify

import tv_ir
from tv_ir import limits
from tv_ir.errors import BadInput
from tv_ir.prover import engine

F32 = jnp.float32
X = jax.ShapeDtypeStruct((4, 8), F32)
W1 = jax.ShapeDtypeStruct((8, 16), F32)
W2 = jax.ShapeDtypeStruct((16, 8), F32)
MESH = Mesh(np.array(jax.devices()[:4]), ("model",))


def mlp(x, w1, w2):
    return jnp.tanh(x @ w1) @ w2


def tp_body(x, w1, w2):
    h = jnp.tanh(x @ w1)  # LINE: hidden
    return jax.lax.psum(h @ w2, "model")


tp_mlp = jax.shard_map(
    tp_body, mesh=MESH, in_specs=(P(), P(None, "model"), P("model", None)), out_specs=P()
)


def hidden_line() -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, ln in enumerate(lines, 1) if ln.endswith("# LINE: hidden"))


def stop_at_call(monkeypatch, n: int, stop) -> None:
    """Call `stop(prover)` before the n-th stage/output obligation is decided (stages
    mirroring a spec op, which decide none, off: the hidden line's are)."""
    monkeypatch.setattr(engine, "mirrored_cut", lambda *args: None)
    original = engine.StageProver._prove_pairs
    calls = [0]

    def counting(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            stop(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(engine.StageProver, "_prove_pairs", counting)


def test_generous_budget_proves():
    r = verify(tp_mlp, X, W1, W2, spec=mlp, memory_limit=100_000)
    assert r.verdict == "equivalent", r.reason


def test_over_budget_midway_names_impl_op_and_spec_candidate(monkeypatch):
    monkeypatch.setattr(limits, "MEMORY_POLL_SECONDS", 0.0)
    over = [False]
    real_rss = limits.rss_mb
    monkeypatch.setattr(limits, "rss_mb", lambda: 1e9 if over[0] else real_rss())
    stop_at_call(monkeypatch, 2, lambda prover: over.__setitem__(0, True))
    r = verify(tp_mlp, X, W1, W2, spec=mlp, memory_limit=50_000)
    assert r.verdict == "unknown", str(r)
    assert r.reason.startswith("memory limit of 50000 MB reached"), r.reason
    assert "while proving impl stablehlo." in r.reason, r.reason
    assert f"{Path(__file__).name}:{hidden_line()}" in r.reason, r.reason
    assert "equal to spec candidate stablehlo." in r.reason, r.reason
    assert "test_memory_limit.py:" in r.reason.split("spec candidate", 1)[1], r.reason


def test_time_limit_midway_names_impl_op_and_spec_candidate(monkeypatch):
    def out_of_time(prover):
        prover.deadline = 0.0  # long past

    stop_at_call(monkeypatch, 2, out_of_time)
    r = verify(tp_mlp, X, W1, W2, spec=mlp, time_limit=600)
    assert r.verdict == "unknown", str(r)
    assert r.reason.startswith("time limit of 600 s reached"), r.reason
    assert "stages proved by then; while proving impl stablehlo." in r.reason, r.reason
    assert f"{Path(__file__).name}:{hidden_line()}" in r.reason, r.reason
    assert "equal to spec candidate stablehlo." in r.reason, r.reason


def test_output_obligation_named(monkeypatch):
    """Stopped at the last obligation (an output): the reason says which output."""

    def count(monkeypatch):
        monkeypatch.setattr(engine, "mirrored_cut", lambda *args: None)  # as stop_at_call
        calls = [0]
        original = engine.StageProver._prove_pairs

        def counting(self, *a, **k):
            calls[0] += 1
            return original(self, *a, **k)

        monkeypatch.setattr(engine.StageProver, "_prove_pairs", counting)
        return calls

    with pytest.MonkeyPatch.context() as m:
        calls = count(m)
        assert verify(tp_mlp, X, W1, W2, spec=mlp).verdict == "equivalent"
    total = calls[0]
    stop_at_call(monkeypatch, total, lambda prover: setattr(prover, "deadline", 0.0))
    r = verify(tp_mlp, X, W1, W2, spec=mlp, time_limit=600)
    assert r.verdict == "unknown", str(r)
    assert "while proving output 0: impl " in r.reason, r.reason


def test_the_budget_is_what_the_check_adds_to_the_process():
    # this process already holds more than the budget (jax, XLA, the tests before): the
    # check still gets its 200 MB (a whole-process bound would stop it at once)
    assert limits.rss_mb() > 200
    text = jax.jit(mlp).lower(X, W1, W2).as_text()
    r = tv_ir.check(text, text, memory_limit=200)
    assert r.verdict == "equivalent", str(r)


def test_over_the_budget_the_reason_says_what_the_run_used(monkeypatch):
    real_rss = limits.rss_mb
    grown = [0.0]

    def rss() -> float:  # the run grows the process by 50 MB per poll
        grown[0] += 50
        return real_rss() + grown[0]

    monkeypatch.setattr(limits, "rss_mb", rss)
    monkeypatch.setattr(limits, "MEMORY_POLL_SECONDS", 0.0)
    text = jax.jit(mlp).lower(X, W1, W2).as_text()
    r = tv_ir.check(text, text, memory_limit=120)
    assert r.verdict == "unknown", str(r)
    assert r.reason.startswith("memory limit of 120 MB reached ("), r.reason
    assert "MB used by this run)" in r.reason, r.reason


def test_bad_budget_is_bad_input():
    text = jax.jit(mlp).lower(X, W1, W2).as_text()
    with pytest.raises(BadInput):
        tv_ir.check(text, text, memory_limit=0)


def test_unknown_option_still_refused():
    with pytest.raises(BadInput):
        verify(tp_mlp, X, W1, W2, spec=mlp, memory_limits=1)


def test_cli_memory_limit(tmp_path: Path):
    f = tmp_path / "mlp.mlir"
    f.write_text(jax.jit(mlp).lower(X, W1, W2).as_text())
    run = subprocess.run(
        [sys.executable, "-m", "tv_ir.cli", "check", str(f), str(f), "--json"]
        + ["--memory-limit", "1"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2, run.stderr
    out = json.loads(run.stdout)
    assert out["verdict"] == "unknown" and "memory limit of 1 MB" in out["reason"]
    ok = subprocess.run(
        [sys.executable, "-m", "tv_ir.cli", "check", str(f), str(f), "--memory-limit", "100000"],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_address_space_cap_would_break_jax():
    """Why the budget is polled rather than set with RLIMIT_AS: with an address-space cap
    well above what the process uses, tv's deep-stack thread cannot even start."""
    code = (
        "import resource, jax, jax.numpy as jnp\n"
        "jax.jit(lambda a: a @ a)(jnp.ones((8, 8))).block_until_ready()\n"
        "used = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
        "resource.setrlimit(resource.RLIMIT_AS, (used + 2**29, resource.RLIM_INFINITY))\n"
        "import tv_ir\n"
        "t = jax.jit(lambda a: a * 2).lower(jnp.ones(3)).as_text()\n"
        "print(tv_ir.check(t, t).verdict)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode != 0 or "equivalent" not in run.stdout, run.stdout


def test_simulation_that_cannot_fit_is_unknown_before_it_starts():
    """A pair whose values at the sizes checked need more than the limit is refused up
    front: one numpy allocation of gigabytes runs past the polled limit (a 405B-shaped step
    with its hidden size kept was killed by the OS at 24 GB)."""
    big = "tensor<16384x16384xf32>"
    spec = f"""func.func @main(%x: {big}) -> {big} {{
  %0 = stablehlo.add %x, %x : {big}
  return %0 : {big}
}}"""
    impl = spec.replace("stablehlo.add %x, %x", "stablehlo.multiply %x, %x")
    limit = 1000  # MB the check may add, far below the ~17 GB needed
    r = tv_ir.check(spec, impl, memory_limit=limit, reduce_shapes=False)
    assert r.verdict == "unknown"
    assert "simulating the programs at their real sizes would take about" in r.reason
    assert "GB, more than the memory limit of" in r.reason
