"""Ops defined by decomposition (batch norm, torch_xla's custom calls, top_k,
rng_bit_generator): the prover sees them as the ordinary terms of their definitions, so a
hand-written equivalent is proved and a wrong one refuted."""

from __future__ import annotations

import jax
import numpy as np

import tv_ir

T4, T1 = "tensor<4x3x2xf32>", "tensor<3xf32>"


def _batch_norm_training(eps: str = "9.99999974E-6") -> str:
    types = f"({T4}, {T1}, {T1})"
    attrs = f"{{epsilon = {eps} : f32, feature_index = 1 : i64}}"
    return f"""module {{
  func.func public @main(%a0: {T4}, %a1: {T1}, %a2: {T1}) -> {types} {{
    %0:3 = "stablehlo.batch_norm_training"(%a0, %a1, %a2) {attrs} : {types} -> {types}
    return %0#0, %0#1, %0#2 : {T4}, {T1}, {T1}
  }}
}}"""


def _hand_batch_norm(eps):
    def f(x, s, o):
        m = x.mean(axis=(0, 2))
        c = x - m[None, :, None]
        v = (c**2).mean(axis=(0, 2))
        y = c * jax.lax.rsqrt(v[None, :, None] + np.float32(eps))
        return y * s[None, :, None] + o[None, :, None], m, v

    x, s = np.zeros((4, 3, 2), np.float32), np.zeros((3,), np.float32)
    return jax.jit(f).lower(x, s, s).as_text()


def test_batch_norm_training_is_its_decomposition() -> None:
    report = tv_ir.check(_batch_norm_training(), _hand_batch_norm(1e-5))
    assert report.verdict == "equivalent", report


def test_batch_norm_training_wrong_epsilon_refuted() -> None:
    report = tv_ir.check(_batch_norm_training(), _hand_batch_norm(1e-3))
    assert report.verdict == "not_equivalent", report


def _custom_call(target: str, attrs: str = "mhlo.attributes = {}, mhlo.version = 1 : i64") -> str:
    t = "tensor<5xf32>"
    return f"""module {{
  func.func public @main(%a0: {t}) -> {t} {{
    %0 = stablehlo.custom_call @{target}(%a0) {{{attrs}}} : ({t}) -> {t}
    return %0 : {t}
  }}
}}"""


def test_mhlo_erf_custom_call_is_erf() -> None:
    x = np.zeros(5, np.float32)
    spec = jax.jit(jax.lax.erf).lower(x).as_text()
    assert tv_ir.check(spec, _custom_call("mhlo.erf")).verdict == "equivalent"
    assert tv_ir.check(spec, _custom_call("mhlo.tan")).verdict == "not_equivalent"


def test_unknown_custom_calls_stay_unknown() -> None:
    x = np.zeros(5, np.float32)
    spec = jax.jit(jax.lax.erf).lower(x).as_text()
    odd = _custom_call("mhlo.erf", "mhlo.attributes = {k = 1 : i64}, mhlo.version = 1 : i64")
    for impl in [odd, _custom_call("mhlo.atan"), _custom_call("my_erf", "")]:
        report = tv_ir.check(spec, impl)
        assert report.verdict == "unknown" and report.unsupported, report


def _topk_custom_call(k: int, attrs: str = "") -> str:
    t, tv, ti = "tensor<3x6xf32>", f"tensor<3x{k}xf32>", f"tensor<3x{k}xi32>"
    return f"""module {{
  func.func public @main(%a0: {t}) -> ({tv}, {ti}) {{
    %0:2 = stablehlo.custom_call @mhlo.topk(%a0) {{mhlo.attributes = {{k = {k} : i64{attrs}}}, mhlo.version = 1 : i64}} : ({t}) -> ({tv}, {ti})
    return %0#0, %0#1 : {tv}, {ti}
  }}
}}"""  # noqa: E501


def test_mhlo_topk_is_jax_top_k() -> None:
    x = np.zeros((3, 6), np.float32)
    spec = jax.jit(lambda x: jax.lax.top_k(x, 2)).lower(x).as_text()
    report = tv_ir.check(spec, _topk_custom_call(2))
    assert report.verdict == "equivalent", report
    swapped = jax.jit(lambda x: tuple(a[:, ::-1] for a in jax.lax.top_k(x, 2))).lower(x).as_text()
    assert tv_ir.check(swapped, _topk_custom_call(2)).verdict == "not_equivalent"


