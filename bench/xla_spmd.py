"""XLA's SPMD partitioner unit tests, partitioned by jaxlib's XLA on CPU and verified by tv.

    python bench/xla_spmd.py [--jobs 2] [--json] [--only NAME ...] [--time-limit S]
    python bench/xla_spmd.py --why results.jsonl     # what keeps the limit-bound ones big
    python bench/xla_spmd.py --table results.jsonl rerun.jsonl  # the table, reruns merged

For every module of ../shared/corpus/xla_spmd (or TV_XLA_SPMD_CORPUS; read in place): XLA
partitions it on CPU as its unit test does (sharding propagation off, `num_devices`
partitions; the tests' partitioner options are not exposed by XLA:CPU and are recorded,
not applied), and tv checks the per-device program dumped right after `spmd-partitioning`
(HLO text) against the module (`tv check BEFORE AFTER`). Each refutation is replayed on XLA
itself (the partitioned executable on its devices vs the unpartitioned module on one
device). One fresh process per module, `--jobs` at a time; a table of outcomes by reason
beside XLA's compile time and tv's time, or one JSON object per module with `--json`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from child_process import run_worker  # noqa: E402

TIME_LIMIT = 120.0  # seconds for tv per module
MEMORY_LIMIT = 2000.0  # MB for tv per module
RSS_LIMIT = 2800.0  # MB resident per child process (XLA and tv), then it is killed
OUTCOMES = ("proved", "refuted", "unknown", "bad_input", "error", "not_partitionable")


def worker(name: str, time_limit: float, memory_limit: float, form: str = "pair") -> dict:
    """Child process: partition one module, check it in `form` (FORMS), replay a refutation
    on XLA."""
    from xla_spmd_corpus import cases, partition_case, replay_on_xla

    from tv_ir.errors import BadInput, TvError

    case = next(c for c in cases() if c.name == name)
    out = {"name": name, "devices": case.num_devices, "options": case.test_options}
    if form != "pair":
        out["form"] = form
    print(json.dumps({"phase": "partition"}), flush=True)  # a crash in XLA ends here
    try:
        before, parted = partition_case(case, as_stablehlo=form == "stablehlo")
    except Exception as e:  # XLA (or jaxlib's HLO conversion) refused the module
        reason = _one_line(str(e).removeprefix("XLA could not partition the module: "))
        if case.expects_partitioner_error:
            return out | {"outcome": "not_partitionable", "reason": "error expected by the test"}
        return out | {"outcome": "not_partitionable", "reason": reason}
    out["xla_seconds"] = round(parted.compile_seconds, 3)
    from tv_ir.pipeline import check

    print(json.dumps({"phase": "check"}), flush=True)
    t0 = time.perf_counter()
    try:
        spec, impl, layouts = form_inputs(form, case, before, parted)
        report = check(
            spec, impl, time_limit=time_limit, memory_limit=memory_limit, layouts=layouts
        )
    except BadInput as e:
        return out | _tv_time(t0) | {"outcome": "bad_input", "reason": _one_line(e)}
    except TvError as e:
        return out | _tv_time(t0) | {"outcome": "unknown", "reason": _one_line(e)}
    except Exception as e:  # a bug in tv
        return out | _tv_time(t0) | {"outcome": "error", "reason": f"{type(e).__name__}: {e}"}
    out |= _tv_time(t0)
    if report.verdict == "equivalent":
        return out | {"outcome": "proved"}
    if report.verdict == "unknown":
        return out | {"outcome": "unknown", "reason": _one_line(report.reason)}
    cex = report.counterexample
    out |= {"outcome": "refuted", "reason": _refutation(report)}
    if cex.hang is not None:  # XLA's run would abort this process (bench/xla_spmd_mutants.py)
        return out | {"xla_confirms": None, "replay_error": "a hang: not run on XLA here"}
    try:
        replay = replay_on_xla(before, parted, list(cex.inputs.values()))
        out["xla_confirms"] = replay["differs"]
    except Exception as e:
        out["xla_confirms"] = None
        out["replay_error"] = _one_line(e)
    return out


# the forms a compiler engineer hands tv the same partitioning in (issue #11): "pair", the
# module before partitioning with its shardings and XLA's per-device HLO text after it,
# result layouts from the executable (where the module leaves a result unannotated); "hlo",
# the per-device HLO text against the module without shardings, every layout given as
# `--in-shardings/--out-shardings` (XLA's text dump after partitioning keeps `num_partitions`
# and the parameters' shardings but not the results'); "stablehlo", the StableHLO jaxlib
# converts XLA's proto dump to (layouts in the `mhlo.spmd_*` module attributes, no
# `mhlo.num_partitions`) against the module without shardings
FORMS = ("pair", "hlo", "stablehlo")


def form_inputs(form: str, case, before: str, parted) -> tuple:
    """(spec, impl, layouts) for `tv_ir.check` in one of FORMS."""
    from xla_spmd_corpus import per_device_only, unpartitioned, xla_layouts

    from tv_ir.prover.boundary_layouts import GivenLayouts

    if form == "pair":
        return case.path, parted.per_device_hlo, xla_layouts(parted)
    if per_device_only(before, parted):
        # a module with manual values has no single-device form: its annotations are its
        # meaning (and its partition count, which jaxlib's StableHLO drops)
        spec = before
    else:
        spec = unpartitioned(before)
    if form == "hlo":
        given = GivenLayouts(
            in_shardings=list(parted.arg_shardings), out_shardings=list(parted.out_shardings)
        )
        return spec, parted.per_device_hlo, given
    return spec, parted.per_device_stablehlo, None


def merged_results(files: list[str]) -> list[dict]:
    """The modules of results files, each from the last file that has it."""
    by_name: dict[str, dict] = {}
    for f in files:
        for line in Path(f).read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                by_name[r["name"]] = r
    return list(by_name.values())


def compare_forms(files: list[str]) -> str:
    """The modules whose outcome differs between results files of different forms."""
    runs = []
    for f in files:
        rows = [json.loads(line) for line in Path(f).read_text().splitlines() if line.strip()]
        runs.append({r["name"]: r for r in rows})
    names = sorted(set.intersection(*(set(r) for r in runs)))
    lines, same = [], 0
    for n in names:
        outcomes = [r[n]["outcome"] for r in runs]
        if len(set(outcomes)) == 1:
            same += 1
            continue
        why = " | ".join(f"{r[n]['outcome']}: {r[n].get('reason', '')[:90]}" for r in runs)
        lines.append(f"  {n}: {why}")
    head = f"{same} of {len(names)} modules in all {len(files)} files: same outcome"
    return "\n".join([head, *lines])


def _tv_time(t0: float) -> dict:
    return {"tv_seconds": round(time.perf_counter() - t0, 3)}


def _refutation(report) -> str:
    c = report.counterexample
    where = report.location.impl if report.location else None
    at = f" at {where.op}" if where is not None else ""
    if c.hang is not None:
        return f"{c.what()}{at}"
    return (
        f"output {c.output} {list(c.index)} on device {c.device}: "
        f"expected {c.expected}, got {c.actual}{at}"
    )


def _one_line(e, limit: int = 300) -> str:
    msg = " ".join(str(e).split())
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def run_child(name: str, devices: int, a) -> dict:
    args = [name, "--time-limit", str(a.time_limit), "--memory-limit", str(a.memory_limit)]
    args += ["--form", a.form] + (["--why-worker"] if a.why else [])
    t0 = time.perf_counter()
    child = run_worker(__file__, args, a.time_limit + 90, corpus_env(devices), a.rss_limit)
    if child.killed:
        reason = f"killed by the bench: {child.killed}"
        return {"name": name, "outcome": "unknown", "reason": reason}
    last = child.result or {}
    if "outcome" in last:
        return last
    if last.get("phase") == "partition" and child.returncode < 0:
        reason = f"XLA crashed (signal {-child.returncode})"
        return {"name": name, "outcome": "not_partitionable", "reason": reason}
    return {
        "name": name,
        "outcome": "error",
        "reason": f"child exited {child.returncode} while {last.get('phase', '?')}: "
        f"{child.tail(2)[-300:]}",
        "wall_seconds": round(time.perf_counter() - t0, 1),
    }


def corpus_env(devices: int) -> dict:
    """The environment of a child partitioning for `devices` CPU devices."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={max(devices, 1)}"
    ).strip()
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return env


