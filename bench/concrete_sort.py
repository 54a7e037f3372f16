"""tv's concrete `sort`: every lane at once (lane merge sort) vs one comparison at a time.

    python bench/concrete_sort.py

A proof at reduced shapes is confirmed by running both programs at their real sizes on
random inputs (when they fit in memory); a sort runs there concretely. Prints seconds per
sort of L lanes of n f32 keys with an iota payload (XLA's argsort), by the comparator
region run on whole arrays (tv_ir/semantics/ops/lane_merge_sort.py) and by the region run
once per comparison (the fallback, timed on the smaller sizes only), beside XLA:CPU running
the same sort (jitted, compile time excluded).
"""

from __future__ import annotations

import time

import numpy as np

SIZES = [(16, 1024), (64, 1024), (1024, 1024), (2, 209664)]
SCALAR_UP_TO = 64 * 1024  # elements: the one-comparison-at-a-time sort beyond this takes minutes


def sort_module(lanes: int, n: int) -> str:
    t = f"tensor<{lanes}x{n}xf32>"
    i = f"tensor<{lanes}x{n}xi32>"
    return f"""
func.func @main(%x: {t}) -> ({t}, {i}) {{
  %iota = stablehlo.iota dim = 1 : {i}
  %0:2 = "stablehlo.sort"(%x, %iota) ({{
  ^bb0(%a: tensor<f32>, %b: tensor<f32>, %c: tensor<i32>, %d: tensor<i32>):
    %lt = stablehlo.compare LT, %a, %b, TOTALORDER : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %lt : tensor<i1>
  }}) {{dimension = 1 : i64, is_stable = true}} : ({t}, {i}) -> ({t}, {i})
  return %0#0, %0#1 : {t}, {i}
}}
"""


def tv_seconds(lanes: int, n: int, x: np.ndarray, on_arrays: bool) -> float:
    import tv_ir
    from tv_ir.semantics.algebra import NumpyAlgebra
    from tv_ir.semantics.interpreters.interp import Interpreter
    from tv_ir.semantics.ops import reduction

    m = tv_ir.load(sort_module(lanes, n))
    saved = reduction.merge_sort_lanes
    if not on_arrays:

        def refuse(*_):
            raise TypeError("one comparison at a time")

        reduction.merge_sort_lanes = refuse
    try:
        t0 = time.perf_counter()
        out = Interpreter(m, NumpyAlgebra()).run(m.main, [x.astype(np.float64)])
        seconds = time.perf_counter() - t0
    finally:
        reduction.merge_sort_lanes = saved
    assert (np.asarray(out[1]) == np.argsort(x, axis=1, kind="stable")).all()
    return seconds


def xla_seconds(x: np.ndarray) -> float:
    import jax
    import jax.numpy as jnp

    f = jax.jit(lambda v: jnp.argsort(v, axis=1, stable=True))
    f(x).block_until_ready()
    t0 = time.perf_counter()
    f(x).block_until_ready()
    return time.perf_counter() - t0


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"{'lanes x n':>14} {'tv, on arrays':>14} {'tv, per comparison':>19} {'XLA:CPU':>9}")
    for lanes, n in SIZES:
        x = rng.integers(0, n // 4, size=(lanes, n)).astype(np.float32)  # ties likely
        fast = tv_seconds(lanes, n, x, True)
        slow = tv_seconds(lanes, n, x, False) if lanes * n <= SCALAR_UP_TO else None
        slow_s = f"{slow:.2f} s" if slow is not None else "-"
        print(f"{lanes:>6} x {n:<6} {fast:>12.2f} s {slow_s:>19} {xla_seconds(x):>7.3f} s")


if __name__ == "__main__":
    main()
