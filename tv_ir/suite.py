"""Regression suites: many (spec, impl) pairs checked at once, in parallel, cached by content.

A suite is a directory of pairs (`NAME.spec.EXT` beside `NAME.impl.EXT`, EXT one of .mlir,
.mlirbc, .hlo) or a manifest (JSON list, `{"pairs": [...]}`, or JSON Lines) whose entries are

    {"name": ..., "spec": FILE, "impl": FILE}            # tv check SPEC IMPL
    {"name": ..., "partition": FILE}                      # tv partition FILE
    optional: "num_partitions", "in_shardings", "out_shardings" (as for tv check),
              "expect": "equivalent" | "not_equivalent" | "unknown"  (default equivalent)

with paths relative to the manifest. Each pair is checked as `tv check`/`tv partition` would
check it; a pair passes when its verdict is the expected one. Results are cached under a key
made of the files' bytes, the options and tv's own code, so a rerun checks only what changed.
"""

from __future__ import annotations

import concurrent.futures as futures
import hashlib
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from xml.etree import ElementTree

from tv_ir.report.result import EQUIVALENT, NOT_EQUIVALENT, UNKNOWN

from .errors import BadInput, TvError, one_line

BAD_INPUT = "bad_input"
ERROR = "error"  # a bug in tv, or a worker that died
VERDICTS = (EQUIVALENT, NOT_EQUIVALENT, UNKNOWN, BAD_INPUT, ERROR)
# which failed pair decides the suite's exit code: a refutation first (CI's main signal)
_EXIT_ORDER = ((NOT_EQUIVALENT, 1), (ERROR, 4), (BAD_INPUT, 3), (UNKNOWN, 2), (EQUIVALENT, 1))
PROGRAM_SUFFIXES = (".mlir", ".mlirbc", ".hlo")
MANIFEST_SUFFIXES = (".json", ".jsonl")


@dataclass(frozen=True)
class Pair:
    """One entry of a suite."""

    name: str
    spec: str | None = None
    impl: str | None = None
    partition: str | None = None
    num_partitions: int | None = None
    in_shardings: tuple | None = None
    out_shardings: tuple | None = None
    expect: str = EQUIVALENT

    def files(self) -> list[str]:
        return [f for f in (self.spec, self.impl, self.partition) if f is not None]


@dataclass(frozen=True)
class SuiteOptions:
    """The `tv check` options every pair is checked with (part of the cache key)."""

    timeout: float = 10.0
    time_limit: float | None = 300.0
    memory_limit: float | None = None
    seed: int = 0
    reduce_shapes: bool = True


@dataclass
class PairResult:
    """A pair's outcome: its verdict, a one-line detail, and the full report as a dict."""

    name: str
    verdict: str
    expect: str = EQUIVALENT
    detail: str = ""
    seconds: float = 0.0
    cached: bool = False
    report: dict | None = field(default=None, repr=False)

    @property
    def passed(self) -> bool:
        return self.verdict == self.expect


# --- reading a suite ---------------------------------------------------------------------


def read_suite(path: str | os.PathLike) -> list[Pair]:
    """The pairs of a suite directory or manifest file (BadInput when it is neither)."""
    p = Path(path)
    if p.is_dir():
        pairs = _directory_pairs(p)
    elif p.is_file() and p.suffix in MANIFEST_SUFFIXES:
        pairs = _manifest_pairs(p)
    elif p.exists():
        raise BadInput(f"{path}: a suite is a directory of pairs or a .json/.jsonl manifest")
    else:
        raise BadInput(f"{path}: no such file or directory")
    if not pairs:
        raise BadInput(f"{path}: no pairs found (NAME.spec.mlir beside NAME.impl.mlir)")
    names = [q.name for q in pairs]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise BadInput(f"{path}: two pairs are named {dup!r}")
    return pairs


def _directory_pairs(root: Path) -> list[Pair]:
    pairs = []
    for spec in sorted(root.rglob("*.spec.*")):
        if spec.suffix not in PROGRAM_SUFFIXES:
            continue
        stem = spec.name[: -len(".spec" + spec.suffix)]
        impls = [spec.with_name(f"{stem}.impl{s}") for s in PROGRAM_SUFFIXES]
        impl = next((i for i in impls if i.exists()), None)
        if impl is None:
            raise BadInput(f"{spec}: no {stem}.impl.mlir (or .mlirbc, .hlo) beside it")
        name = str(spec.parent.relative_to(root) / stem)
        pairs.append(Pair(name.removeprefix("./"), str(spec), str(impl)))
    return pairs


