"""The `tv` command: `tv check SPEC IMPL`, `tv check SUITE`, `tv partition [--shardy P] MODULE`,
`tv passes DUMP_DIR|MODULE`, `tv demo`.

Exit codes: 0 equivalent, 1 not equivalent, 2 unknown or unsupported (never 0 without a
proof), 3 bad input (one line on stderr, no traceback), 4 internal error (a bug in tv).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from importlib import resources

from tv_ir.report.result import EXIT_CODES

from .errors import BadInput, TvError, one_line

EXIT_BAD_INPUT = 3
EXIT_INTERNAL_ERROR = 4
EXIT_HELP = """exit codes:
  0  equivalent: proved for all real inputs
  1  not_equivalent: a counterexample was found and replayed
  2  unknown: not decided (unsupported op, solver timeout, time limit); never a pass
  3  bad input: unreadable file, malformed IR, mismatched signatures (one line on stderr)
  4  internal error: a bug in tv (one line on stderr; TV_DEBUG=1 for a traceback)
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # usage mistakes are bad input: exit 3, one line
        self.print_usage(sys.stderr)
        print(f"tv: error: {message}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="tv",
        description="Prove a StableHLO program equal to its specification.",
        epilog=EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    c = sub.add_parser(
        "check",
        help="prove IMPL equal to SPEC, or show where they differ",
        epilog=EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument(
        "spec",
        help="specification: .mlir (StableHLO text), .mlirbc or .hlo (HLO text); alone, a "
        "suite: a directory of NAME.spec.mlir / NAME.impl.mlir pairs or a .json/.jsonl "
        "manifest (docs/regression.md)",
    )
    c.add_argument("impl", nargs="?", help="implementation, in any of the same forms")
    c.add_argument(
        "--num-partitions",
        type=int,
        metavar="N",
        help="devices a per-device IMPL runs on, when it has no mhlo.num_partitions",
    )
    for flag, what in (("--in-shardings", "arguments"), ("--out-shardings", "results")):
        c.add_argument(
            flag,
            metavar="JSON",
            help=f"a JSON list of mhlo.sharding strings for a per-device IMPL's {what}, used "
            "where neither IMPL nor a pre-partition SPEC says (null: no sharding given)",
        )
    _common(c)
    _workers_flag(
        c,
        "processes: for SPEC IMPL, the check's independent obligations (the same report as "
        "one worker; default: the idle cores once the obligations have taken a second, or "
        "$TV_WORKERS); for a SUITE, pairs checked at once, each in its own process (default: "
        "all cores)",
    )
    s = c.add_argument_group("suites (tv check SUITE)")
    s.add_argument("--junit", metavar="FILE", help="write JUnit XML for CI")
    s.add_argument("--jsonl", metavar="FILE", help="write one JSON object per pair")
    s.add_argument(
        "--cache",
        metavar="DIR",
        help="where results are kept by content hash (default: ~/.cache/tv/suite)",
    )
    s.add_argument("--no-cache", action="store_true", help="check every pair again")
    pt = sub.add_parser(
        "partition",
        help="partition an annotated module (XLA's SPMD partitioner, or Shardy's passes) and "
        "verify the per-device program against the module's own meaning",
        epilog=EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pt.add_argument("module", help="pre-partition StableHLO text with sdy/mhlo shardings")
    pt.add_argument(
        "--shardy",
        choices=["partitioner", "global-to-local", "gather-scatter-batching"],
        metavar="PIPELINE",
        help="partition with Shardy's passes (jaxlib) instead of XLA: partitioner, "
        "global-to-local (explicit sdy collectives only) or gather-scatter-batching",
    )
    pt.add_argument(
        "--no-halo-exchange",
        action="store_true",
        help="with --shardy partitioner: resolve permutation factors without halo exchange",
    )
    pt.add_argument("--function", metavar="NAME", help="with --shardy: the function to check")
    pt.add_argument(
        "--spec",
        metavar="FILE[@FUNCTION]",
        help="with --shardy: compare against this reference (default: the function's own "
        "global meaning)",
    )
    _common(pt)
    _workers_flag(
        pt,
        "processes for the check's independent obligations (the same report as one worker; "
        "default: the idle cores once the obligations have taken a second, or $TV_WORKERS)",
    )
    ps = sub.add_parser(
        "passes",
        help="prove each pass of an XLA compilation preserves the program's meaning and name "
        "the first that does not (XLA's per-pass dumps, or a module tv compiles)",
        epilog=EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ps.add_argument(
        "source",
        help="a directory of XLA dumps (--xla_dump_to=DIR --xla_dump_hlo_pass_re=.*), or a "
        "module (.mlir with shardings, or .hlo) that tv compiles with XLA for CPU, dumping "
        "every pass",
    )
    ps.add_argument("--module", metavar="NAME", help="which module of a dump directory")
    ps.add_argument(
        "--num-partitions",
        type=int,
        metavar="N",
        help="devices to compile a module for (default: its mhlo.num_partitions)",
    )
    ps.add_argument(
        "--out-shardings",
        metavar="JSON",
        help="the results' mhlo.sharding strings after partitioning, when neither the dumps "
        "nor XLA say (default: {replicated} for a result of the global shape)",
    )
    ps.add_argument(
        "--keep-going", action="store_true", help="check every pass, past the first refuted"
    )
    ps.add_argument("--dump-to", metavar="DIR", help="with a module: keep XLA's dumps in DIR")
    ps.add_argument(
        "--no-propagation",
        action="store_true",
        help="with a module: no sharding propagation, as XLA's partitioner unit tests run "
        "(an instruction without a sharding is replicated)",
    )
    _common(ps)
    d = sub.add_parser("demo", help="check the bundled transformer-block examples")
    _common(d)
    return p


def _workers_flag(p, what: str) -> None:
    p.add_argument("--workers", metavar="N", help=what)


def _workers(args) -> int | None:
    """--workers as a count (None: not given); bad input (exit 3) unless a whole number >= 1."""
    from .prover.workers import validate

    return validate(getattr(args, "workers", None), "--workers")


def _common(p):
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="solver budget per query, in seconds of solver work (z3 resource units; default 10)",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="S",
        help="seconds for the whole run (import, simulation, proof); when they run out the "
        "verdict is unknown (default: no limit)",
    )
    p.add_argument(
        "--memory-limit",
        type=float,
        default=None,
        metavar="MB",
        help="megabytes of resident memory the run may add to the process; over it the verdict "
        "is unknown, naming the op being proved (default: 85%% of the memory available when "
        "the run starts)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for simulation inputs")
    p.add_argument(
        "--no-reduce",
        action="store_true",
        help="check at the programs' real sizes (default: prove at reduced shapes where every "
        "op allows it; see docs/equivalence.md, Shape reduction)",
    )
    p.add_argument(
        "--whole-mesh",
        action="store_true",
        help="simulate every device of the mesh (default: prove a shard_map program, or XLA's "
        "partitioning of a jit, on a smaller mesh where its structure allows; see "
        "docs/equivalence.md, Mesh reduction)",
    )


def _progress(enabled: bool):
    if not enabled:
        return None

    def show(msg: str) -> None:
        print(f"\r\033[Ktv: {msg}", end="", file=sys.stderr, flush=True)

    return show


def _print(report, args, progress) -> int:
    """The report (text or JSON) after clearing the progress line; its exit code."""
    if progress:
        print("\r\033[K", end="", file=sys.stderr)
    print(report.to_json() if args.json else str(report))
    return EXIT_CODES[report.verdict]


def _given_layouts(args):
    """`--num-partitions`, `--in-shardings`, `--out-shardings` (None when absent)."""
    from tv_ir.prover.boundary_layouts import GivenLayouts

    def strings(flag, text):
        if text is None:
            return None
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise BadInput(f"{flag}: not a JSON list of sharding strings ({e.msg})") from None
        if not isinstance(value, list) or not all(v is None or isinstance(v, str) for v in value):
            raise BadInput(f"{flag}: not a JSON list of sharding strings")
        return value

    n = getattr(args, "num_partitions", None)
    if n is not None and n < 1:
        raise BadInput(f"--num-partitions must be at least 1, got {n}")
    given = GivenLayouts(
        n,
        strings("--in-shardings", getattr(args, "in_shardings", None)),
        strings("--out-shardings", getattr(args, "out_shardings", None)),
    )
    return given if given.any else None


def _run_check(spec, impl, args) -> int:
    from .pipeline import check

    layouts = _given_layouts(args)
    progress = _progress(sys.stderr.isatty() and not args.json)
    report = check(
        spec,
        impl,
        timeout=args.timeout,
        seed=args.seed,
        progress=progress,
        time_limit=args.time_limit,
        memory_limit=args.memory_limit,
        reduce_shapes=not args.no_reduce,
        layouts=layouts,
        reduce_mesh=not args.whole_mesh,
        workers=_workers(args),
    )
    return _print(report, args, progress)


SUITE_TIME_LIMIT = 300.0  # seconds per pair when a suite runs without --time-limit


def _run_suite(args) -> int:
    import time

    from . import suite

    if args.num_partitions or args.in_shardings or args.out_shardings:
        raise BadInput("in a suite, give num_partitions and shardings per pair, in the manifest")
    workers = _workers(args)
    pairs = suite.read_suite(args.spec)
    options = suite.SuiteOptions(
        timeout=args.timeout,
        time_limit=args.time_limit if args.time_limit is not None else SUITE_TIME_LIMIT,
        memory_limit=args.memory_limit,
        seed=args.seed,
        reduce_shapes=not args.no_reduce,
    )
    cache = None if args.no_cache else suite.ResultCache(args.cache or suite.default_cache_dir())

    def show(result) -> None:
        if not args.json:
            print(suite.result_line(result), flush=True)

    t0 = time.perf_counter()
    results = suite.run_suite(pairs, options, workers, cache, show)
    if args.jsonl:
        suite.write_jsonl(results, args.jsonl)
    if args.junit:
        suite.write_junit(results, args.junit)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "name": r.name,
                        "verdict": r.verdict,
                        "passed": r.passed,
                        "detail": r.detail,
                        "cached": r.cached,
                    }
                    for r in results
                ]
            )
        )
    else:
        print(suite.summary(results, time.perf_counter() - t0))
    return suite.exit_code(results)


