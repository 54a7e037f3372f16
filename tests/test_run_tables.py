"""A run's interned terms do not outlive it (tv_ir/semantics/run_tables.py): a check at real
sizes left millions of atoms behind, for the rest of the process."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from tv_ir.frontends.jax import verify

from tv_ir.semantics import terms as T


def spec(x, w):
    return jnp.sum(jnp.tanh(x) * w)


def impl(x, w):
    return jnp.sum(w * jnp.tanh(x))


ARGS = (jax.ShapeDtypeStruct((4, 4), jnp.float32), jax.ShapeDtypeStruct((4, 4), jnp.float32))


def test_a_run_leaves_the_term_tables_as_it_found_them() -> None:
    made = T.symbol("made before the run", (0,))  # a term of the caller's, outside any run
    atoms, bools = len(T.ATOM_BY_ID), len(T._BOOLS)
    report = verify(impl, *ARGS, spec=spec)
    assert report.verdict == "equivalent", str(report)
    assert len(T.ATOM_BY_ID) == atoms and len(T._BOOLS) == bools
    # the caller's term is still interned: made again, it is the same atom
    assert T.as_atom(T.symbol("made before the run", (0,))) is T.as_atom(made)
