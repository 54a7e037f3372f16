"""End-to-end checks through `tv_ir.check`: input forms, imports, solver proofs and refutations."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tv_ir
from tv_ir.prover.simulate import run_traced

X = np.ones((4, 8), np.float32)
W = np.ones((8, 8), np.float32)


def lower(f, *args) -> str:
    return jax.jit(f).lower(*(args or (X, W))).as_text(debug_info=True)


def mlp(x, w):
    return jax.nn.relu(x @ w) @ w.T


def test_stablehlo_text_bytecode_and_hlo_text_are_all_accepted(tmp_path) -> None:
    lowered = jax.jit(mlp).lower(X, W)
    text = lowered.as_text(debug_info=True)
    (tmp_path / "spec.mlir").write_text(text)
    (tmp_path / "impl.hlo").write_text(lowered.as_text(dialect="hlo"))
    mod = lowered.compiler_ir("stablehlo")
    (tmp_path / "impl.mlirbc").write_bytes(_bytecode(mod))
    for impl in ("impl.hlo", "impl.mlirbc"):
        r = tv_ir.check(tmp_path / "spec.mlir", tmp_path / impl)
        assert r.verdict == "equivalent", (impl, r.reason)
    assert tv_ir.check(text, mod).verdict == "equivalent"  # an ir.Module from jax's context


def _bytecode(mod) -> bytes:
    import io

    buf = io.BytesIO()
    mod.operation.write_bytecode(buf)
    return buf.getvalue()


def test_private_function_calls_are_inlined_and_proved() -> None:
    def spec(x, w):
        return jnp.linalg.norm(x @ w, axis=-1) + jax.jit(jnp.tanh)(x).sum(-1)

    def impl(x, w):
        return jnp.sqrt(jnp.sum((x @ w) ** 2, axis=-1)) + jnp.tanh(x).sum(-1)

    text = lower(spec)
    assert "func.call" in text or "call @" in text
    r = tv_ir.check(text, lower(impl))
    assert r.verdict == "equivalent", r.reason


LEGACY_DOT = """
func.func @main(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %0 = "stablehlo.dot"(%x, %w) : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
"""


def test_legacy_dot_is_legalised() -> None:
    r = tv_ir.check(lower(lambda x, w: x @ w), LEGACY_DOT)
    assert r.verdict == "equivalent", r.reason


def test_chlo_ops_are_decomposed_or_native() -> None:
    def spec(x, w):
        return jnp.sinh(x @ w) + jax.scipy.special.erf(x)

    def impl(x, w):
        return jnp.sinh(jnp.einsum("ij,jk->ik", x, w)) + jax.lax.erf(x)

    assert "chlo.sinh" in lower(spec) and "chlo.erf" in lower(spec)
    r = tv_ir.check(lower(spec), lower(impl))
    assert r.verdict == "equivalent", r.reason


def test_static_loops_are_unrolled() -> None:
    def spec(x, w):
        return jax.lax.fori_loop(0, 3, lambda i, h: jnp.tanh(h @ w), x)

    def impl(x, w):
        h = x
        for _ in range(3):
            h = jnp.tanh(h @ w)
        return h

    assert "stablehlo.while" in lower(spec)
    r = tv_ir.check(lower(spec), lower(impl))
    assert r.verdict == "equivalent", r.reason


def test_z3_proves_what_normal_forms_miss() -> None:
    # max(y, 0) and select(y > 0, y, 0) are different normal forms, equal functions
    r = tv_ir.check(
        lower(lambda x, w: jnp.maximum(x @ w, 0.0)),
        lower(lambda x, w: jnp.where(x @ w > 0, x @ w, 0.0)),
    )
    assert r.verdict == "equivalent", r.reason
    assert r.stats.proved_by_z3 >= 1


def test_solver_counterexample_is_replayed() -> None:
    # differs only at y == 0.5: random simulation misses it, the solver's model does not
    spec = lower(lambda x: x * 2, X)
    impl = lower(lambda x: jnp.where(x == 0.5, 7.0, x * 2), X)
    r = tv_ir.check(spec, impl)
    assert r.verdict == "not_equivalent"
    ce = r.counterexample
    assert ce.expected == pytest.approx(1.0) and ce.actual == pytest.approx(7.0)
    # the reported inputs really show the difference
    s = run_traced(tv_ir.pipeline.prepare(spec, "spec"), list(ce.inputs.values()))
    i = run_traced(tv_ir.pipeline.prepare(impl, "impl"), list(ce.inputs.values()))
    assert not np.allclose(s.outputs[0], i.outputs[0])


def test_tuple_results_and_multiple_outputs() -> None:
    def spec(x, w):
        return x @ w, (x * 2, jnp.sum(x))

    def impl(x, w):
        return jnp.einsum("ij,jk->ik", x, w), (x + x, jnp.sum(x.T))

    r = tv_ir.check(lower(spec), lower(impl))
    assert r.verdict == "equivalent", r.reason
    assert [o.verdict for o in r.outputs] == ["equivalent"] * 3


def test_tiny_real_difference_is_refuted_not_mistaken_for_noise() -> None:
    two_ulp = float(np.nextafter(np.float32(2.0), np.float32(3.0)))  # 2 + 2.4e-7
    r = tv_ir.check(lower(lambda x: x * 2.0, X), lower(lambda x: x * two_ulp, X))
    assert r.verdict == "not_equivalent"
    assert r.counterexample.expected != r.counterexample.actual


def test_scalar_results_are_proved() -> None:
    # 0-d values: a block of a scalar must stay an array, not become a bare term
    r = tv_ir.check(lower(lambda x: jnp.mean(x) * 2.0, X), lower(lambda x: jnp.sum(x + x) / 32, X))
    assert r.verdict == "equivalent", r.reason


def test_running_out_of_memory_while_proving_is_unknown(monkeypatch) -> None:
    from tv_ir.semantics.symbolic import SymbolicAlgebra

    def exhausted(self, x, y):
        raise MemoryError

    monkeypatch.setattr(SymbolicAlgebra, "multiply", exhausted)
    r = tv_ir.check(lower(mlp), lower(lambda x, w: jax.nn.relu(x @ w) @ w.T * 1.0))
    assert r.verdict == "unknown" and "out of memory" in r.reason, str(r)
