"""Robustness: inputs that used to crash tv end in a verdict or one clear line (exit 3), and
tv's own bugs are told apart from verdicts (exit 4)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from xla_oracle import run_xla

import tv_ir
from tv_ir.semantics.interpreters.interp import evaluate


def tv(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tv_ir.cli", *args], capture_output=True, text=True, cwd=cwd
    )


def one_line_error(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


ADD = """func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = stablehlo.add %a, %a : tensor<2xf32>
  return %0 : tensor<2xf32>
}
"""

# -- 1. non-splat bf16 / f8 constants ------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float8_e4m3fn, jnp.float8_e5m2])
def test_non_splat_small_float_constants_import_with_exact_values(dtype) -> None:
    table = np.array([0.1, 1.5, -2.0, 3.3], np.float32)

    def spec(x):
        return x * jnp.asarray(table, dtype).astype(jnp.float32)

    def rewrite(x):  # the same constant, multiplied on the other side, in two steps
        c = jnp.asarray(table, dtype).astype(jnp.float32)
        return (c * x * 2.0) / 2.0

    x = np.array([1.0, -2.0, 0.5, 4.0], np.float32)
    spec_text = jax.jit(spec).lower(x).as_text(debug_info=True)
    assert "dense<[" in spec_text  # a non-splat constant of the small type
    r = tv_ir.check(spec_text, jax.jit(rewrite).lower(x).as_text(debug_info=True))
    assert r.verdict == "equivalent", str(r)
    # the constant's value is the exact value of its bits, as XLA reads it
    (ours,) = evaluate(tv_ir.load(spec_text), [x.astype(np.float64)])
    (xla,) = run_xla(spec_text, [x])
    np.testing.assert_array_equal(ours, np.asarray(xla, np.float64))
    exact = table.astype(dtype).astype(np.float64)
    np.testing.assert_array_equal(ours, x.astype(np.float64) * exact)


# -- 2. deep programs ----------------------------------------------------------------------------


def nested_ifs(depth: int, leaf: str) -> str:
    """`depth` nested `stablehlo.if`s on a constant predicate around one op."""
    head = [
        "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {",
        "  %t = stablehlo.constant dense<true> : tensor<i1>",
        "  %c = stablehlo.constant dense<2.0> : tensor<4xf32>",
    ]
    opening, closing = [], []
    for d in range(depth):
        ind = "  " * (d + 1)
        opening.append(f'{ind}%r{d} = "stablehlo.if"(%t) ({{')
        closing.append(
            f"{ind}  stablehlo.return %r{d + 1} : tensor<4xf32>\n"
            f"{ind}}}, {{\n{ind}  stablehlo.return %x : tensor<4xf32>\n"
            f"{ind}}}) : (tensor<i1>) -> tensor<4xf32>"
        )
    leaf_line = f"{'  ' * (depth + 1)}%r{depth} = {leaf} : tensor<4xf32>"
    tail = ["  return %r0 : tensor<4xf32>", "}"]
    return "\n".join(head + opening + [leaf_line] + closing[::-1] + tail) + "\n"


def test_200_nested_ifs_are_proved() -> None:
    spec = nested_ifs(200, "stablehlo.multiply %x, %c")
    impl = nested_ifs(200, "stablehlo.add %x, %x")
    r = tv_ir.check(spec, impl)
    assert r.verdict == "equivalent", str(r)


def test_too_deep_is_unknown_not_a_recursion_error(monkeypatch) -> None:
    import tv_ir.limits

    monkeypatch.setattr(tv_ir.limits, "RECURSION_LIMIT", 2_000)
    spec = nested_ifs(1_000, "stablehlo.multiply %x, %c")
    r = tv_ir.check(spec, spec)
    assert r.verdict == "unknown", str(r)
    assert "nests too deeply" in r.reason


def test_200_nested_conds_from_jax_end_in_a_verdict(tmp_path: Path) -> None:
    """jax's nested `lax.cond`s on an input: unsupported (data-dependent branch), but a
    verdict with a reason, not a RecursionError."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # jax itself recurses to trace 200 nested conds
    try:

        def nest(k, y):
            if k == 0:
                return y + 1.0
            return jax.lax.cond(y[0] > 0, lambda z: nest(k - 1, z) * 1.0, lambda z: z - 1.0, y)

        text = jax.jit(lambda a: nest(200, a)).lower(np.ones(2, np.float32)).as_text()
    finally:
        sys.setrecursionlimit(limit)
    (tmp_path / "deep.mlir").write_text(text)
    r = tv("check", "deep.mlir", "deep.mlir", "--json", cwd=tmp_path)
    assert r.returncode in (0, 2), r.stderr
    report = json.loads(r.stdout)
    assert "Recursion" not in r.stderr + report.get("reason", "")