def test_mhlo_topk_smallest_is_unknown() -> None:
    x = np.zeros((3, 6), np.float32)
    spec = jax.jit(lambda x: jax.lax.top_k(x, 2)).lower(x).as_text()
    report = tv_ir.check(spec, _topk_custom_call(2, ", largest = false"))
    assert report.verdict == "unknown", report


def _dropout(seed: int, rate: float):
    def f(x):
        keep = jax.random.bernoulli(jax.random.key(seed, impl="rbg"), 1 - rate, x.shape)
        return jax.numpy.where(keep, x / (1 - rate), 0)

    return jax.jit(f).lower(np.zeros((4, 8), np.float32)).as_text()


def test_rng_bit_generator_dropout() -> None:
    # the bits are XLA's (a known seed): the same mask is proved, another seed refuted
    assert tv_ir.check(_dropout(3, 0.25), _dropout(3, 0.25)).verdict == "equivalent"
    assert tv_ir.check(_dropout(3, 0.25), _dropout(4, 0.25)).verdict == "not_equivalent"


def test_rng_bit_generator_of_an_input_is_unknown() -> None:
    text = """module {
  func.func public @main(%a0: tensor<2xui64>) -> tensor<4xui32> {
    %0, %1 = stablehlo.rng_bit_generator %a0, algorithm = DEFAULT : (tensor<2xui64>) -> (tensor<2xui64>, tensor<4xui32>)
    return %1 : tensor<4xui32>
  }
}"""  # noqa: E501
    report = tv_ir.check(text, text)
    assert report.verdict == "unknown", report
    assert "stablehlo.rng_bit_generator" in report.unsupported


_TRSM = """module {
  func.func public @main(%a0: tensor<3x3xf32>, %a1: tensor<3x2xf32>) -> tensor<3x2xf32> {
    %0 = "stablehlo.triangular_solve"(%a0, %a1) {left_side = true, lower = true, unit_diagonal = false, transpose_a = #stablehlo<transpose NO_TRANSPOSE>} : (tensor<3x3xf32>, tensor<3x2xf32>) -> tensor<3x2xf32>
    return %0 : tensor<3x2xf32>
  }
}"""  # noqa: E501


def _substitution(wrong: bool):
    def f(a, b):
        x0 = b[0] / a[0, 0]
        x1 = (b[1] - a[1, 0] * x0) / a[1, 1]
        x2 = (b[2] - a[2, 0] * x0 - (a[1, 2] if wrong else a[2, 1]) * x1) / a[2, 2]
        return jax.numpy.stack([x0, x1, x2])

    return jax.jit(f).lower(np.eye(3, dtype=np.float32), np.ones((3, 2), np.float32)).as_text()


def test_triangular_solve_is_forward_substitution() -> None:
    assert tv_ir.check(_TRSM, _substitution(False)).verdict == "equivalent"
    # reading the upper triangle is refuted
    assert tv_ir.check(_TRSM, _substitution(True)).verdict == "not_equivalent"


def test_expand_batch_norm_computes_what_the_ops_do() -> None:
    # the pass (passes/expand_batch_norm.py) against the evaluators, on the conformance
    # records' programs: every kind, feature index, epsilon and element type they draw
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from test_conformance import _batch_norm_case, _widen
    from tv_ir.passes import expand_batch_norm

    from tv_ir.ir.program import walk
    from tv_ir.semantics.interpreters.interp import evaluate

    @settings(max_examples=30, deadline=None)
    @given(st.data(), st.sampled_from(["training", "inference", "grad"]))
    def run(data, kind) -> None:
        case = _batch_norm_case(data.draw, kind)
        args = [_widen(a) for a in case.args]
        whole = evaluate(tv_ir.load(case.text), args)
        expanded = expand_batch_norm.run(tv_ir.load(case.text))
        assert not any(
            op.name.startswith("stablehlo.batch_norm") for op in walk(expanded.main.body)
        )
        for w, e in zip(whole, evaluate(expanded, args), strict=True):
            np.testing.assert_allclose(np.asarray(e), np.asarray(w), rtol=1e-12, atol=1e-12)

    run()


