"""`tv_ir.frontends.jax`: verify / assert_equivalent on JAX functions and example arguments
(plain, jit with shardings, shard_map; pytrees; ShapeDtypeStructs), source lines in the
reports, and one-line BadInput errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tv_ir.frontends.jax import NotEquivalentError, assert_equivalent, verify

from tv_ir.errors import BadInput

F32 = jnp.float32
PARAMS = {"w1": jax.ShapeDtypeStruct((8, 16), F32), "w2": jax.ShapeDtypeStruct((16, 8), F32)}
X = np.linspace(-1, 1, 8 * 8, dtype=np.float32).reshape(8, 8)


def marker_line(tag: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    hits = [i for i, ln in enumerate(lines, 1) if re.search(rf"# {tag}$", ln)]
    assert len(hits) == 1, tag
    return hits[0]


def mlp(params, x):
    h = jax.nn.relu(x @ params["w1"])
    return h @ params["w2"]


def mlp_scaled_wrong(params, x):
    h = jax.nn.relu(x @ params["w1"])
    return (h @ params["w2"]) * 2.0  # BUG: scaled


def mlp_pytree_out(params, x):
    h = jax.nn.relu(x @ params["w1"])
    return {"hidden": h, "out": h @ params["w2"]}


@pytest.fixture(scope="module")
def mesh():
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))


def megatron(mesh, reduce):
    def body(params, x):
        return reduce(mlp(params, x))

    return jax.shard_map(
        body,
        mesh=mesh,
        in_specs=({"w1": P(None, "model"), "w2": P("model", None)}, P("data", None)),
        out_specs=P("data", None),
        check_vma=False,
    )


def test_plain_pytree_args_proved():
    report = assert_equivalent(mlp, PARAMS, X, spec=mlp)
    assert report.verdict == "equivalent"
    assert "mlp" in report.impl_name and "test_jax_frontend.py" in report.spec_name


def test_pytree_outputs_proved():
    def split(params, x):
        h = jax.nn.relu(jnp.einsum("bd,dh->bh", x, params["w1"]))
        return {"hidden": h, "out": jnp.einsum("bh,hd->bd", h, params["w2"])}

    assert_equivalent(split, PARAMS, X, spec=mlp_pytree_out)


def test_planted_bug_located_at_user_line():
    report = verify(mlp_scaled_wrong, PARAMS, X, spec=mlp)
    assert report.verdict == "not_equivalent"
    assert report.location.file == __file__
    assert report.location.line == marker_line("BUG: scaled")
    assert report.location.impl.function == "mlp_scaled_wrong"
    assert report.location.spec.file == __file__
    ce = report.counterexample
    assert set(ce.inputs) == {"params['w1']", "params['w2']", "x"}
    # the counterexample replays through JAX
    params = {"w1": ce.inputs["params['w1']"], "w2": ce.inputs["params['w2']"]}
    assert np.isclose(np.asarray(mlp(params, ce.inputs["x"]))[ce.index], ce.expected, rtol=1e-4)
    d = json.loads(report.to_json())
    assert d["location"]["impl"]["line"] == report.location.line


def test_assert_equivalent_fails_with_the_report():
    with pytest.raises(NotEquivalentError) as err:
        assert_equivalent(mlp_scaled_wrong, PARAMS, X, spec=mlp)
    assert err.value.report.verdict == "not_equivalent"
    assert f"test_jax_frontend.py:{marker_line('BUG: scaled')}" in str(err.value)


def test_differing_output_named_by_pytree_path():
    def wrong_hidden(params, x):
        h = jax.nn.relu(x @ params["w1"])
        return {"hidden": h + 1.0, "out": h @ params["w2"]}

    report = verify(wrong_hidden, PARAMS, X, spec=mlp_pytree_out)
    assert report.verdict == "not_equivalent"
    assert "output 0 is result['hidden']" in report.notes


def test_shard_map_proved_and_refuted(mesh):
    ok = verify(megatron(mesh, lambda y: jax.lax.psum(y, "model")), PARAMS, X, spec=mlp)
    assert ok.verdict == "equivalent", ok.reason
    bad = verify(megatron(mesh, lambda y: jax.lax.psum(y, "data")), PARAMS, X, spec=mlp)
    assert bad.verdict == "not_equivalent"
    assert bad.location.op == "stablehlo.all_reduce"
    assert bad.location.file == __file__


def test_jit_with_shardings_against_spec(mesh):
    s = lambda *p: NamedSharding(mesh, P(*p))  # noqa: E731
    step = jax.jit(
        mlp,
        in_shardings=({"w1": s(None, "model"), "w2": s("model", None)}, s("data", None)),
        out_shardings=s("data", None),
    )
    report = verify(step, PARAMS, X, spec=mlp)
    assert report.verdict == "equivalent", report.reason
    assert report.impl_name.startswith("XLA's SPMD partitioning of mlp")


def test_no_spec_checks_the_partitioner():
    report = verify(
        mlp,
        PARAMS,
        X,
        mesh={"data": 2, "model": 4},
        in_shardings=({"w1": P(None, "model"), "w2": P("model", None)}, P("data", None)),
        out_shardings=P("data", None),
    )
    assert report.verdict == "equivalent", report.reason
    assert report.stats.stages >= 2


def _deep(x):
    for i in range(40):  # past the 50 values between two progress lines; no two alike
        x = jnp.tanh(x) * (1.5 + i)
    return x


def _deep_spec(x):
    for i in range(40):
        x = (1.5 + i) * jnp.tanh(x)
    return x


def test_progress_true_prints_lines(capsys):
    """`progress=True` prints the proof's progress to stderr; a callable gets the lines."""
    lines = []
    assert verify(_deep, X, spec=_deep_spec, progress=lines.append).verdict == "equivalent"
    assert lines and all(isinstance(line, str) for line in lines)
    assert verify(_deep, X, spec=_deep_spec, progress=True).verdict == "equivalent"
    assert "stages" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: verify(mlp, PARAMS, X), "not sharded"),
        (lambda: verify(lambda p, x: x if x.sum() > 0 else -x, PARAMS, X, spec=mlp), "lowered"),
        (lambda: verify(mlp, PARAMS, X, spec=mlp, mesh={"data": 8, "model": 4}), "32 devices"),
        (lambda: verify(mlp, PARAMS, X, spec=mlp_pytree_out), "different structures"),
        (lambda: verify(mlp, PARAMS, X, spec=mlp, tolerance=1), "unknown option"),
        (lambda: verify(mlp, PARAMS, X, spec=3), "not callable"),
        (lambda: verify(mlp, PARAMS, spec=mlp), "lowered"),
        (lambda: verify(mlp, PARAMS, X, in_shardings=(P(), P())), "pass mesh="),
        (lambda: verify(mlp, PARAMS, X, spec=mlp, progress="yes"), "progress must be"),
        (
            lambda: verify(
                lambda x: x * 2, X, mesh={"data": 2, "model": 2}, in_shardings=(P("batch"),)
            ),
            "batch",
        ),
    ],
    ids=[
        "no-spec-unsharded",
        "not-jittable",
        "mesh-too-large",
        "structure",
        "option",
        "spec-not-callable",
        "missing-arg",
        "spec-without-mesh",
        "progress-not-callable",
        "axis-not-in-mesh",
    ],
)
def test_bad_input_is_one_line(call, message):
    with pytest.raises(BadInput) as err:
        call()
    text = str(err.value)
    assert message in text and "\n" not in text, text