def test_5000_trip_loop_is_a_verdict() -> None:
    x = np.ones(2, np.float32)

    def spec(a):
        return jax.lax.fori_loop(0, 5000, lambda i, y: y * 0.5 + 1.0, a)

    def impl(a):
        return jax.lax.fori_loop(0, 5000, lambda i, y: (y + 2.0) * 0.5, a)

    r = tv_ir.check(jax.jit(spec).lower(x).as_text(), jax.jit(impl).lower(x).as_text())
    assert r.verdict in ("equivalent", "unknown"), str(r)
    assert "ecursion" not in r.reason


# -- 3. the time limit covers the whole run -------------------------------------------------------


def slow_loop() -> str:
    """100,000 trips of a small matmul: slow to simulate, let alone to prove."""
    x = np.ones((16, 16), np.float32)

    def f(a):
        return jax.lax.fori_loop(0, 100_000, lambda i, y: jnp.tanh(y @ a) * 0.5 + a, a)

    return jax.jit(f).lower(x).as_text()


def test_time_limit_covers_simulation() -> None:
    import time

    text = slow_loop()
    t0 = time.perf_counter()
    r = tv_ir.check(text, text, time_limit=2.0)
    elapsed = time.perf_counter() - t0
    assert r.verdict == "unknown", str(r)
    assert "time limit of 2 s reached" in r.reason
    assert elapsed < 60  # without the limit this runs for many minutes


def test_time_limit_covers_import() -> None:
    r = tv_ir.check(ADD, ADD, time_limit=1e-4)
    assert r.verdict == "unknown", str(r)
    assert "time limit of 0.0001 s reached" in r.reason


