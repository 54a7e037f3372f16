"""`--workers N`: one check's independent obligations in forked processes give the report
one worker gives (tv_ir.prover.workers; docs/benchmarks.md, "Workers")."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tv_command import tv as run_tv

import tv_ir
from tv_ir.errors import BadInput, Unsupported
from tv_ir.limits import OutOfMemoryBudget, OutOfTime, deadline, memory_budget
from tv_ir.prover import machine_load, workers
from tv_ir.prover.simulate import run_traced

X = np.ones((4, 8), np.float32)
W = np.ones((8, 8), np.float32)
POOL = "final obligations in workers"  # stats.seconds: time the pool took (timings only)


def lower(f, *args) -> str:
    return jax.jit(f).lower(*(args or (X, W))).as_text(debug_info=True)


def spec3(x, w):
    return x @ w, jnp.tanh(x) * 2.0, jnp.sum(jnp.maximum(x, 0.0))


def impl3(x, w):  # every output needs more than a normal form: max against select
    return (
        jnp.einsum("ij,jk->ik", x, w),
        jnp.tanh(x) + jnp.tanh(x),
        jnp.sum(jnp.where(x > 0, x, 0.0)),
    )


def impl3_bug(x, w):  # output 1 differs only at x == 0.75 (no guard input holds it): the
    # solver's model finds it
    return (
        x @ w,
        jnp.where(x * 4.0 == 3.0, 7.0, jnp.tanh(x) * 2.0),
        jnp.sum(jnp.maximum(x, 0.0)),
    )


def same_report(a: tv_ir.Report, b: tv_ir.Report) -> None:
    """Equal text and JSON, timings aside."""
    da, db = json.loads(a.to_json()), json.loads(b.to_json())
    da["stats"].pop("seconds")
    db["stats"].pop("seconds")
    assert da == db
    assert _untimed(str(a)) == _untimed(str(b))


def _untimed(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if " s" not in ln and "seconds" not in ln]


def test_equal_pair_same_report_with_one_and_two_workers() -> None:
    one = tv_ir.check(lower(spec3), lower(impl3), workers=1)
    two = tv_ir.check(lower(spec3), lower(impl3), workers=2)
    assert one.verdict == two.verdict == "equivalent", two.reason
    assert POOL not in one.stats.seconds
    assert POOL in two.stats.seconds  # the outputs' obligations were decided by workers
    assert two.stats.proved_by_z3 >= 1  # counters come back from the children
    same_report(one, two)


def test_solver_refutation_same_counterexample_and_line_with_two_workers() -> None:
    spec, impl = lower(spec3), lower(impl3_bug)
    one = tv_ir.check(spec, impl, workers=1)
    two = tv_ir.check(spec, impl, workers=2)
    assert one.verdict == two.verdict == "not_equivalent"
    assert POOL in two.stats.seconds
    same_report(one, two)
    assert two.location.impl.line == one.location.impl.line is not None
    ce = two.counterexample
    assert ce.output == 1 and ce.actual == pytest.approx(7.0)
    s = run_traced(tv_ir.pipeline.prepare(spec, "spec"), list(ce.inputs.values()))
    i = run_traced(tv_ir.pipeline.prepare(impl, "impl"), list(ce.inputs.values()))
    assert not np.allclose(s.outputs[1], i.outputs[1])  # replayed: a real difference


def test_simulation_refutation_same_report_with_two_workers() -> None:
    spec, impl = lower(spec3), lower(lambda x, w: (x @ w, jnp.tanh(x) * 3.0, jnp.sum(x)))
    one = tv_ir.check(spec, impl, workers=1)
    two = tv_ir.check(spec, impl, workers=2)
    assert one.verdict == "not_equivalent"
    same_report(one, two)


def test_env_var_sets_the_default(monkeypatch) -> None:
    monkeypatch.setenv(workers.WORKERS_ENV, "2")
    r = tv_ir.check(lower(spec3), lower(impl3))
    assert r.verdict == "equivalent" and POOL in r.stats.seconds
    monkeypatch.setenv(workers.WORKERS_ENV, "1")
    r = tv_ir.check(lower(spec3), lower(impl3))
    assert r.verdict == "equivalent" and POOL not in r.stats.seconds


def test_automatic_keeps_small_programs_in_one_process(monkeypatch) -> None:
    monkeypatch.delenv(workers.WORKERS_ENV, raising=False)
    r = tv_ir.check(lower(spec3), lower(impl3))
    assert r.verdict == "equivalent" and POOL not in r.stats.seconds


@pytest.mark.parametrize("bad", [0, -2, 1.5, "two", True])
def test_bad_worker_counts_are_bad_input(bad) -> None:
    with pytest.raises(BadInput, match="workers"):
        tv_ir.check(lower(spec3), lower(impl3), workers=bad)


def test_bad_env_var_is_bad_input(monkeypatch) -> None:
    monkeypatch.setenv(workers.WORKERS_ENV, "many")
    with pytest.raises(BadInput, match=workers.WORKERS_ENV):
        tv_ir.check(lower(spec3), lower(impl3))


def test_cli_workers(tmp_path) -> None:
    spec, impl = tmp_path / "spec.mlir", tmp_path / "impl.mlir"
    spec.write_text(lower(spec3))
    impl.write_text(lower(impl3_bug))
    for bad in ("0", "x"):
        r = run_tv("check", str(spec), str(impl), "--workers", bad)
        assert r.returncode == 3 and "--workers" in r.stderr, r.stderr
    r = run_tv("partition", str(spec), "--workers", "-1")
    assert r.returncode == 3 and "--workers must be at least 1" in r.stderr, r.stderr
    outs = []
    for n in ("1", "2"):
        r = run_tv("check", str(spec), str(impl), "--workers", n, "--json")
        assert r.returncode == 1, r.stderr
        d = json.loads(r.stdout)
        d["stats"].pop("seconds")
        outs.append(d)
    assert outs[0] == outs[1]


def test_jax_verify_takes_workers() -> None:
    from tv_ir.frontends.jax import verify

    r = verify(impl3, X, W, spec=spec3, workers=2)
    assert r.verdict == "equivalent" and POOL in r.stats.seconds
    with pytest.raises(BadInput):
        verify(impl3, X, W, spec=spec3, workers=0)


# -- the pool itself --------------------------------------------------------------------


def _square_in_child(i: int) -> tuple[int, int]:
    return i * i, os.getpid()


def test_results_come_back_in_order_from_children() -> None:
    got = workers.run_jobs(_square_in_child, list(range(7)), 2)
    assert [g[0] for g in got] == [i * i for i in range(7)]
    assert {g[1] for g in got} - {os.getpid()}  # computed elsewhere


def test_exceptions_come_back_as_values_with_their_fields() -> None:
    def job(i: int):
        if i == 1:
            raise Unsupported("no semantics", op="stablehlo.foo", loc="f.py:3")
        return i

    got = workers.run_jobs(job, [0, 1, 2], 2)
    assert got[0] == 0 and got[2] == 2
    assert isinstance(got[1], workers.Failed)
    e = got[1].error
    assert isinstance(e, Unsupported) and e.op == "stablehlo.foo" and e.loc == "f.py:3"


def test_an_exception_of_a_class_made_on_the_fly_comes_back_inside_a_result() -> None:
    """The watchdog raises limits' errors as classes made on the fly; a job that catches one
    and returns it in its result (as the final obligations' job does, with its counters)
    gets it back as its nearest importable base, message kept (the child died on the
    pickling before: a 32-device jit step under --memory-limit)."""
    made = type("OutOfMemoryBudget", (OutOfMemoryBudget,), {})

    def job(i: int):
        if i == 1:
            return workers.Failed(made("memory limit of 10 MB reached")), {"stages": 3}
        return i

    got = workers.run_jobs(job, [0, 1, 2], 2)
    assert got[0] == 0 and got[2] == 2
    failed, counters = got[1]
    assert type(failed.error) is OutOfMemoryBudget
    assert str(failed.error) == "memory limit of 10 MB reached"
    assert counters == {"stages": 3}


def test_a_child_that_dies_loses_no_job() -> None:
    parent = os.getpid()

    def job(i: int) -> int:
        if i == 2 and os.getpid() != parent:
            os._exit(9)  # killed mid-job (the OS, say): the parent does it again
        return i + 100

    assert workers.run_jobs(job, list(range(5)), 2) == [100, 101, 102, 103, 104]


def test_deadline_holds_in_children() -> None:
    def spin(i: int) -> int:
        from tv_ir.limits import check_time

        while True:
            check_time()

    t0 = time.perf_counter()
    with deadline(1.0):
        got = workers.run_jobs(spin, [0, 1, 2], 2)
    assert time.perf_counter() - t0 < 1.0 + workers.KILL_GRACE_S
    assert all(isinstance(g, workers.Failed) and isinstance(g.error, OutOfTime) for g in got)


def test_memory_limit_is_split_between_children() -> None:
    def grow(i: int) -> int:
        from tv_ir.limits import check_memory

        keep = []
        for _ in range(400):  # up to 400 MB, checked as it grows
            keep.append(np.ones(2**17))  # 1 MB
            check_memory(force=True)
        return len(keep)

    with memory_budget(300):  # 150 MB each for two children: both go over
        got = workers.run_jobs(grow, [0, 1], 2)
    # what each child gave, when this fails (it has, once in a full run, under load)
    assert all(isinstance(g, workers.Failed) for g in got), [repr(g) for g in got]
    assert all(isinstance(g.error, OutOfMemoryBudget) for g in got), [repr(g) for g in got]


def test_no_pool_inside_a_child_or_for_one_job() -> None:
    assert workers.pool_size(1, worth_it=True) == 1
    got = workers.run_jobs(lambda i: workers.pool_size(5, worth_it=True), [0, 1], 2)
    assert got == [1, 1]


def _deep(x):  # a Python `for` of 40 layers: rerolled into a loop, proved by induction
    for i in range(40):
        x = jnp.tanh(x) * (1.5 + i)
    return x


def _deep_spec(x):
    for i in range(40):
        x = (1.5 + i) * jnp.tanh(x)
    return x


def test_progress_lines_from_children_reach_the_callback_in_order() -> None:
    from tv_ir.frontends.jax import verify

    lines: dict[int, list[str]] = {1: [], 2: []}
    for n in (1, 2):
        r = verify(_deep, X, spec=_deep_spec, progress=lines[n].append, workers=n)
        assert r.verdict == "equivalent", r.reason
        assert r.stats.loops_by_induction == 1
    assert lines[1] and lines[2] == lines[1]


def _stuck_on_output(monkeypatch, output: int, grow: bool = False) -> None:
    """Output `output`'s final obligation never ends (and grows, with `grow`) until a limit
    stops it; the others are decided as usual."""
    from tv_ir.prover import engine

    original = engine.StageProver._decide_final

    def stuck(self, f):
        if f.output != output:
            return original(self, f)
        keep = []
        while True:
            if grow:
                keep.append(np.ones(2**17))  # 1 MB at a time
            self._check_time()  # the time and memory polls

    monkeypatch.setattr(engine.StageProver, "_decide_final", stuck)


def test_time_limit_holds_across_workers_and_names_the_same_obligation(monkeypatch) -> None:
    _stuck_on_output(monkeypatch, 1)
    reasons = {}
    for n in (1, 2):
        t0 = time.perf_counter()
        r = tv_ir.check(lower(spec3), lower(impl3), workers=n, time_limit=4)
        assert time.perf_counter() - t0 < 4 + workers.KILL_GRACE_S
        assert r.verdict == "unknown"
        reasons[n] = r.reason
    assert reasons[2].startswith("time limit of 4 s reached"), reasons[2]
    assert "while proving output 1: impl" in reasons[2], reasons[2]
    assert reasons[1] == reasons[2]


def test_memory_limit_holds_across_workers(monkeypatch) -> None:
    _stuck_on_output(monkeypatch, 2, grow=True)
    r = tv_ir.check(lower(spec3), lower(impl3), workers=2, memory_limit=400, time_limit=120)
    assert r.verdict == "unknown"
    assert r.reason.startswith("memory limit of 400 MB reached"), r.reason
    assert "while proving output 2: impl" in r.reason, r.reason


def test_pytest_option_sets_the_workers_of_every_check(tmp_path) -> None:
    import subprocess
    import sys

    test = tmp_path / "test_env.py"
    test.write_text("import os\n\ndef test_it():\n    assert os.environ['TV_WORKERS'] == '2'\n")
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)]
    ok = subprocess.run([*run, "--tv-workers", "2"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run([*run, "--tv-workers", "0"], capture_output=True, text=True)
    assert bad.returncode == 4 and "--tv-workers must be at least 1" in bad.stderr, bad.stderr


def test_automatic_pool_uses_idle_cores_after_a_second(monkeypatch) -> None:
    monkeypatch.delenv(workers.WORKERS_ENV, raising=False)
    monkeypatch.setattr(workers, "cores", lambda: 2)
    monkeypatch.setattr(machine_load, "_window", None)  # no window: the load average
    monkeypatch.setattr(os, "getloadavg", lambda: (6.0, 6.0, 6.0))
    assert workers.idle_cores() == 1  # a busy machine: no pool
    monkeypatch.setattr(os, "getloadavg", lambda: (1.0, 1.0, 1.0))  # this process alone
    assert workers.idle_cores() == 2
    parent = os.getpid()

    def job(i: int) -> bool:
        time.sleep(0.3)
        return os.getpid() == parent

    monkeypatch.setattr(workers, "PARALLEL_AFTER_S", 0.5)
    timing: dict = {}
    here = list(workers.decided(job, list(range(5)), timing))
    assert here[:2] == [True, True] and not any(here[2:]) and "pool" in timing
    assert workers.run_jobs(job, [0, 1], 1) == [True, True]  # one worker: no pool


def test_a_core_is_free_by_the_load_since_the_check_began(monkeypatch) -> None:
    # the load average remembers the last minute: a benchmark's previous row (XLA's compile
    # of the last program, on both cores) kept the checks beside the proof in the process
    monkeypatch.delenv(workers.WORKERS_ENV, raising=False)
    monkeypatch.setattr(workers, "cores", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (2.5, 2.5, 2.5))  # a minute of other work
    clock = {"wall": 100.0, "own": 10.0, "busy": 1000.0}
    monkeypatch.setattr(machine_load.time, "perf_counter", lambda: clock["wall"])
    monkeypatch.setattr(machine_load.time, "process_time", lambda: clock["own"])
    monkeypatch.setattr(machine_load, "_cores_busy_s", lambda: clock["busy"])
    machine_load.start_window()
    assert machine_load.busy_elsewhere() is None  # too short to tell: the load average
    assert not workers._core_free()
    # 2 s on: this process used 2 CPU s, its cores 2.2 s: others kept 0.1 of a core busy
    clock.update(wall=102.0, own=12.0, busy=1002.2)
    assert machine_load.busy_elsewhere() == pytest.approx(0.1)
    assert workers._core_free() and workers.idle_cores() == 2
    clock.update(wall=104.0, own=14.0, busy=1005.8)
    assert machine_load.busy_elsewhere() == pytest.approx(0.45)
    assert workers._core_free()
    # others kept a whole core busy since the check began: no core for a child
    clock.update(busy=1008.2)
    assert machine_load.busy_elsewhere() == pytest.approx(1.05)
    assert not workers._core_free() and workers.idle_cores() == 1


def test_cpu_time_of_this_process_cores_is_read() -> None:
    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat")
    before = machine_load._cores_busy_s()
    t0 = time.process_time()
    while time.process_time() - t0 < 0.3:
        pass
    assert before is not None and machine_load._cores_busy_s() - before >= 0.2


def _scan(bug: bool):
    def f(x, w):
        def layer(carry, w_layer):
            h, i = carry
            y = jnp.sin(h @ w_layer) * 0.9 + 0.1
            if bug:
                y = jnp.where(i == 17, 0.5 * y, y)  # LINE: bug
            return (y, i + 1), None

        return jax.lax.scan(layer, (x, 0), w)[0][0]

    return f


_scan_spec, _scan_bug = _scan(False), _scan(True)
WS = np.ones((40, 8, 8), np.float32)  # 40 stacked layers


@pytest.mark.parametrize("impl", [_scan_spec, _scan_bug], ids=["equal", "layer17"])
def test_induction_obligations_in_workers_same_report(monkeypatch, impl) -> None:
    """Loops proved by induction: the rest and the body run in two workers; a body refuted
    stops the proof there (the others are stopped), and the report, the refutation and its
    line included, is the one a single worker writes."""
    from tv_ir.frontends.jax import verify

    pools = []
    in_order = workers.in_order

    def recording(job, jobs, n):
        pools.append((len(jobs), n))
        return in_order(job, jobs, n)

    monkeypatch.setattr(workers, "in_order", recording)
    reports = [verify(impl, X, WS, spec=_scan_spec, workers=n) for n in (1, 2)]
    assert (2, 2) in pools  # the rest and the loop body, in two workers
    same_report(*reports)
    if impl is _scan_spec:
        assert reports[1].verdict == "equivalent", reports[1].reason
        assert reports[1].stats.loops_by_induction == 1
        return
    assert reports[1].verdict == "not_equivalent", reports[1].reason
    lines = Path(__file__).read_text().splitlines()
    bug = next(k for k, ln in enumerate(lines, 1) if ln.endswith("# LINE: bug"))
    assert reports[1].location.impl.line == bug
