"""Carry a refutation found at reduced shapes back to the programs at their real sizes.

The reduced counterexample is blown up (each element repeated over the block of real
positions it stands for) and both real programs are run on it concretely. When they differ
there, that real-size difference is the counterexample; when the real programs are too large
to run, or do not differ there, the reduced counterexample stands, and the report says so.
"""

from __future__ import annotations

import numpy as np

from ..ir import Module, TensorType
from ..report import Report
from .localise import refutation

REPLAY_LIMIT = 20_000_000  # elements over all values of both real programs


def replay_at_real_size(
    report: Report, spec: Module, impl: Module, placement, arg_factors, real_elements: int
) -> None:
    ce = report.counterexample
    if ce is None:
        return
    if real_elements > REPLAY_LIMIT:
        report.notes.append(
            "the counterexample is of the reduced programs (same ops and source lines); the "
            f"real programs ({real_elements:,} elements) are too large to replay it on"
        )
        return
    inputs = []
    for x, factors, t in zip(ce.inputs.values(), arg_factors, spec.main.arg_types, strict=True):
        if isinstance(t, TensorType) and x is not None:
            x = np.asarray(x)
            for axis, k in enumerate(factors):
                if k > 1:
                    x = np.repeat(x, k, axis=axis)
        inputs.append(x)
    found = refutation(spec, impl, placement, inputs)
    if found is None:
        report.notes.append(
            "the counterexample is of the reduced programs (same ops and source lines); "
            "repeated over the real sizes it shows no difference"
        )
        return
    report.counterexample, report.location, report.outputs = found
    report.notes.append(
        "counterexample found at reduced shapes and replayed at the real sizes (each "
        "element repeated over the positions it stands for)"
    )