def _run_partition(args) -> int:
    from .pipeline import partition_and_check, shardy_partition_and_check

    progress = _progress(sys.stderr.isatty() and not args.json)
    if args.shardy is None:
        if args.function or args.spec or args.no_halo_exchange:
            raise BadInput("--function, --spec and --no-halo-exchange need --shardy PIPELINE")
        report = partition_and_check(
            args.module,
            args.timeout,
            args.seed,
            progress,
            args.time_limit,
            memory_limit=args.memory_limit,
            reduce_shapes=not args.no_reduce,
            workers=_workers(args),
            reduce_mesh=not args.whole_mesh,
        )
    else:
        spec, spec_fn = (args.spec, None) if args.spec else (None, None)
        if spec and "@" in spec:
            spec, spec_fn = spec.rsplit("@", 1)
        report = shardy_partition_and_check(
            args.module,
            function=args.function,
            spec=spec,
            spec_function=spec_fn,
            pipeline=args.shardy,
            halo_exchange=not args.no_halo_exchange,
            timeout=args.timeout,
            seed=args.seed,
            progress=progress,
            time_limit=args.time_limit,
            memory_limit=args.memory_limit,
            reduce_shapes=not args.no_reduce,
            workers=_workers(args),
        )
    return _print(report, args, progress)