def test_a_shard_map_of_another_shape_says_the_signatures_differ(mesh):
    """A shard_map whose global result is (8, 4) against a spec's (8, 8): the same one-line
    message as for any two programs, not one about per-device layouts."""
    impl = jax.shard_map(
        lambda x: x[:, :1],
        mesh=mesh,
        in_specs=P("data", "model"),
        out_specs=P("data", "model"),
        check_vma=False,
    )
    with pytest.raises(BadInput) as err:
        verify(impl, X, spec=lambda x: x)
    assert str(err.value) == (
        "signatures differ: result 0 is tensor<8x8xf32> in spec but tensor<8x4xf32> in impl"
    )


def _dropout_all_kept(x, bits):
    return jnp.where(bits >= jnp.uint32(0), x, 0.0)


BITS = np.zeros((8, 8), np.uint32)


def test_a_spec_that_ignores_an_argument_takes_it_still():
    """jax.jit drops the arguments a function does not use: an eval-mode spec that ignores
    the dropout bits its training implementation reads once took fewer arguments ("signatures
    differ: spec takes 1 arguments, impl 2")."""
    report = verify(_dropout_all_kept, X, BITS, spec=lambda x, bits: x)
    assert report.verdict == "equivalent", str(report)


def test_a_jit_given_that_drops_an_argument_the_spec_drops_too(mesh):
    impl = jax.jit(lambda x, bits: x * 2.0, in_shardings=(NamedSharding(mesh, P("data")),) * 2)
    report = verify(impl, X, BITS, spec=lambda x, bits: x + x)
    assert report.verdict == "equivalent", str(report)


def test_a_jit_given_that_drops_an_argument_the_spec_reads_is_one_line(mesh):
    impl = jax.jit(lambda x, bits: x * 2.0, in_shardings=(NamedSharding(mesh, P("data")),) * 2)
    with pytest.raises(BadInput) as err:
        verify(impl, X, BITS, spec=lambda x, bits: x + x * bits.astype(jnp.float32))
    assert "keep_unused=True" in str(err.value) and "\n" not in str(err.value)