def why_worker(name: str) -> dict:
    """Child process: what shape reduction keeps at its real size in one module's pair (the
    root cause of a time or memory limit), largest class first."""
    from tv_ir.passes.shape_reduction import reduce_pair
    from xla_spmd_corpus import cases, partition_case, xla_layouts

    from tv_ir.pipeline import _boundary_placement, check_signatures, prepare

    case = next(c for c in cases() if c.name == name)
    _, parted = partition_case(case)
    spec, impl = prepare(case.path, "spec"), prepare(parted.per_device_hlo, "impl")
    placement = _boundary_placement(spec, impl, xla_layouts(parted))
    check_signatures(spec, impl, placement)
    r = reduce_pair(spec, impl, placement, True).to_json()
    kept = [c for c in r.get("classes", []) if c["reduced"] == c["real"] > 2]
    for c in kept:  # no rule kept it: no factor divides its size and its shards' bounds
        c["kept"] = c.get("kept") or f"no factor divides {c['real']} and its shard bounds"
    kept.sort(key=lambda c: -c["real"])
    return {
        "name": name,
        "outcome": "why",
        "failed": r.get("failed"),
        "real_elements": r.get("real_elements"),
        "reduced_elements": r.get("reduced_elements"),
        "kept": [[c["real"], c["kept"]] for c in kept[:6]],
        "cause": root_cause(r.get("failed"), kept, r.get("reduced_elements") or 0),
    }