def _linalg_module(op: str, attrs: str, shapes: list[tuple]) -> str:
    ts = [f"tensor<{'x'.join(map(str, s))}xf32>" for s in shapes]
    args = ", ".join(f"%a{i}: {t}" for i, t in enumerate(ts))
    operands = ", ".join(f"%a{i}" for i in range(len(ts)))
    return f"""module {{
  func.func public @main({args}) -> {ts[-1]} {{
    %0 = "{op}"({operands}) {{{attrs}}} : ({", ".join(ts)}) -> {ts[-1]}
    return %0 : {ts[-1]}
  }}
}}"""


def test_batched_cholesky_fails_per_batch_element() -> None:
    # concrete values run the recurrence on whole arrays over the batch (linalg.py): a
    # failed factorisation is NaN in its own batch element only
    from tv_ir.semantics.interpreters.interp import evaluate

    rng = np.random.default_rng(0)
    m = rng.uniform(-1, 1, size=(3, 5, 5))
    a = m @ np.swapaxes(m, -1, -2) + 5 * np.eye(5)
    a[1, 2, 2] = -50.0  # not positive definite
    for lower in (True, False):
        text = _linalg_module("stablehlo.cholesky", f"lower = {str(lower).lower()}", [a.shape])
        [got] = evaluate(tv_ir.load(text), [a])
        assert np.isnan(got[1]).all()
        for b in (0, 2):
            want = np.linalg.cholesky(a[b])
            assert np.allclose(got[b], want if lower else want.T, rtol=1e-12, atol=1e-12)


def test_batched_triangular_solve_matches_numpy() -> None:
    from tv_ir.semantics.interpreters.interp import evaluate

    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, size=(2, 4, 4)) + 3 * np.eye(4)
    for left in (True, False):
        for lower in (True, False):
            for tr in ("NO_TRANSPOSE", "TRANSPOSE"):
                b = rng.uniform(-1, 1, size=(2, 4, 3) if left else (2, 3, 4))
                attrs = (
                    f"left_side = {str(left).lower()}, lower = {str(lower).lower()}, "
                    f"unit_diagonal = false, transpose_a = #stablehlo<transpose {tr}>"
                )
                text = _linalg_module("stablehlo.triangular_solve", attrs, [a.shape, b.shape])
                [got] = evaluate(tv_ir.load(text), [a, b])
                t = np.tril(a) if lower else np.triu(a)
                t = np.swapaxes(t, -1, -2) if tr == "TRANSPOSE" else t
                want = (
                    np.linalg.solve(t, b)
                    if left
                    else np.swapaxes(
                        np.linalg.solve(np.swapaxes(t, -1, -2), np.swapaxes(b, -1, -2)), -1, -2
                    )
                )
                assert np.allclose(got, want, rtol=1e-9, atol=1e-9), (left, lower, tr)


def test_concrete_scatter_by_windows_agrees_with_xla() -> None:
    # rows scattered whole (the window dimension last): the concrete scatter combines each
    # window as one numpy block, in scatter order; duplicate rows accumulate
    import jax.numpy as jnp

    from tv_ir.semantics.interpreters.interp import evaluate

    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    idx = np.array([4, 0, 4, 9, -1, 2], np.int32)  # a repeat, and two rows out of bounds
    u = rng.standard_normal((6, 5)).astype(np.float32)
    for f in (
        lambda x, i, u: x.at[i].add(u, mode="drop"),
        lambda x, i, u: x.at[i].max(u, mode="drop"),
        lambda x, i, u: x.at[i[1:]].set(u[1:] * 2, mode="drop"),  # distinct rows
        lambda x, i, u: x.at[:, i[:3] % 5].add(u[:, :3], mode="drop"),  # windows first
    ):
        text = jax.jit(f).lower(x, idx, u).as_text()
        (got,) = evaluate(tv_ir.load(text), [x, idx, u])
        want = np.asarray(f(jnp.asarray(x), idx, u))
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
