"""The culprit search's cost on a residue shaped like the optimizer's global norm: every
monomial reads one shared atom (`sqrt` of a sum of squares), so every moved group of symbols
touches every monomial. Times moving 20 groups one at a time, evaluating the residue whole
per group (`evaluate_with_scale`, what the prover did before) and with `Perturbations`.

    python bench/culprit_search.py [--monomials 20000] [--symbols 400] [--groups 20]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tv_ir.semantics import terms as T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--monomials", type=int, default=20000)
    parser.add_argument("--symbols", type=int, default=400)
    parser.add_argument("--groups", type=int, default=20)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    xs = [T.symbol(f"s{i}") for i in range(args.symbols)]
    norm = T.fn("sqrt", T.sum_of([T.mul(x, x) for x in xs]))
    picks = rng.integers(0, args.symbols, (args.monomials, 3))
    p = T.sum_of([T.mul(T.mul(T.mul(xs[a], xs[b]), xs[c]), norm) for a, b, c in picks])
    env = {T.as_atom(x).id: float(rng.standard_normal()) for x in xs}
    groups = [[T.as_atom(x).id for x in xs[2 * i : 2 * i + 2]] for i in range(args.groups)]
    moves = [{a: env[a] * 1.7 + 1.0 for a in g} for g in groups]

    t0 = time.perf_counter()
    whole = [T.evaluate_with_scale(p, env | m) for m in moves]
    whole_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    points = T.Perturbations(p, env)
    fast = [points.at(m) for m in moves]
    fast_s = time.perf_counter() - t0
    worst = max(abs(a[0] - b[0]) / (1 + a[1]) for a, b in zip(whole, fast, strict=True))
    print(
        f"{len(p.terms)} monomials, {args.groups} groups: whole {whole_s:.2f} s, "
        f"Perturbations {fast_s:.2f} s (largest relative difference {worst:.1e})"
    )


if __name__ == "__main__":
    main()