def test_time_limit_on_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "slow.mlir").write_text(slow_loop())
    r = tv("check", "slow.mlir", "slow.mlir", "--time-limit", "2", "--json", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "time limit of 2 s reached" in json.loads(r.stdout)["reason"]


# -- 4. oversized programs are refused up front --------------------------------------------------

HUGE_ARG = """func.func @main(%a: tensor<1000000x1000000xf32>) -> tensor<1000000x1000000xf32> {
  %0 = stablehlo.add %a, %a : tensor<1000000x1000000xf32>
  return %0 : tensor<1000000x1000000xf32>
}
"""
HUGE_VALUE = """func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.broadcast_in_dim %a, dims = [1] : (tensor<4xf32>) -> tensor<1000000000x4xf32>
  %1 = stablehlo.reduce(%0 init: %z) applies stablehlo.add across dimensions = [0]
    : (tensor<1000000000x4xf32>, tensor<f32>) -> tensor<4xf32>
  return %1 : tensor<4xf32>
}
"""


def test_oversized_argument_is_bad_input(tmp_path: Path) -> None:
    """At its real size (--no-reduce) a 10^12-element argument cannot be evaluated."""
    (tmp_path / "huge.mlir").write_text(HUGE_ARG)
    r = tv("check", "huge.mlir", "huge.mlir", "--no-reduce", cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    line = one_line_error(r)
    assert "argument 0" in line and "1,000,000,000,000 elements" in line


def test_oversized_argument_is_proved_at_reduced_shapes(tmp_path: Path) -> None:
    """By default the same program shrinks to a few elements and is proved."""
    (tmp_path / "huge.mlir").write_text(HUGE_ARG)
    r = tv("check", "huge.mlir", "huge.mlir", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1000000 -> 1" in r.stdout


def test_oversized_intermediate_value_is_bad_input() -> None:
    with pytest.raises(tv_ir.BadInput, match="broadcast_in_dim.*4,000,000,000 elements"):
        tv_ir.check(HUGE_VALUE, HUGE_VALUE, reduce_shapes=False)


# -- 5, 6. per-device programs: told from pre-partition modules; results need a layout -----------


def _per_device(f, in_spec, out_spec, *args) -> tuple:
    """(spec text, XLA's per-device program as StableHLO text, XLA's partitioning) for `f` on
    a 4-device mesh, every argument laid out by `in_spec` (a PartitionSpec)."""
    from jax.sharding import Mesh, NamedSharding

    from tv_ir.ir.importer import parse_mlir
    from tv_ir.xla.partitioner import partition

    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    ins = (NamedSharding(mesh, in_spec),) * len(args)
    jf = jax.jit(f, in_shardings=ins, out_shardings=NamedSharding(mesh, out_spec))
    parted = partition(jf.lower(*args).as_text(debug_info=True))
    text = parse_mlir(parted.per_device_hlo)[0].operation.get_asm(enable_debug_info=True)
    return jax.jit(f).lower(*args).as_text(debug_info=True), text, parted


def test_per_device_program_with_replicated_arguments_is_not_repartitioned() -> None:
    from jax.sharding import PartitionSpec as P

    x = np.ones((8, 4), np.float32)
    spec, per_device, parted = _per_device(lambda a, b: jnp.sin(a) * b + 1.0, P(), P("x"), x, x)
    assert (
        'mhlo.sharding = "{replicated}"' in per_device and "mhlo.num_partitions = 4" in per_device
    )
    (out,) = parted.out_shardings
    sig = "-> tensor<2x4xf32> {"
    assert sig in per_device
    per_device = per_device.replace(sig, f'-> (tensor<2x4xf32> {{mhlo.sharding = "{out}"}}) {{', 1)
    r = tv_ir.check(spec, per_device)
    assert r.verdict == "equivalent", str(r)
    assert "SPMD partitioning" not in r.impl_name  # proved as given, not partitioned again


def test_per_device_result_without_sharding_is_bad_input(tmp_path: Path) -> None:
    """The result has its global shape (after an all_reduce) but no mhlo.sharding: replicated
    or partial sums? Not guessed."""
    from jax.sharding import PartitionSpec as P

    x = np.ones((8, 4), np.float32)
    spec, per_device, _ = _per_device(lambda a: jnp.sum(a * a, axis=0), P("x"), P(), x)
    assert "all_reduce" in per_device and "tensor<2x4xf32>" in per_device
    assert "mhlo.sharding" not in per_device.split("->", 1)[1].split("{", 1)[0]
    (tmp_path / "spec.mlir").write_text(spec)
    (tmp_path / "impl.mlir").write_text(per_device)
    r = tv("check", "spec.mlir", "impl.mlir", cwd=tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    line = one_line_error(r)
    assert "result 0" in line and "no mhlo.sharding" in line and "layout" in line


# -- 8. internal errors are not verdicts ---------------------------------------------------------


@pytest.fixture
def broken_tv(tmp_path: Path) -> Path:
    """A `sitecustomize` that plants a bug in tv's prover (for the subprocess only)."""
    (tmp_path / "add.mlir").write_text(ADD)
    (tmp_path / "sitecustomize.py").write_text(
        "import tv_ir.prover.engine as e\n"
        "def boom(self):\n"
        "    raise KeyError('planted bug')\n"
        "e.StageProver.run = boom\n"
    )
    return tmp_path


def _tv_with_bug(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ, PYTHONPATH=str(cwd))
    return subprocess.run(
        [sys.executable, "-m", "tv_ir.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
    )


def test_internal_error_exits_4_not_unknown(broken_tv: Path) -> None:
    r = _tv_with_bug(broken_tv, "check", "add.mlir", "add.mlir")
    assert r.returncode == 4, r.stderr
    line = one_line_error(r)
    assert line.startswith("tv: internal error:") and "planted bug" in line


def test_internal_error_in_json(broken_tv: Path) -> None:
    r = _tv_with_bug(broken_tv, "check", "add.mlir", "add.mlir", "--json")
    assert r.returncode == 4, r.stderr
    out = json.loads(r.stdout)
    assert out["verdict"] == "error" and out["internal_error"] is True
    assert "planted bug" in out["message"]


def test_help_lists_exit_codes() -> None:
    r = tv("check", "--help")
    assert r.returncode == 0
    assert "4  internal error" in r.stdout and "2  unknown" in r.stdout


# -- 7. what XLA's verifier rejects is refused -------------------------------------------------

COMPARE = """func.func @main(%a: tensor<i32>, %b: tensor<i32>) -> tensor<i1> {
  %0 = stablehlo.compare LT, %a, %b, KIND : (tensor<i32>, tensor<i32>) -> tensor<i1>
  return %0 : tensor<i1>
}
"""


def test_compare_unsigned_on_signed_integers_is_bad_input(tmp_path: Path) -> None:
    """jaxlib's MLIR verifier accepts it, XLA's rejects it: tv must not read it as signed."""
    (tmp_path / "signed.mlir").write_text(COMPARE.replace("KIND", "SIGNED"))
    (tmp_path / "unsigned.mlir").write_text(COMPARE.replace("KIND", "UNSIGNED"))
    r = tv("check", "signed.mlir", "unsigned.mlir", cwd=tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    line = one_line_error(r)
    assert "unsigned.mlir" in line and "UNSIGNED" in line and "SIGNED for i32" in line
    assert tv("check", "signed.mlir", "signed.mlir", cwd=tmp_path).returncode == 0


def test_compares_jax_emits_are_accepted() -> None:
    """Signed, unsigned, boolean and float compares as jax lowers them."""

    def f(a, i, u, b):
        return (a > 0) & (i < 2) & (u < 2) & (b == (a < 1))

    args = [np.ones(3, t) for t in (np.float32, np.int32, np.uint32, np.bool_)]
    text = jax.jit(f).lower(*args).as_text()
    assert all(k in text for k in ("FLOAT", "SIGNED", "UNSIGNED"))
    r = tv_ir.check(text, text)
    assert r.verdict == "equivalent", str(r)
