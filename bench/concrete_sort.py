"""tv's concrete `sort`: numpy's argsort checked by the comparator, every lane at once (lane
merge sort), and one comparison at a time.

    python bench/concrete_sort.py

A proof at reduced shapes is confirmed by running both programs at their real sizes on
random inputs (when they fit in memory); a sort runs there concretely. Prints seconds per
sort of L lanes of n f32 keys with an iota payload (XLA's argsort): tv's default path (a
candidate order from numpy's stable argsort, kept when the comparator confirms it,
tv_ir/semantics/ops/checked_sort.py), the comparator region run on whole arrays
(tv_ir/semantics/ops/lane_merge_sort.py, the fallback when no candidate passes) and the
region run once per comparison (the last fallback, timed on the smallest size only),
beside XLA:CPU running the same sort (jitted, compile time excluded).
"""

from __future__ import annotations

import time

import numpy as np

SIZES = [(16, 1024), (64, 1024), (1024, 1024), (2, 209664)]
SCALAR_UP_TO = 16 * 1024  # elements: the one-comparison-at-a-time sort beyond this takes minutes


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


def tv_seconds(lanes: int, n: int, x: np.ndarray, paths: tuple[str, ...]) -> float:
    """Seconds of tv's concrete sort with only `paths` of ("checked", "merge") enabled."""
    import tv_ir
    from tv_ir.semantics.algebra import NumpyAlgebra
    from tv_ir.semantics.interpreters.interp import Interpreter
    from tv_ir.semantics.ops import reduction

    m = tv_ir.load(sort_module(lanes, n))
    saved = reduction.checked_sort_lanes, reduction.merge_sort_lanes

    def refuse(*_):
        raise TypeError("one comparison at a time")

    if "checked" not in paths:
        reduction.checked_sort_lanes = lambda *_: None
    if "merge" not in paths:
        reduction.merge_sort_lanes = refuse
    try:
        t0 = time.perf_counter()
        out = Interpreter(m, NumpyAlgebra()).run(m.main, [x.astype(np.float64)])
        seconds = time.perf_counter() - t0
    finally:
        reduction.checked_sort_lanes, reduction.merge_sort_lanes = saved
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
    head = ["lanes x n", "tv, checked argsort", "tv, merge sort", "tv, per comparison"]
    print(f"{head[0]:>14} {head[1]:>20} {head[2]:>15} {head[3]:>19} {'XLA:CPU':>9}")
    for lanes, n in SIZES:
        x = rng.integers(0, n // 4, size=(lanes, n)).astype(np.float32)  # ties likely
        checked = tv_seconds(lanes, n, x, ("checked", "merge"))
        merge = tv_seconds(lanes, n, x, ("merge",))
        slow = tv_seconds(lanes, n, x, ()) if lanes * n <= SCALAR_UP_TO else None
        slow_s = f"{slow:.2f} s" if slow is not None else "-"
        print(
            f"{lanes:>6} x {n:<6} {checked:>18.2f} s {merge:>13.2f} s {slow_s:>19} "
            f"{xla_seconds(x):>7.3f} s"
        )


if __name__ == "__main__":
    main()
