"""Planted partitioning bugs in XLA's per-device programs of the SPMD corpus, checked by tv.

    python bench/xla_spmd_mutants.py [--jobs 2] [--only NAME ...] [--proved results.jsonl]
                                     [--time-limit S] [--out mutants.jsonl]
    python bench/xla_spmd_mutants.py --table mutants.jsonl ...    # the table of earlier runs

For every module of ../shared/corpus/xla_spmd that tv proves (or those `--proved` lists as
proved, from `bench/xla_spmd.py --out`): XLA partitions it on CPU, and each kind of
tests/xla_spmd_mutations.py (dropped collective, wrong groups, permuted pairs, shifted
slice, shifted offsets, wrong reduction, swapped operands) plants one bug in the per-device
program, at its first live site. tv checks each mutant against the module. A refutation's
counterexample is replayed on XLA (the mutated per-device program on its devices vs the
module on one device) when it is at the real sizes. A mutant tv proves is run on XLA on
random inputs: if XLA shows a difference tv proved a wrong program (a soundness bug); if
not, the mutant computes the same values on those inputs (an equivalent mutant, listed by
name). One fresh process per module; a table per kind.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from child_process import run_worker  # noqa: E402
from xla_spmd import _one_line, corpus_env  # noqa: E402

TIME_LIMIT = 20.0  # seconds for tv per program (the module's own check, each mutant)
MEMORY_LIMIT = 1800.0
RSS_LIMIT = 2500.0
XLA_RUN_LIMIT = 50_000_000  # argument elements: a proved mutant past this is not run on XLA
RANDOM_RUNS = 3  # random inputs a proved mutant is run on with XLA
HANG_ABORT_S = 60  # XLA's CPU runtime aborts a collective still waiting after this long


def worker(name: str, time_limit: float, memory_limit: float, check_original: bool) -> dict:
    """Child process: partition one module, prove it, then check and replay each mutant."""
    from xla_spmd_corpus import argument_shapes, cases, partition_case, xla_layouts
    from xla_spmd_mutations import mutants

    from tv_ir.pipeline import check

    case = next(c for c in cases() if c.name == name)
    out: dict = {"name": name}
    try:
        before, parted = partition_case(case)
    except Exception as e:
        return out | {"skipped": f"not partitionable: {_one_line(e, 120)}"}
    layouts = xla_layouts(parted)

    def run(text: str):
        return check(
            case.path, text, time_limit=time_limit, memory_limit=memory_limit, layouts=layouts
        )

    if check_original:
        try:
            r = run(parted.per_device_hlo)
        except Exception as e:
            return out | {"skipped": f"original not checked: {_one_line(e, 120)}"}
        if r.verdict != "equivalent":
            return out | {"skipped": f"original {r.verdict}"}
    real = argument_shapes(before, parted)
    results = []
    for m in mutants(parted.per_device_hlo):
        t0 = time.perf_counter()
        res = {"kind": m.kind, "site": m.site}
        try:
            r = run(m.text)
            res["verdict"] = r.verdict
            if r.verdict == "unknown":
                res["reason"] = _one_line(r.reason, 160)
        except Exception as e:  # the mutant is not a program tv or XLA reads
            res |= {"verdict": "invalid", "reason": _one_line(e, 160)}
            r = None
        res["tv_seconds"] = round(time.perf_counter() - t0, 2)
        mutated = dataclasses.replace(parted, per_device_hlo=m.text)
        if res["verdict"] == "not_equivalent":
            inputs = list(r.counterexample.inputs.values())
            if [x.shape for x in inputs] != real:
                res["xla_confirms"] = "reduced shapes (replayed by tv)"
            elif r.counterexample.hang is not None:
                res["hang"] = True
                res["xla_confirms"] = _hangs_on_xla(name, m, inputs)
            else:
                res["xla_confirms"] = _replay(before, mutated, inputs, parted.per_device_hlo)
        elif res["verdict"] == "equivalent":
            res["xla_differs"] = _random_replays(before, mutated, parted.per_device_hlo)
        results.append(res)
    return out | {"mutants": results}


def _replay(before, parted, inputs, original: str):
    """Whether XLA computes the mutant differently: from the module on one device, or, for a
    module with manual boundary values (no run on one device), from XLA's original
    partitioning, which tv proved equal to the module."""
    from xla_spmd_corpus import replay_on_xla

    try:
        return replay_on_xla(before, parted, inputs, original)["differs"]
    except Exception as e:
        return f"replay failed: {_one_line(e, 100)}"


def _hangs_on_xla(name: str, mutant, inputs: list):
    """Whether XLA's run of the mutant on `inputs` never returns, as tv says (its devices
    wait at a collective for devices that never reach it): run in a process of its own,
    which XLA aborts once a collective has waited `HANG_ABORT_S` ("Termination timeout ...
    Expected 2 threads to join the rendezvous, but only 1 of them arrived"). True then;
    False when XLA returns; else what happened."""
    import os
    import subprocess
    import tempfile

    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "inputs.npz")
        np.savez(path, *[np.asarray(x) for x in inputs])
        cmd = [sys.executable, __file__, "--replay-hang", name, mutant.kind, mutant.site, path]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=2 * HANG_ABORT_S)
        except subprocess.TimeoutExpired:
            return True  # not returned in twice the time XLA waits before aborting
    if done.returncode == 0:
        return False
    said = [line for line in done.stderr.splitlines() if "Termination timeout" in line]
    if said:
        return True
    return f"replay failed: exit {done.returncode}: {_one_line(done.stderr[-300:], 100)}"


def replay_hang(name: str, kind: str, site: str, path: str) -> None:
    """The `--replay-hang` child: XLA runs the mutant on the saved inputs (and aborts the
    process if its devices wait forever)."""
    import numpy as np
    from xla_spmd_corpus import cases, partition_case
    from xla_spmd_mutations import mutants

    case = next(c for c in cases() if c.name == name)
    before, parted = partition_case(case)
    m = next(m for m in mutants(parted.per_device_hlo) if (m.kind, m.site) == (kind, site))
    saved = np.load(path)
    inputs = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    mutated = dataclasses.replace(parted, per_device_hlo=m.text)
    print(json.dumps({"returned": _replay(before, mutated, inputs, parted.per_device_hlo)}))


def _random_replays(before, parted, original: str):
    """Whether XLA's run of the mutant differs from the module on some random input."""
    import numpy as np
    from xla_spmd_corpus import argument_shapes

    from tv_ir.pipeline import prepare

    rng = np.random.default_rng(0)
    types = prepare(before, "module").main.arg_types
    shapes = argument_shapes(before, parted)  # manual values stacked by instance
    if sum(int(np.prod(s)) for s in shapes) > XLA_RUN_LIMIT:
        return "too large to run on XLA"  # 39295-wide einsums: 10 billion elements
    for _ in range(RANDOM_RUNS):
        inputs = []
        for t, shape in zip(types, shapes, strict=True):
            if t.is_float:
                inputs.append(rng.standard_normal(shape))
            elif t.is_bool:
                inputs.append(rng.integers(0, 2, shape).astype(bool))
            else:
                inputs.append(rng.integers(0, 4, shape))
        differs = _replay(before, parted, inputs, original)
        if differs is not False:
            return differs
    return False


def run_child(name: str, devices: int, a) -> dict:
    args = [name, "--time-limit", str(a.time_limit), "--memory-limit", str(a.memory_limit)]
    args += ["--trust-proved"] if a.proved else []
    child = run_worker(__file__, args, 9 * a.time_limit + 120, corpus_env(devices), a.rss_limit)
    if child.killed:
        return {"name": name, "skipped": f"killed by the bench: {child.killed}"}
    if child.result is None:
        return {"name": name, "skipped": f"child exited {child.returncode}: {child.tail(2)[-200:]}"}
    return child.result


def outcome(m: dict) -> str:
    """One mutant's outcome, for the table."""
    v = m["verdict"]
    if v == "not_equivalent":
        c = m.get("xla_confirms")
        return {True: "refuted, XLA confirms", False: "refuted, XLA does NOT confirm"}.get(
            c, "refuted, at reduced shapes" if "reduced" in str(c) else "refuted, replay failed"
        )
    if v == "equivalent":
        d = m.get("xla_differs")
        if d == "too large to run on XLA":
            return "proved, too large for XLA"
        return {True: "PROVED, XLA DIFFERS (soundness bug)", False: "proved, XLA agrees"}.get(
            d, "proved, replay failed"
        )
    return v


def table(results: list[dict]) -> str:
    rows = defaultdict(Counter)
    for r in results:
        for m in r.get("mutants", []):
            rows[m["kind"]][outcome(m)] += 1
    cols = [
        "refuted, XLA confirms",
        "refuted, at reduced shapes",
        "refuted, XLA does NOT confirm",
        "refuted, replay failed",
        "unknown",
        "invalid",
        "proved, XLA agrees",
        "proved, replay failed",
        "PROVED, XLA DIFFERS (soundness bug)",
    ]
    cols = [c for c in cols if any(rows[k][c] for k in rows)]
    head = f"{'kind':<20} {'mutants':>7} " + " ".join(f"{c[:22]:>22}" for c in cols)
    lines = [f"{sum('mutants' in r for r in results)} modules mutated", head]
    total = Counter()
    for kind in sorted(rows):
        total += rows[kind]
        n = sum(rows[kind].values())
        lines.append(f"{kind:<20} {n:>7} " + " ".join(f"{rows[kind][c]:>22}" for c in cols))
    n = sum(total.values())
    lines.append(f"{'all':<20} {n:>7} " + " ".join(f"{total[c]:>22}" for c in cols))
    for r in results:
        for m in r.get("mutants", []):
            if m["verdict"] in ("equivalent", "unknown", "invalid"):
                why = m.get("reason", "")
                lines.append(f"  {outcome(m)}: {r['name']} {m['kind']} {m['site']} {why}"[:220])
    skipped = Counter(r["skipped"].split(":")[0] for r in results if "skipped" in r)
    lines += [f"skipped {k}: {v}" for k, v in skipped.most_common()]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="modules at once (default 2)")
    ap.add_argument("--only", nargs="*", help="these modules only")
    ap.add_argument("--proved", help="bench/xla_spmd.py --out file: its proved modules only")
    ap.add_argument("--time-limit", type=float, default=TIME_LIMIT, help="tv s per program")
    ap.add_argument("--memory-limit", type=float, default=MEMORY_LIMIT, help="tv MB per program")
    ap.add_argument("--rss-limit", type=float, default=RSS_LIMIT, help="MB per child, then killed")
    ap.add_argument("--out", help="also append each module's JSON object to this file")
    ap.add_argument("--table", nargs="+", help="print the table of these --out files and stop")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--trust-proved", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--replay-hang", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.replay_hang:
        replay_hang(*a.replay_hang)
        return
    if a.worker:
        r = worker(a.worker, a.time_limit, a.memory_limit, not a.trust_proved)
        print(json.dumps(r), flush=True)
        return
    if a.table:
        lines = [line for f in a.table for line in Path(f).read_text().splitlines()]
        print(table([json.loads(line) for line in lines]))
        return
    from xla_spmd_corpus import CORPUS, cases

    todo = [c for c in cases() if c.num_devices and (not a.only or c.name in a.only)]
    if a.proved:
        lines = Path(a.proved).read_text().splitlines()
        proved = {r["name"] for r in map(json.loads, lines) if r.get("outcome") == "proved"}
        todo = [c for c in todo if c.name in proved]
    if not todo:
        sys.exit(f"no corpus modules at {CORPUS} (set TV_XLA_SPMD_CORPUS)")
    results = []
    out = open(a.out, "a") if a.out else None
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        futures = [pool.submit(run_child, c.name, c.num_devices, a) for c in todo]
        for future in as_completed(futures):
            r = future.result()
            results.append(r)
            if out:
                out.write(json.dumps(r) + "\n")
                out.flush()
            kinds = ", ".join(f"{m['kind']}: {outcome(m)}" for m in r.get("mutants", []))
            print(f"{r['name']}: {r.get('skipped', kinds)}"[:300], file=sys.stderr)
    print(table(results))


if __name__ == "__main__":
    main()