def _run_passes(args) -> int:
    import tempfile

    from . import pass_validation

    out_shardings = _given_layouts(args).out_shardings if args.out_shardings else None
    options = dict(
        timeout=args.timeout,
        time_limit=args.time_limit,
        memory_limit=args.memory_limit,
        seed=args.seed,
        reduce_shapes=not args.no_reduce,
    )

    def show(step) -> None:
        if not args.json:
            print(pass_validation.step_line(step), flush=True)

    source = args.source
    with tempfile.TemporaryDirectory() as scratch:
        if not os.path.isdir(source):
            if args.module:
                raise BadInput("--module picks a module of a dump directory, not of a file")
            out_shardings = out_shardings or _compile_with_dumps(args, args.dump_to or scratch)
            source = args.dump_to or scratch
        elif args.num_partitions or args.dump_to or args.no_propagation:
            raise BadInput(
                "--num-partitions, --dump-to and --no-propagation are for a module, not a dump "
                "directory"
            )
        result = pass_validation.validate_passes(
            source, args.module, args.keep_going, out_shardings, show, **options
        )
    if args.json:
        print(json.dumps(pass_validation.to_json(result), default=str))
    else:
        print(pass_validation.render(result))
    return result.exit_code


def _compile_with_dumps(args, dump_dir: str) -> list[str] | None:
    """Compile the module with XLA for CPU, dumping every pass into `dump_dir`; the output
    shardings XLA chose (None for a module without shardings)."""
    from tv_ir.ir.importer import HLO_TEXT_STARTS, read_source
    from tv_ir.xla.partitioner import hlo_to_stablehlo_text, num_partitions_of, partition

    data, name = read_source(args.source)
    if isinstance(data, bytes):
        raise BadInput(f"{name}: tv passes takes StableHLO or HLO text")
    n = args.num_partitions
    if data.lstrip().startswith(HLO_TEXT_STARTS):
        data = hlo_to_stablehlo_text(data, n or 1)
    if n is not None and n < 1:
        raise BadInput(f"--num-partitions must be at least 1, got {n}")
    os.makedirs(dump_dir, exist_ok=True)
    parted = partition(
        data, n or num_partitions_of(data), not args.no_propagation, pass_dumps=dump_dir
    )
    return parted.out_shardings if parted.num_partitions > 1 else None


