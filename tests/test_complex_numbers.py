"""Complex numbers in proofs: complex values are pairs of real terms (a complex argument's
elements pairs of symbols), so spectral computations are proved or refuted; complex
outputs and ops that do not know complex numbers are unknown, never read as reals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tv_ir
from tv_ir.semantics.closeness import close

X = np.zeros((2, 4), np.float32)


def lowered(fn, *args) -> str:
    return jax.jit(fn).lower(*(args or (X,))).as_text()


def verdict(spec, impl, *args):
    return tv_ir.check(lowered(spec, *args), lowered(impl, *args), time_limit=120)


def test_round_trip_through_the_spectrum_is_proved() -> None:
    # lengths 1, 2, 4: the DFT's coefficients are 0 and +-1, so the identity is exact
    r = verdict(lambda x: jnp.fft.irfft(jnp.fft.rfft(x), n=4) * 2, lambda x: x + x)
    assert r.verdict == "equivalent", r


def test_hermitian_symmetry_of_a_real_signal_is_proved() -> None:
    # length 6: irrational coefficients, the same ones on both sides (cos(2 pi 4/6) is
    # cos(2 pi 2/6) exactly)
    x = np.zeros((2, 6), np.float32)
    r = verdict(
        lambda x: jnp.fft.fft(x).imag,
        lambda x: jnp.concatenate(
            [jnp.fft.rfft(x).imag, -jnp.fft.rfft(x).imag[:, 1:3][:, ::-1]], 1
        ),
        x,
    )
    assert r.verdict == "equivalent", r


def test_a_wrong_spectral_scale_is_refuted() -> None:
    r = verdict(lambda x: jnp.fft.irfft(jnp.fft.rfft(x) * 2, n=4), lambda x: x * 3)
    assert r.verdict == "not_equivalent", r
    assert r.counterexample is not None


def test_a_wrong_imaginary_part_is_refuted() -> None:
    # conj flips only imaginary parts: the real parts agree everywhere
    r = verdict(lambda x: jnp.fft.fft(x).imag, lambda x: jnp.conj(jnp.fft.fft(x)).imag)
    assert r.verdict == "not_equivalent", r


def test_an_op_that_does_not_know_complex_numbers_is_unknown() -> None:
    r = verdict(lambda x: jnp.log(jnp.fft.rfft(x)).real, lambda x: jnp.log(jnp.fft.rfft(x)).real)
    assert r.verdict == "unknown", r
    assert "stablehlo.log" in str(r.unsupported)


Z = np.zeros(3, np.complex64)


@pytest.mark.parametrize(
    ("spec", "impl", "verdict"),
    [
        (lambda z: z.imag * 2, lambda z: z.imag + z.imag, "equivalent"),
        (lambda z: jnp.fft.fft(z).real, lambda z: jnp.fft.fft(z + 0).real, "equivalent"),
        (lambda z: z.real, lambda z: z.imag, "not_equivalent"),
        (lambda z: jnp.fft.fft(z).imag, lambda z: jnp.fft.ifft(z).imag * 3, "not_equivalent"),
    ],
    ids=["imag", "fft", "real is not imag", "fft is not ifft"],
)
def test_complex_arguments_are_pairs_of_symbols(spec, impl, verdict) -> None:
    # each element of a complex argument: a symbol for its real part and one for its
    # imaginary part, so a proof holds for every complex input
    r = tv_ir.check(lowered(spec, Z), lowered(impl, Z), time_limit=120)
    assert r.verdict == verdict, r


def test_a_complex_output_is_unknown() -> None:
    # the prover compares real elements: a complex output is never claimed proved
    r = verdict(lambda x: jnp.fft.rfft(x), lambda x: jnp.fft.rfft(x))
    assert r.verdict == "unknown", r


def test_complex_values_close_only_when_both_parts_are() -> None:
    a = np.array([1 + 2j, 3 - 1j])
    assert close(a, a.copy())
    assert not close(a, np.conj(a))


@pytest.mark.parametrize(("scale", "verdict"), [(1.0, "equivalent"), (1.5, "not_equivalent")])
def test_a_batch_sharded_spectrum_is_proved(scale: float, verdict: str) -> None:
    # each device transforms its rows (a planted bug scales the signal first)
    from functools import partial

    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:2]), ("b",))
    x = np.zeros((4, 6), np.float32)

    def spec(x):
        return jnp.abs(jnp.fft.rfft(x)) ** 2

    @partial(jax.shard_map, mesh=mesh, in_specs=P("b"), out_specs=P("b"))
    def impl(x):
        return jnp.abs(jnp.fft.rfft(x * scale)) ** 2

    r = tv_ir.check(lowered(spec, x), lowered(impl, x), time_limit=120)
    assert r.verdict == verdict, r


def test_an_imaginary_difference_of_arguments_is_refuted() -> None:
    # real(z * z) = re^2 - im^2: simulation draws both parts of a complex argument
    r = tv_ir.check(
        lowered(lambda z: (z * z).real, Z), lowered(lambda z: z.real * z.real, Z), time_limit=60
    )
    assert r.verdict == "not_equivalent", r


def test_complex_and_integer_arguments_together() -> None:
    # integer arguments make simulation draw extreme integers; complex ones are not integers
    def f(z, i):
        return z.real + i.astype(jnp.float32)

    args = (Z, np.zeros(3, np.int32))
    assert tv_ir.check(lowered(f, *args), lowered(f, *args), time_limit=60).verdict == "equivalent"
