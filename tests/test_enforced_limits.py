"""The time and memory limits hold inside one long step, where tv's own polls are not
reached: a watchdog raises the limit's error in the checking thread."""

from __future__ import annotations

import importlib
import sys
import threading
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tv_ir
from tv_ir import limits
from tv_ir.semantics.symbolic import SymbolicAlgebra

X = jax.ShapeDtypeStruct((4, 4), jnp.float32)
SPEC = jax.jit(lambda x: x * 2.0).lower(X).as_text()
IMPL = jax.jit(lambda x: x + x).lower(X).as_text()


def test_a_step_that_never_polls_the_clock_is_stopped_at_the_time_limit(monkeypatch) -> None:
    finished = []

    def slow_multiply(self, x, y):  # 60 s of work that never calls check_time
        for _ in range(6000):
            time.sleep(0.01)
        finished.append(True)
        raise AssertionError("not stopped")

    monkeypatch.setattr(SymbolicAlgebra, "multiply", slow_multiply)
    r = tv_ir.check(SPEC, IMPL, time_limit=1.0)
    assert r.verdict == "unknown" and "time limit of 1 s" in r.reason, r.reason
    assert not finished


def _greedy_multiply(held: list, finished: list):
    def greedy_multiply(self, x, y):  # grows by 8 MB every 10 ms, never calls check_memory
        for _ in range(200):
            held.append(np.ones(2**20))
            time.sleep(0.01)
        finished.append(True)
        raise AssertionError("not stopped")

    return greedy_multiply


def test_a_step_that_never_polls_memory_is_stopped_at_the_memory_limit(monkeypatch) -> None:
    finished = []
    held = []
    monkeypatch.setattr(SymbolicAlgebra, "multiply", _greedy_multiply(held, finished))
    limit = 400  # MB the check may add to the process (it grows by 1,600)
    try:
        r = tv_ir.check(SPEC, IMPL, memory_limit=limit)
    finally:
        held.clear()
    assert r.verdict == "unknown" and "memory limit" in r.reason, r.reason
    assert not finished


def test_without_a_memory_limit_a_run_that_explodes_ends_unknown(monkeypatch) -> None:
    """No `memory_limit`: the run may add most of the memory available when it starts, and
    going over ends it `unknown` (not the kernel killing the process, and the machine's
    other processes with it). A machine with 470 MB available stands in for a real one."""
    finished = []
    held = []
    monkeypatch.setattr(limits, "available_memory_mb", lambda: 470.0)
    monkeypatch.setattr(SymbolicAlgebra, "multiply", _greedy_multiply(held, finished))
    try:
        r = tv_ir.check(SPEC, IMPL)
    finally:
        held.clear()
    assert r.verdict == "unknown", r.reason
    assert r.reason.startswith("memory limit of 400 MB reached (the default: 85% of the memory")
    assert "--memory-limit" in r.reason, r.reason
    assert not finished


def test_the_memory_available_is_read_from_the_os() -> None:
    available = limits.available_memory_mb()
    physical = limits.physical_memory_mb()
    assert available is not None and 0 < available <= physical, (available, physical)


def test_an_interrupt_dropped_by_a_callback_is_sent_again(monkeypatch) -> None:
    """An interrupt raised inside a callback the interpreter calls itself (a garbage
    collection callback: "Exception ignored in ...") is dropped; the run is still stopped."""
    dropped, finished = [], []

    def callback_that_drops(self, x, y):  # the first interrupt lands where it is dropped
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 60:
            try:
                time.sleep(0.01)
            except tv_ir.limits.OutOfTime:
                if dropped:
                    raise
                dropped.append(True)
        finished.append(True)
        raise AssertionError("not stopped")

    monkeypatch.setattr(tv_ir.limits, "ENFORCE_REFIRE_S", 1.0, raising=False)
    monkeypatch.setattr(SymbolicAlgebra, "multiply", callback_that_drops)
    r = tv_ir.check(SPEC, IMPL, time_limit=1.0)
    assert r.verdict == "unknown" and "time limit of 1 s" in r.reason, r.reason
    assert dropped and not finished