def _manifest_pairs(path: Path) -> list[Pair]:
    text = path.read_text()
    try:
        if path.suffix == ".jsonl":
            entries = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            entries = json.loads(text)
            if isinstance(entries, dict):
                entries = entries.get("pairs")
    except json.JSONDecodeError as e:
        raise BadInput(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(entries, list):
        raise BadInput(f"{path}: a manifest is a list of pairs (or {{'pairs': [...]}})")
    return [_entry(path, i, e) for i, e in enumerate(entries)]


_KEYS = {
    "name",
    "spec",
    "impl",
    "partition",
    "num_partitions",
    "in_shardings",
    "out_shardings",
    "expect",
}


def _entry(manifest: Path, i: int, e) -> Pair:
    where = f"{manifest}: entry {i}"
    if not isinstance(e, dict):
        raise BadInput(f"{where}: not an object")
    unknown = sorted(set(e) - _KEYS)
    if unknown:
        raise BadInput(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})")
    if ("partition" in e) == ("spec" in e or "impl" in e):
        raise BadInput(f"{where}: give either 'spec' and 'impl', or 'partition'")
    if "partition" not in e and not ("spec" in e and "impl" in e):
        raise BadInput(f"{where}: 'spec' and 'impl' go together")
    expect = e.get("expect", EQUIVALENT)
    if expect not in (EQUIVALENT, NOT_EQUIVALENT, UNKNOWN):
        raise BadInput(f"{where}: expect must be equivalent, not_equivalent or unknown")

    def file(key):
        if key not in e:
            return None
        f = manifest.parent / str(e[key])
        if not f.is_file():
            raise BadInput(f"{where}: {key} file {f} does not exist")
        return str(f)

    def shardings(key):
        v = e.get(key)
        if v is None:
            return None
        if not isinstance(v, list) or not all(s is None or isinstance(s, str) for s in v):
            raise BadInput(f"{where}: {key} is a list of mhlo.sharding strings")
        return tuple(v)

    n = e.get("num_partitions")
    if n is not None and (not isinstance(n, int) or n < 1):
        raise BadInput(f"{where}: num_partitions must be a positive integer")
    name = e.get("name") or Path(e.get("impl") or e.get("partition")).stem
    return Pair(
        str(name),
        file("spec"),
        file("impl"),
        file("partition"),
        n,
        shardings("in_shardings"),
        shardings("out_shardings"),
        expect,
    )


# --- the cache ---------------------------------------------------------------------------


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "tv" / "suite"


def _tv_fingerprint() -> str:
    """A hash of tv's own code and jaxlib's version: a change to either invalidates results."""
    import jaxlib

    import tv_ir

    h = hashlib.sha256(jaxlib.__version__.encode())
    roots = {Path(tv_ir.__file__).parent}
    for sub in ("passes", "frontends"):
        mod = __import__(f"tv_ir.{sub}", fromlist=["__path__"])
        roots.update(Path(p) for p in mod.__path__)
    for root in sorted(roots):
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