def _demo(args) -> int:
    examples = resources.files("tv_ir") / "examples"
    spec = examples / "block_spec.mlir"
    worst = 0
    for impl, what in (
        ("block_fused_qkv.mlir", "an algebraic rewrite (fused q/k/v projection)"),
        ("block_bad_mask.mlir", "a planted bug (causal mask off by one)"),
    ):
        if not args.json:
            print(f"== tv check block_spec.mlir {impl}   # {what}")
        code = _run_check(str(spec), str(examples / impl), args)
        worst = max(worst, code if code != 1 else 0)
        if not args.json:
            print()
    return worst


def _partitions_asked(args) -> int:
    """The `mhlo.num_partitions` of the module `tv partition` or `tv check` is given to
    partition (1 when none is readable: XLA's partitioning then says what is missing)."""
    from tv_ir.xla.partitioner import num_partitions_of

    path = getattr(args, "module", None) if args.command == "partition" else None
    if args.command == "check":
        path = getattr(args, "impl", None)
    if not isinstance(path, str) or not path.endswith(".mlir"):
        return 1
    try:
        with open(path, encoding="utf-8") as f:
            return num_partitions_of(f.read())
    except (OSError, UnicodeDecodeError):
        return 1  # the command reports the file itself


def main(argv: list[str] | None = None) -> int:
    from tv_ir.xla.partitioner import DEFAULT_HOST_DEVICES, ensure_host_devices

    args = _parser().parse_args(argv)
    # before jax is imported: XLA gets 8 CPU devices, or as many as the module to partition
    # asks for (`tv partition` of a 4,096-device module needs no XLA_FLAGS)
    ensure_host_devices(max(DEFAULT_HOST_DEVICES, _partitions_asked(args)))
    if args.command is None:
        _parser().print_help(sys.stderr)
        return EXIT_BAD_INPUT
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "partition":
            return _run_partition(args)
        if args.command == "passes":
            return _run_passes(args)
        if args.impl is None:
            return _run_suite(args)
        if args.junit or args.jsonl or args.cache or args.no_cache:
            raise BadInput("--junit, --jsonl and --cache are for suites: tv check SUITE")
        return _run_check(args.spec, args.impl, args)
    except BadInput as e:
        print(f"tv: error: {one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("tv: interrupted", file=sys.stderr)
        return 2
    except TvError as e:
        if e.exit_code == EXIT_INTERNAL_ERROR:
            return _internal_error(e, args, f"{one_line(e)}")
        print(f"tv: unknown: {one_line(e)}", file=sys.stderr)
        if args.json:
            print(json.dumps({"verdict": "unknown", "reason": one_line(e)}))
        return e.exit_code
    except Exception as e:  # a bug in tv: never a verdict, never exit 0
        return _internal_error(e, args, f"{type(e).__name__}: {one_line(e)}")


def _internal_error(e: BaseException, args, msg: str) -> int:
    """A bug in tv: exit 4 (never a verdict); `--json` prints `"verdict": "error"`."""
    if os.environ.get("TV_DEBUG"):
        traceback.print_exception(e)
    print(f"tv: internal error: {msg} (set TV_DEBUG=1 for a traceback)", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"verdict": "error", "internal_error": True, "message": msg}))
    return EXIT_INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
