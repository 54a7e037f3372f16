"""Concrete checks beside the proof (`workers.ChecksBeside`): shape reduction's confirmation
(the pair at the real sizes, or each class larger) does not depend on the proof at reduced
shapes, so with a core free it runs in a forked child while the proof runs. The verdicts
and reports are those of the same checks made after the proof, in the same process."""

from __future__ import annotations

import json
import os
import time

import pytest
from test_shape_reduction import f32
from test_shape_reduction_witnesses import A, B, N, max_plus_min, sum_ok, sum_spec
from tv_ir.frontends.jax import verify

from tv_ir import pipeline
from tv_ir.prover import real_size, workers


@pytest.fixture
def forks(monkeypatch):
    """Every child `Beside` forks (recorded), as with workers=2, even for small pairs."""
    forked: list[bool] = []

    class Recorded(workers.Beside):
        def __init__(self, job, **how):
            super().__init__(job, **how)
            forked.append(self.forked)

    monkeypatch.setattr(workers, "Beside", Recorded)
    monkeypatch.setattr(pipeline, "BESIDE_MIN_OPS", 0)
    monkeypatch.setattr(real_size, "REPLAY_LIMIT", 0)  # confirmed on the witnesses
    return forked


def _comparable(report) -> dict:
    out = json.loads(report.to_json())
    out.pop("stats", None)  # timings
    return out


@pytest.mark.parametrize("impl", [sum_ok, max_plus_min], ids=["equal", "bug one class larger"])
def test_confirmation_beside_the_proof_gives_the_same_report(forks, impl) -> None:
    beside = verify(impl, f32(N, A, B), spec=sum_spec, workers=2)
    assert forks == [True]  # the confirmation ran in a child beside the proof
    after = verify(impl, f32(N, A, B), spec=sum_spec, workers=1)
    assert forks == [True, False]
    assert _comparable(beside) == _comparable(after)
    if impl is sum_ok:
        assert beside.verdict == "equivalent", beside.reason
        assert any("each shrunk class checked concretely" in n for n in beside.notes)
    else:  # the child's difference overturns the proof, as it does after it
        assert beside.verdict == "unknown", beside.reason
        assert "at 4 positions instead of 2" in beside.reason


def _boom():
    raise ValueError("the check failed")


@pytest.mark.parametrize("fork", [True, False])
def test_checks_answer_by_name_in_a_child_or_here(monkeypatch, fork) -> None:
    monkeypatch.setattr(workers, "_core_free", lambda: fork)
    with workers.ChecksBeside() as checks:
        checks.add("none", lambda: None)
        checks.add("text", lambda: "agreed")
        checks.add("raises", _boom)
        checks.start()
        checks.add("later", lambda: 7)  # added after the child started: computed here
        assert checks.result("text") == "agreed"
        assert checks.result("none") is None
        assert checks.result("later") == 7
        with pytest.raises(ValueError, match="the check failed"):
            checks.result("raises")


def _wait_for(path, seconds: float = 60.0) -> None:
    end = time.monotonic() + seconds
    while not os.path.exists(path):
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.01)


def _held(begun, go):
    """A check that says it has begun (file `begun`) and ends when `go` appears, giving
    the pid of the process that made it."""

    def check() -> int:
        begun.touch()
        _wait_for(go)
        return os.getpid()

    return check


def test_a_check_the_child_has_not_begun_is_made_here_once_asked(monkeypatch, tmp_path) -> None:
    # at 126 layers the child's check at the real layer count outlasts the proof, and the
    # confirmation waited behind it while this process sat idle: now the process makes it
    monkeypatch.setattr(workers, "_core_free", lambda: True)
    begun, go = tmp_path / "begun", tmp_path / "go"
    with workers.ChecksBeside() as checks:
        checks.add("long", _held(begun, go))
        checks.add("next", os.getpid)
        checks.start()
        _wait_for(begun)  # the child is in its first check
        assert checks.result("next") == os.getpid()  # not begun: made here
        go.touch()
        assert checks.result("long") not in (None, os.getpid())  # the child's answer
        assert checks.result("next") == os.getpid()


def test_parts_the_child_has_not_begun_are_made_here_from_the_last(monkeypatch, tmp_path) -> None:
    # a confirmation in witness runs: once the proof is done, this process makes the parts
    # the child has not begun (the last first) while the child finishes its own
    monkeypatch.setattr(workers, "_core_free", lambda: True)
    begun, go = tmp_path / "begun", tmp_path / "go"
    made_here: list[int] = []

    def part(k: int) -> int:
        made_here.append(k)  # only this process's list: the child's is its own copy
        if k == 1:
            go.touch()  # the last made here: the child's first part ends only now
        return os.getpid()

    with workers.ChecksBeside() as checks:
        parts = [_held(begun, go), *(lambda k=k: part(k) for k in (1, 2, 3))]
        checks.add_parts("confirm", parts, lambda pids: pids)
        checks.start()
        _wait_for(begun)  # the child is in its first part
        pids = checks.result("confirm")
    assert pids[0] != os.getpid() and pids[1:] == [os.getpid()] * 3
    assert made_here == [3, 2, 1]