class ResultCache:
    """Results by content hash, one JSON file each (decided and undecided verdicts alike:
    the key holds the time and memory limits; errors are never cached)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self._fingerprint = _tv_fingerprint()

    def key(self, pair: Pair, options: SuiteOptions) -> str:
        h = hashlib.sha256(self._fingerprint.encode())
        settings = asdict(pair) | {"options": asdict(options)}
        for k in ("name", "spec", "impl", "partition"):
            settings.pop(k)
        h.update(json.dumps(settings, sort_keys=True).encode())
        for role, f in (("spec", pair.spec), ("impl", pair.impl), ("partition", pair.partition)):
            if f is not None:
                h.update(role.encode())
                h.update(hashlib.sha256(Path(f).read_bytes()).digest())
        return h.hexdigest()

    def get(self, key: str) -> dict | None:
        f = self.directory / key[:2] / f"{key}.json"
        try:
            return json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            return None

    def put(self, key: str, record: dict) -> None:
        f = self.directory / key[:2] / f"{key}.json"
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(f)


# --- checking pairs ----------------------------------------------------------------------


def check_pair(pair: Pair, options: SuiteOptions) -> PairResult:
    """Check one pair in this process, as `tv check` / `tv partition` would."""
    from tv_ir.prover.boundary_layouts import GivenLayouts

    from .pipeline import check, partition_and_check

    t0 = time.perf_counter()
    try:
        if pair.partition is not None:
            report = partition_and_check(
                pair.partition,
                options.timeout,
                options.seed,
                None,
                options.time_limit,
                memory_limit=options.memory_limit,
                reduce_shapes=options.reduce_shapes,
            )
        else:
            given = GivenLayouts(
                pair.num_partitions,
                list(pair.in_shardings) if pair.in_shardings is not None else None,
                list(pair.out_shardings) if pair.out_shardings is not None else None,
            )
            report = check(
                pair.spec,
                pair.impl,
                timeout=options.timeout,
                seed=options.seed,
                time_limit=options.time_limit,
                memory_limit=options.memory_limit,
                reduce_shapes=options.reduce_shapes,
                layouts=given if given.any else None,
            )
    except BadInput as e:
        return _result(pair, BAD_INPUT, one_line(e, 300), t0)
    except TvError as e:
        verdict = BAD_INPUT if e.exit_code == 3 else UNKNOWN if e.exit_code == 2 else ERROR
        return _result(pair, verdict, one_line(e, 300), t0)
    except Exception as e:  # a bug in tv: an error, never a verdict
        return _result(pair, ERROR, f"internal error: {type(e).__name__}: {one_line(e, 300)}", t0)
    return _result(pair, report.verdict, _detail(report), t0, json.loads(report.to_json()))


def _result(pair, verdict, detail, t0, report=None) -> PairResult:
    return PairResult(
        pair.name, verdict, pair.expect, detail, time.perf_counter() - t0, report=report
    )


def _detail(report) -> str:
    if report.verdict == NOT_EQUIVALENT and report.location and report.location.impl:
        ce = report.counterexample
        how = "hangs" if ce is not None and ce.hang is not None else "differs"
        return f"{how} at impl {report.location.impl}"
    return report.reason


def _worker_init() -> None:
    from tv_ir.xla.partitioner import ensure_host_devices

    ensure_host_devices()


def run_suite(
    pairs: list[Pair],
    options: SuiteOptions = SuiteOptions(),
    workers: int | None = None,
    cache: ResultCache | None = None,
    on_result: Callable[[PairResult], None] | None = None,
) -> list[PairResult]:
    """Check every pair (`workers` processes; default all cores), reusing cached results.
    Results come back in the suite's order; `on_result` sees each as it finishes."""
    workers = workers or os.cpu_count() or 1
    results: dict[str, PairResult] = {}
    keys: dict[str, str] = {}

    def done(result: PairResult) -> None:
        results[result.name] = result
        if cache is not None and not result.cached and result.verdict != ERROR:
            cache.put(keys[result.name], _record(result))
        if on_result is not None:
            on_result(result)

    todo = []
    for pair in pairs:
        if cache is not None:
            keys[pair.name] = cache.key(pair, options)
            hit = cache.get(keys[pair.name])
            if hit is not None:
                done(_from_record(hit, pair))
                continue
        todo.append(pair)
    if workers == 1:
        for pair in todo:
            done(check_pair(pair, options))
    else:
        for result in _in_workers(todo, options, workers):
            done(result)
    return [results[p.name] for p in pairs]