# what keeps a dimension at its real size, most specific first
ROOT_CAUSES = [
    (
        r"convolution window.*halos",
        "convolution spatial dimensions widened by halos (a partitioned window, or a valid one)",
    ),
    (r"convolution window", "convolution spatial dimensions (window, stride, padding)"),
    (r"convolution groups", "grouped convolution features"),
    (r"sorted dimension", "the sorted dimension of a sort"),
    (r"scatter", "scattered-into dimensions (input-dependent positions)"),
    (r"gather", "gathered dimensions (input-dependent positions)"),
    (r"sharded unevenly|no factor divides", "a dimension split unevenly across devices"),
    (r"constant tensor", "a constant tensor (table) over the dimension"),
    (r"reduce_window|select_and_scatter|window", "a window (reduce_window, select_and_scatter)"),
    (r"regroups", "a reshape that regroups dimensions"),
    (r"positions|offset", "index arithmetic tv does not rescale (offsets, masks)"),
    (r"custom_call @(\w+)", "custom call @{0}"),
    (r"(\S+) \(no shape rule\)", "no shape rule for {0}"),
]


def root_cause(failed, kept: list[dict], reduced_elements: int) -> str:
    if failed:
        return f"shape reduction failed: {_one_line(failed, 80)}"
    for c in kept:
        for pattern, label in ROOT_CAUSES:
            m = re.search(pattern, c["kept"])
            if m:
                return label.format(*m.groups())
    if kept:
        return re.sub(r" at \S+.*", "", kept[0]["kept"])
    return f"every dimension reduced ({reduced_elements} elements left)"


# what a reason says, most specific first (one line each in the table)
REASON_CLASSES = [
    (r"time limit", "time limit (large tensors tv cannot shrink, sorts, windows)"),
    (r"memory limit", "memory limit (large tensors tv cannot shrink)"),
    (r"after_all|infeed|outfeed|stablehlo\.rng|custom_call @(?!SPMD)", "opaque op: {op}"),
    (
        r"manual instance|manual boundary|partially manual|not manual|manual\b.*at the boundary",
        "manual values the whole-instance reading does not cover",
    ),
    (r"loop predicate diverges across devices", "a loop whose trip count differs by device"),
    (r"depends on the inputs", "input-dependent index or branch with collectives"),
    (r"needs SPMD execution", "collective in the pre-partition module"),
    (r"not encodable in SMT", "not encodable in SMT (infinities)"),
    (r"z3: timeout", "solver timeout"),
    (r"more than tv handles in one tensor", "a tensor over 2^31 elements"),
    (r"has no layout", "a result without a layout"),
    (r"not commutative|not associative", "order-dependent reduction (non-commutative body)"),
    (r"XLA crashed", "XLA crashed on CPU"),
    (r"No registered implementation for untyped custom call", "custom call unknown to XLA:CPU"),
    (r"RET_CHECK|INTERNAL|UNIMPLEMENTED|INVALID_ARGUMENT", "XLA:CPU rejects it"),
    (r"error expected by the test", "the test expects a partitioner error"),
]
OPAQUE = "opaque op"


def reason_class(r: dict) -> str:
    """The kind of reason, for the table."""
    reason = r.get("reason", "")
    if r["outcome"] == "refuted":
        confirmed = r.get("xla_confirms")
        return {True: "confirmed by XLA", False: "NOT confirmed by XLA"}.get(
            confirmed, "replay failed"
        )
    for pattern, label in REASON_CLASSES:
        m = re.search(pattern, reason)
        if m:
            op = re.search(r"(after_all|infeed|outfeed|rng|custom_call @\w+)", reason)
            return label.format(op=op.group(1) if op else "?")
    return re.sub(r"\d+", "N", reason)[:110]