def test_an_interrupt_lost_in_a_gc_callback_is_sent_again_at_once(capfd, monkeypatch) -> None:
    """Interrupts that land in a garbage-collection callback (jax registers one) are lost
    by Python with an "Exception ignored" traceback: the watchdog sends the next at once,
    not `ENFORCE_REFIRE_S` later, and nothing is printed."""
    import gc

    lost, finished = [], []
    t0 = time.perf_counter()

    def swallowing_callback(phase, info) -> None:  # where the first 3 interrupts are lost
        if phase != "start" or len(lost) >= 3 or time.perf_counter() - t0 < 1.0:
            return
        try:
            time.sleep(0.5)  # past the deadline: nearly all the time is spent here
        except tv_ir.limits.OutOfTime:
            lost.append(True)
            raise  # Python drops it: "Exception ignored in ..."

    def collecting_multiply(self, x, y):  # one long step that mostly runs collections
        while time.perf_counter() - t0 < 60:
            gc.collect(0)
        finished.append(True)
        raise AssertionError("not stopped")

    monkeypatch.setattr(SymbolicAlgebra, "multiply", collecting_multiply)
    hook = sys.unraisablehook
    gc.callbacks.append(swallowing_callback)
    try:
        r = tv_ir.check(SPEC, IMPL, time_limit=1.0)
    finally:
        gc.callbacks.remove(swallowing_callback)
    took = time.perf_counter() - t0
    assert r.verdict == "unknown" and "time limit of 1 s" in r.reason, r.reason
    assert not finished and len(lost) == 3
    assert took < limits.ENFORCE_REFIRE_S, took  # not one refire interval per lost interrupt
    assert "Exception ignored" not in capfd.readouterr().err
    assert sys.unraisablehook is hook  # restored


def test_a_check_collects_garbage_in_bulk_and_restores_the_collector() -> None:
    """While a check runs (`run_deep`), Python's collector waits for GC_YOUNG_THRESHOLD new
    objects (a check makes millions that live until it ends); afterwards it is as it was."""
    import gc

    from tv_ir import limits

    before = gc.get_threshold()
    during = limits.run_deep(gc.get_threshold)
    assert during[0] == max(before[0], limits.GC_YOUNG_THRESHOLD) > 700
    assert during[1:] == before[1:]
    assert gc.get_threshold() == before


def test_a_thread_loading_a_module_is_seen_importing(tmp_path, monkeypatch) -> None:
    """The watchdog holds its interrupt while the checking thread loads a module (one raised
    inside an extension's initialisation crashes the process), read from the import
    system's module locks, never from the thread's live frames."""
    gate = types.SimpleNamespace(entered=threading.Event(), release=threading.Event())
    monkeypatch.setitem(sys.modules, "tv_test_import_gate", gate)
    (tmp_path / "tv_test_slow_module.py").write_text(
        "import sys\n"
        "gate = sys.modules['tv_test_import_gate']\n"
        "gate.entered.set()\n"
        "gate.release.wait(30)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tv_test_slow_module", raising=False)
    importer = threading.Thread(target=importlib.import_module, args=("tv_test_slow_module",))
    idle = threading.Thread(target=gate.release.wait, args=(30,))
    importer.start()
    idle.start()
    try:
        assert gate.entered.wait(30)
        assert limits._importing(importer.ident)
        assert not limits._importing(idle.ident)
        assert not limits._importing(threading.get_ident())
    finally:
        gate.release.set()
        importer.join()
        idle.join()
    assert not limits._importing(importer.ident)
    monkeypatch.delitem(sys.modules, "tv_test_slow_module", raising=False)


def test_a_stop_while_checking_loops_unrolled_says_why_they_were(monkeypatch) -> None:
    """The watchdog's exception, raised again with why the loops were not proved as loops,
    is a clear unknown (it was a TypeError traceback: its class took no message)."""
    from tv_ir import pipeline

    def slow_plan(*args):  # planning that never calls check_time
        for _ in range(6000):
            time.sleep(0.01)
        raise AssertionError("not stopped")

    monkeypatch.setattr(pipeline, "_by_induction", lambda *a, **k: "no loop invariant found")
    monkeypatch.setattr(pipeline, "_mesh_plan", slow_plan)
    r = tv_ir.check(SPEC, IMPL, time_limit=1.0)
    assert r.verdict == "unknown" and "time limit of 1 s" in r.reason, r.reason
    assert "not by induction: no loop invariant found" in r.reason, r.reason


def test_the_symbols_of_a_large_value_poll_the_clock() -> None:
    """A value of millions of elements (a 4096 x 4096 weight checked at its real size) took
    seconds to get its symbols, past the limit, until the watchdog stepped in."""
    from tv_ir.semantics import terms as T

    with limits.deadline(0.0), pytest.raises(limits.OutOfTime):
        T.symbol_array("x", (1024, 1024))