def _in_workers(pairs: list[Pair], options: SuiteOptions, workers: int) -> Iterator[PairResult]:
    """Check pairs in a pool of processes, a fresh one for each pair. When a worker dies
    (the OS killed it, say for memory), the pairs in flight are checked again one at a time,
    so only the one that kills its worker is reported as an error."""
    context = multiprocessing.get_context("spawn")  # jax is not fork-safe
    suspects: list[Pair] = []
    # one process per pair: a pair's memory (numpy does not give it back) never counts
    # against the next pair's memory limit
    with futures.ProcessPoolExecutor(
        workers, context, initializer=_worker_init, max_tasks_per_child=1
    ) as pool:
        running = {pool.submit(_check_in_pool, p, options): p for p in pairs}
        for f in futures.as_completed(running):
            try:
                yield f.result()
            except futures.process.BrokenProcessPool:
                suspects.append(running[f])
    for pair in suspects:
        with futures.ProcessPoolExecutor(1, context, initializer=_worker_init) as alone:
            try:
                yield alone.submit(_check_in_pool, pair, options).result()
            except futures.process.BrokenProcessPool:
                yield PairResult(
                    pair.name, ERROR, pair.expect, "the worker process died (out of memory?)"
                )


def _check_in_pool(pair: Pair, options: SuiteOptions) -> PairResult:
    """A pair checked by one of several suite workers: with one process of its own (the
    cores are the suite's workers')."""
    from .prover.workers import use_workers

    with use_workers(1):
        return check_pair(pair, options)


def _record(result: PairResult) -> dict:
    return {k: v for k, v in asdict(result).items() if k not in ("name", "expect", "cached")}


def _from_record(record: dict, pair: Pair) -> PairResult:
    return PairResult(pair.name, expect=pair.expect, cached=True, **record)


# --- what a suite run says ---------------------------------------------------------------


def exit_code(results: list[PairResult]) -> int:
    """0 when every pair got its expected verdict; else the code of the worst surprise."""
    failed = {r.verdict for r in results if not r.passed}
    return next((code for verdict, code in _EXIT_ORDER if verdict in failed), 0)


def result_line(r: PairResult) -> str:
    mark = "ok  " if r.passed else "FAIL"
    expected = "" if r.expect == EQUIVALENT else f" (expected {r.expect})"
    cached = " cached" if r.cached else ""
    detail = f": {r.detail}" if r.detail and r.verdict != EQUIVALENT else ""
    return f"{mark} {r.verdict:<14} {r.seconds:7.2f} s{cached:<7} {r.name}{expected}{detail}"


def summary(results: list[PairResult], wall_seconds: float) -> str:
    """A table: pairs per verdict, how many as expected, and how many came from the cache."""
    rows = ["verdict         pairs  as expected", "-------------- ------ ------------"]
    for v in VERDICTS:
        n = sum(r.verdict == v for r in results)
        if n:
            ok = sum(r.verdict == v and r.passed for r in results)
            rows.append(f"{v:<14} {n:>6} {ok:>12}")
    passed = sum(r.passed for r in results)
    cached = sum(r.cached for r in results)
    rows.append(
        f"{len(results)} pairs, {passed} as expected, {cached} from the cache, {wall_seconds:.1f} s"
    )
    return "\n".join(rows)


def write_jsonl(results: list[PairResult], path: str | os.PathLike) -> None:
    with open(path, "w") as f:
        for r in results:
            f.write(json.dumps(asdict(r) | {"passed": r.passed}) + "\n")


def write_junit(results: list[PairResult], path: str | os.PathLike, suite: str = "tv") -> None:
    """JUnit XML: an unexpected refutation is a <failure>; any other unexpected verdict
    (unknown, bad input, error) is an <error>, so CI never reads it as a pass."""
    failures = sum(not r.passed and r.verdict == NOT_EQUIVALENT for r in results)
    errors = sum(not r.passed and r.verdict != NOT_EQUIVALENT for r in results)
    root = ElementTree.Element(
        "testsuite",
        name=suite,
        tests=str(len(results)),
        failures=str(failures),
        errors=str(errors),
        time=f"{sum(r.seconds for r in results):.3f}",
    )
    for r in results:
        case = ElementTree.SubElement(
            root, "testcase", classname=suite, name=r.name, time=f"{r.seconds:.3f}"
        )
        if not r.passed:
            kind = "failure" if r.verdict == NOT_EQUIVALENT else "error"
            message = f"{r.verdict} (expected {r.expect})" + (f": {r.detail}" if r.detail else "")
            ElementTree.SubElement(case, kind, message=message, type=r.verdict).text = message
        out = ElementTree.SubElement(case, "system-out")
        out.text = f"verdict: {r.verdict}{' (cached)' if r.cached else ''}"
    ElementTree.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