def test_checks_started_later_wait_for_the_child_before(monkeypatch, tmp_path) -> None:
    # at 126 layers the checks at the real layer count are known before the pair at fewer
    # layers is reduced, and start then; the confirmation's, known only once it is, get a
    # second child, which begins when the first is done: the two never take the proof's
    # core between them
    monkeypatch.setattr(workers, "_core_free", lambda: True)
    first, second, go = tmp_path / "first", tmp_path / "second", tmp_path / "go"

    def confirm() -> int:
        second.touch()
        return os.getpid()

    with workers.ChecksBeside() as checks:
        checks.add("layers", _held(first, go))
        checks.start()
        _wait_for(first)  # the first child is busy with it
        checks.add("confirm", confirm)
        checks.start()
        time.sleep(0.5)
        assert not second.exists()  # the second child waits
        go.touch()
        _wait_for(second)  # the first is done: the second child begins, before anyone asks
        layers, confirmed = checks.result("layers"), checks.result("confirm")
    assert len({os.getpid(), layers, confirmed}) == 3  # two children, not this process


def test_asking_for_a_result_lets_a_waiting_child_go_on(monkeypatch, tmp_path) -> None:
    # the proof is done while the first child still works: this process makes the second
    # child's checks from the last, and the second child, no longer waiting, from the first
    monkeypatch.setattr(workers, "_core_free", lambda: True)
    first, go = tmp_path / "first", tmp_path / "go"
    with workers.ChecksBeside() as checks:
        checks.add("layers", _held(first, go))
        checks.start()
        _wait_for(first)
        checks.add_parts("confirm", [os.getpid, os.getpid], lambda pids: pids)
        checks.start()
        pids = checks.result("confirm")  # the first child still holds "layers"
        go.touch()
        assert checks.result("layers") != os.getpid()
    assert pids[1] == os.getpid()  # the last part: made here


def _ended(pid: int, seconds: float = 30.0) -> bool:
    """Whether process `pid` has exited (a zombie until its parent reaps it)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.01)
    return False


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_the_children_share_one_share_of_the_memory(monkeypatch, tmp_path) -> None:
    # a second share set aside for the confirmation's child lowered the proof's ceiling
    # twice: the 405B-shaped step under --memory-limit 2200 stopped the children and made
    # the confirmation after its proof (69 s against 57 s). The children work one after
    # the other, each ending with its result, so one share serves them all
    import numpy as np

    from tv_ir.limits import check_memory, memory_budget, memory_left_mb

    monkeypatch.setattr(workers, "_core_free", lambda: True)
    first, go = tmp_path / "first", tmp_path / "go"
    with memory_budget(400):
        before = memory_left_mb()
        with workers.ChecksBeside() as checks:
            checks.add("layers", os.getpid)
            checks.start()
            one = memory_left_mb()
            assert before - one == pytest.approx(before * workers.BESIDE_SHARE, abs=20)
            assert _ended(checks._children[0].beside.child.pid)  # done: gone, its memory too
            checks.add("confirm", _held(first, go))
            checks.start()
            assert memory_left_mb() == pytest.approx(one, abs=20)  # no second share
            _wait_for(first)  # the second child works
            grown = np.ones(340 * 2**20 // 8)  # past the lowered ceiling, within 400 MB
            check_memory(force=True)
            assert not any(c.beside.forked for c in checks._children)  # both stopped
            go.touch()
            assert checks.result("confirm") == os.getpid()  # made here
            assert checks.result("layers") not in (None, os.getpid())  # given before: kept
            del grown


def test_a_proof_short_of_memory_takes_back_the_share_of_the_checks_beside(
    monkeypatch, tmp_path
) -> None:
    # the 405B-shaped step on TrainVerify's PP-14 plan: its proof reached the ceiling
    # lowered by the child's share (3,500 MB less a quarter of what was left) and ended
    # unknown, though it fits the user's limit alone; now the child is stopped, the proof
    # goes on under the whole limit, and the checks are made here when asked for
    import os

    import numpy as np

    from tv_ir.limits import check_memory, memory_budget

    monkeypatch.setattr(workers, "_core_free", lambda: True)
    begun, go = tmp_path / "begun", tmp_path / "go"
    with memory_budget(400):
        with workers.ChecksBeside() as checks:
            checks.add("pid", _held(begun, go))
            checks.start()
            assert checks._children[0].beside.forked
            _wait_for(begun)  # the child is at it
            grown = np.ones(340 * 2**20 // 8)  # past 400 - 100 MB, within 400 MB
            check_memory(force=True)
            assert not checks._children[0].beside.forked
            go.touch()
            assert checks.result("pid") == os.getpid()  # made here: the child is gone
            del grown