def test_stops_by_polls_are_forgotten_once_no_watchdog_needs_them(monkeypatch) -> None:
    """One entry per thread a poll stopped: threads come and go (each check's, a pool's),
    so entries past the watchdog's refire interval are dropped at the next stop."""
    now = time.perf_counter()
    old = {-k: now - limits.ENFORCE_REFIRE_S - 1.0 for k in range(1, 1001)}
    recent = {-2000: now}
    monkeypatch.setattr(limits, "_polled_stops", {**old, **recent})
    with limits.deadline(0.0), pytest.raises(limits.OutOfTime):
        limits.check_time()
    assert set(limits._polled_stops) == {-2000, threading.get_ident()}


def test_a_stop_by_a_poll_keeps_its_report_through_slow_work_after_it(monkeypatch) -> None:
    """The proof stopped by a poll, then seconds of work before the report is made (freeing
    millions of terms did that): the watchdog does not stop that work again, which lost the
    report of how far the proof got."""
    from tv_ir.semantics import terms as T

    def polling_multiply(self, x, y):  # slow work that polls the clock
        while True:
            time.sleep(0.01)
            limits.check_time()

    real_forget = T.forget_later

    def slow_forget() -> None:  # the engine's clean-up after the stop, 3 s without a poll
        for _ in range(300):
            time.sleep(0.01)
        real_forget()

    monkeypatch.setattr(SymbolicAlgebra, "multiply", polling_multiply)
    monkeypatch.setattr(T, "forget_later", slow_forget)
    r = tv_ir.check(SPEC, IMPL, time_limit=1.0)
    assert r.verdict == "unknown", str(r)
    assert "stages proved by then" in r.reason, r.reason


TRACED_CHECK = """
import sys, threading
def trace(*args):
    return None
sys.settrace(trace)  # as coverage.py, a debugger or a profiler does
threading.settrace(trace)
import tv_ir
spec = '''module @m {
  func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32> } }'''
print(tv_ir.check(spec, spec.replace("add %a, %b", "add %b, %a"), time_limit=60).verdict)
"""


def test_a_check_under_a_trace_function_ends() -> None:
    # the watchdog's end cleared a pending interrupt with PyThreadState_SetAsyncExc(id,
    # NULL), after which CPython 3.11 never ran the next statement of a traced thread: a
    # check under coverage or a debugger hung (in a child here, so a hang fails the test)
    import subprocess

    r = subprocess.run(
        [sys.executable, "-c", TRACED_CHECK], capture_output=True, text=True, timeout=120
    )
    assert r.stdout.split() == ["equivalent"], r.stderr[-2000:]


def test_a_difference_seen_in_simulation_is_reported_when_the_time_limit_stops_the_proof(
    monkeypatch,
) -> None:
    """A difference above float64 noise but too small to refute at once (1e-7 relative) is
    replayed when the proof fails; a proof stopped by the time limit failed too, and the
    one concrete run (and its replay at the real sizes) still gets to report the bug
    (`gelu(approximate=True)` against the exact one ended `unknown` at any limit)."""
    from tv_ir.prover import engine

    def slow_prove(self, *args):  # a proof that reaches the time limit
        time.sleep(1.2)
        limits.check_time()
        raise AssertionError("the time limit did not stop it")

    monkeypatch.setattr(engine.StageProver, "_prove", slow_prove)
    monkeypatch.setattr(engine.StageProver, "_guard_runs", lambda self, rng: None)  # 1, 2, ...
    x = jax.ShapeDtypeStruct((4, 4), jnp.float32)
    spec = jax.jit(lambda x: x).lower(x).as_text()
    impl = jax.jit(lambda x: x * (1 + 1e-7)).lower(x).as_text()
    r = tv_ir.check(spec, impl, time_limit=1.0)
    assert r.verdict == "not_equivalent", str(r)


def test_a_run_where_no_thread_can_start_still_gets_its_verdict(monkeypatch) -> None:
    """Under an address-space cap (`ulimit -v`) a new thread's stack may not fit: the
    watchdog (which the default memory limit now starts on every run) is then left out,
    and the limits hold where tv polls them. The transformer tests' 2 GB cap hit this."""
    real_start = threading.Thread.start

    def start(self):
        if self.name == "tv-limits":
            raise RuntimeError("can't start new thread")
        return real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    r = tv_ir.check(SPEC, IMPL)
    assert r.verdict == "equivalent", str(r)
