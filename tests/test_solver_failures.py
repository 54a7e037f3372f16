"""Z3's own failures (out of memory, any Z3Exception from `check()` or from reading a
model) end as `unknown` with a reason, never as a traceback out of `verify` / `check`."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import pytest
import z3

import tv_ir

X = jax.ShapeDtypeStruct((3,), jnp.float32)


def lower(f) -> str:
    return jax.jit(f).lower(X).as_text()


def relu_where(x):
    return jnp.where(x > 0, x, 0.0)


def relu_max(x):
    return jnp.maximum(x, 0.0)


def relu_threshold(x):  # differs on (0, 1e-3], which random simulation does not hit
    return jnp.where(x > 1e-3, x, 0.0)


def out_of_memory(*args, **kwargs):
    raise z3.Z3Exception("out of memory")


def test_proof_needing_z3_is_proved_without_the_patch():
    assert tv_ir.check(lower(relu_where), lower(relu_max)).verdict == "equivalent"


def test_out_of_memory_in_check_is_unknown(monkeypatch):
    monkeypatch.setattr(z3.Solver, "check", out_of_memory)
    r = tv_ir.check(lower(relu_where), lower(relu_max))
    assert r.verdict == "unknown", str(r)
    assert "z3 failed: out of memory" in r.reason


def test_out_of_memory_reading_a_model_is_unknown(monkeypatch):
    assert tv_ir.check(lower(relu_where), lower(relu_threshold)).verdict == "not_equivalent"
    monkeypatch.setattr(z3.ModelRef, "eval", out_of_memory)
    r = tv_ir.check(lower(relu_where), lower(relu_threshold))
    assert r.verdict == "unknown", str(r)
    assert "z3 failed: out of memory" in r.reason


@pytest.mark.parametrize("message", ["out of memory", "canceled", b"max. memory exceeded"])
def test_any_z3_exception_through_verify_is_unknown(monkeypatch, message):
    from tv_ir.frontends.jax import verify

    def fail(*args, **kwargs):
        raise z3.Z3Exception(message)

    monkeypatch.setattr(z3.Solver, "check", fail)
    r = verify(relu_max, X, spec=relu_where)
    assert r.verdict == "unknown", str(r)
    assert r.reason.startswith("output 0: z3 failed: ")


def test_backstop_outside_the_solver_wrapper(monkeypatch):
    """A Z3Exception raised anywhere in the proof (not only inside smt.check_equal)."""
    from tv_ir.prover import smt

    monkeypatch.setattr(smt, "check_equal", out_of_memory)
    r = tv_ir.check(lower(relu_where), lower(relu_max))
    assert r.verdict == "unknown", str(r)
    assert "z3 failed: out of memory" in r.reason


def test_a_solver_query_never_outlives_the_time_limit(monkeypatch) -> None:
    """A query is interrupted at what is left of the run's time limit, not at the end of its
    own budget: a 600 s query under a 0.5 s limit. z3's own `timeout` is never set (with
    one, z3 decides some queries another way, and the verdict would depend on whether a
    time limit was given): the watchdog interrupts it."""
    from tv_ir.limits import deadline
    from tv_ir.prover import smt

    params, walls = [], []
    real_set, real_backstop = z3.Solver.set, smt._backstop

    def recording_set(self, *args, **kwargs):
        params.append(args[0] if args else next(iter(kwargs)))
        return real_set(self, *args, **kwargs)

    def recording_backstop(ctx, cpu_s, wall_s, done, *rest):
        walls.append(wall_s)
        return real_backstop(ctx, cpu_s, wall_s, done, *rest)

    monkeypatch.setattr(z3.Solver, "set", recording_set)
    monkeypatch.setattr(smt, "_backstop", recording_backstop)
    x, y, z = z3.Ints("x y z")
    cubes = z3.And(x > 0, y > 0, z > 0, x * x * x + y * y * y == z * z * z)  # undecided
    with deadline(0.5):
        r = smt._solve(smt._Encoder(), [cubes], 600.0)
    assert r.status == "unknown"
    assert walls and walls[0] is not None and walls[0] <= 0.5  # not the query's 600 s
    assert "timeout" not in params and "rlimit" in params


def test_a_query_budget_is_solver_work_not_wall_clock(monkeypatch) -> None:
    """A query stops on its budget of z3 resource units (`--timeout` seconds' worth), which
    does not depend on the machine's load: the same query ends at the same point in every
    run, with one worker or many (issue #12: the same reports with N workers)."""
    from tv_ir.prover import smt

    spent = []
    real_check = z3.Solver.check

    def recording_check(self, *args):
        r = real_check(self, *args)
        st = self.statistics()
        spent.append(next(st.get_key_value(k) for k in st.keys() if k == "rlimit count"))
        return r

    monkeypatch.setattr(z3.Solver, "check", recording_check)
    monkeypatch.setattr(smt, "BACKSTOP_SLACK", 1000.0)  # the backstop out of the way

    def ask():
        with smt._own_context():  # as `check_equal` asks every query
            x, y, z = z3.Ints("x y z")
            cubes = z3.And(x > 0, y > 0, z > 0, x * x * x + y * y * y == z * z * z)  # undecided
            return smt._solve(smt._Encoder(), [cubes], 0.2)

    results = [ask(), ask()]
    assert [r.status for r in results] == ["unknown", "unknown"]
    assert [r.reason for r in results] == ["z3: timeout", "z3: timeout"]
    budget = int(0.2 * smt.RLIMIT_PER_SECOND)
    assert spent[0] == spent[1] and budget <= spent[0] < budget * 1.01, (spent, budget)


def test_a_query_that_ignores_its_budget_is_stopped_by_cpu_time(monkeypatch) -> None:
    """z3 does not check its resource budget everywhere: the backstop interrupts a query
    that has used BACKSTOP_SLACK times its seconds of CPU time (here: a budget z3 would never
    reach, and 0.02 s x 10 of CPU time)."""
    from tv_ir.prover import smt

    monkeypatch.setattr(smt, "RLIMIT_PER_SECOND", 10**15)
    with smt._own_context():
        x, y, z = z3.Ints("x y z")
        cubes = z3.And(x > 0, y > 0, z > 0, x * x * x + y * y * y == z * z * z)  # undecided
        cpu0 = time.process_time()
        r = smt._solve(smt._Encoder(), [cubes], 0.02)
        spent = time.process_time() - cpu0
    assert r.status == "unknown"
    assert spent < 30, spent  # not z3's own (absent) limit: the backstop stopped it


def test_the_memory_cap_holds_during_a_query_only(monkeypatch) -> None:
    """Under a memory limit z3 is capped at what is left of it while it solves, and the cap
    is lifted before the query's context is deleted: deleting a context allocates, and over
    a cap below what z3 then held that aborted the whole process (out_of_memory_error
    thrown through C++; a 32-device jit step under --memory-limit)."""
    from tv_ir import limits
    from tv_ir.prover import smt
    from tv_ir.semantics import terms as T

    monkeypatch.setattr(limits, "memory_left_mb", lambda: 64)
    caps = []
    real_solve = smt._solve

    def solve(*args):
        caps.append(z3.get_param("memory_max_size"))
        return real_solve(*args)

    monkeypatch.setattr(smt, "_solve", solve)
    x, y = T.symbol("x"), T.symbol("y")
    assert smt.check_equal([(T.mul(x, y), T.add(T.mul(y, x), x))]).status == "sat"
    assert caps == ["64"]
    assert z3.get_param("memory_max_size") == "0"


def test_no_query_for_a_moderate_model_begins_once_the_watchdog_fired(monkeypatch) -> None:
    """A model with a large value is asked for again within bounds (`_moderate_model`):
    those queries run under the first one's watchdog, and none begins once it has fired
    (it interrupts once: past it they ran unbounded, 18 minutes of a 150-s limit)."""
    import threading

    from tv_ir.prover import smt

    asked = []
    monkeypatch.setattr(smt, "_model_with", lambda s, extra: asked.append(extra))
    enc = smt._Encoder()
    x = z3.Real("x")
    enc.symbols[0] = x
    s = z3.Solver()
    s.add(x > 10**9)
    assert s.check() == z3.sat
    fired = threading.Event()
    fired.set()
    assert smt._moderate_model(s, enc, s.model(), fired) is not None
    assert asked == []
    smt._moderate_model(s, enc, s.model(), threading.Event())
    assert len(asked) == 2  # not fired: both bounds tried (the stub finds no model)