def table(results: list[dict]) -> str:
    by = defaultdict(list)
    for r in results:
        by[r["outcome"]].append(r)
    lines = [f"{len(results)} modules"]
    lines.append(f"{'outcome':<18} {'count':>5} {'xla s (sum)':>11} {'tv s (sum)':>10}")
    for outcome in OUTCOMES:
        rs = by.get(outcome, [])
        if not rs:
            continue
        xla = sum(r.get("xla_seconds", 0) for r in rs)
        tv = sum(r.get("tv_seconds", 0) for r in rs)
        lines.append(f"{outcome:<18} {len(rs):>5} {xla:>11.1f} {tv:>10.1f}")
        if outcome != "proved":
            for reason, k in Counter(reason_class(r) for r in rs).most_common():
                lines.append(f"    {k:>4}  {reason}")
    partitioned = [r for r in results if r["outcome"] != "not_partitionable"]
    excluded = [
        r
        for r in partitioned
        if reason_class(r).startswith(OPAQUE)
        or (r["outcome"] == "refuted" and r.get("xla_confirms"))
    ]
    proved = [r for r in results if r["outcome"] == "proved"]
    target = len(partitioned) - len(excluded)
    lines.append(
        f"proved {len(proved)} of {target} partitionable modules with a meaning to verify "
        f"({100 * len(proved) / max(target, 1):.0f}%; {len(excluded)} opaque or miscompiled "
        "set apart)"
    )
    if proved:
        tvs = sorted(r["tv_seconds"] for r in proved)
        lines.append(
            f"proved: tv median {tvs[len(tvs) // 2]:.2f} s, max {tvs[-1]:.1f} s; "
            f"XLA compile median {sorted(r['xla_seconds'] for r in proved)[len(tvs) // 2]:.3f} s"
        )
    refuted = [r for r in results if r["outcome"] == "refuted"]
    for r in refuted:
        lines.append(f"refuted {r['name']}: {r['reason']} (XLA confirms: {r.get('xla_confirms')})")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="modules checked at once (default 2)")
    ap.add_argument("--json", action="store_true", help="one JSON object per module")
    ap.add_argument("--only", nargs="*", help="these modules only")
    ap.add_argument("--time-limit", type=float, default=TIME_LIMIT, help="tv seconds per module")
    ap.add_argument("--memory-limit", type=float, default=MEMORY_LIMIT, help="tv MB per module")
    ap.add_argument(
        "--rss-limit", type=float, default=RSS_LIMIT, help="MB resident per child, then killed"
    )
    ap.add_argument("--out", help="also append each module's JSON object to this file")
    ap.add_argument(
        "--why", help="a results file: what shape reduction keeps in its limit-bound modules"
    )
    ap.add_argument(
        "--form", choices=FORMS, default="pair", help="how the partitioning is handed to tv"
    )
    ap.add_argument("--compare", nargs="+", help="results files of different forms: differences")
    ap.add_argument(
        "--table",
        nargs="+",
        help="print the table of these results files (a module in a later file replaces it "
        "in an earlier one: a rerun of some modules) and stop",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--why-worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker and a.why_worker:
        print(json.dumps(why_worker(a.worker)), flush=True)
        return
    if a.worker:
        print(json.dumps(worker(a.worker, a.time_limit, a.memory_limit, a.form)), flush=True)
        return
    if a.compare:
        print(compare_forms(a.compare))
        return
    if a.table:
        print(table(merged_results(a.table)))
        return
    from xla_spmd_corpus import CORPUS, cases

    todo = [c for c in cases() if not a.only or c.name in a.only]
    if a.why:
        bound = {
            r["name"]
            for r in map(json.loads, Path(a.why).read_text().splitlines())
            if r["outcome"] == "unknown" and re.search(r"(time|memory) limit", r["reason"])
        }
        todo = [c for c in todo if c.name in bound]
    if not todo:
        sys.exit(f"no corpus modules at {CORPUS} (set TV_XLA_SPMD_CORPUS)")
    results = []
    out = open(a.out, "a") if a.out else None

    def one(case):
        if not case.num_devices:
            return {"name": case.name, "outcome": "not_partitionable", "reason": "no device count"}
        return run_child(case.name, case.num_devices, a)

    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        for future in as_completed([pool.submit(one, c) for c in todo]):
            r = future.result()
            results.append(r)
            line = json.dumps(r)
            if out:
                out.write(line + "\n")
                out.flush()
            if a.json:
                print(line, flush=True)
            else:
                print(f"{r['name']}: {r['outcome']} {r.get('reason', '')}"[:200], file=sys.stderr)
    if a.why:
        print(why_table(results))
    elif not a.json:
        print(table(results))


def why_table(results: list[dict]) -> str:
    """Limit-bound modules by what shape reduction keeps (the largest kept class's reason)."""
    by = defaultdict(list)
    for r in results:
        by[r.get("cause") or f"not analysed: {r.get('reason', '?')[:60]}"].append(r["name"])
    lines = [f"{len(results)} modules that reached the time or memory limit, by root cause"]
    for cause, names in sorted(by.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"{len(names):>4}  {cause}: {', '.join(sorted(names))}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
