"""Verdicts at reduced shapes, checked concretely against the programs' real sizes.

- A refutation (`replay_at_real_size`): the reduced counterexample is blown up (each element
  repeated over the block of real positions it stands for), then random inputs, and both
  real programs are run on them. A difference there is the counterexample; when the real
  programs are too large to run the reduced one stands, and the report says so.
- A proof (`confirm_proof`): the real programs, or the pair with each shrunk class a prime
  times larger, run on random inputs; a difference there overturns the proof.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from tv_ir.ir.program import Module, TensorType, elements
from tv_ir.limits import OutOfMemoryBudget, OutOfTime
from tv_ir.report.result import Report

from .localise import differs, refutation

REPLAY_LIMIT = 20_000_000  # elements over all values of both real programs


def replay_at_real_size(
    report: Report, spec: Module, impl: Module, placement, reduction, seed: int = 0
) -> bool | str:
    """Whether the refutation stands at the real sizes. False: the real programs fit and do
    not differ there; the caller checks them as they are. When they are too large to run,
    the counterexample is replayed on the pair with each shrunk class a prime times larger
    (blown up the same way): True when it differs there too (the reduced counterexample
    stands, and the report says so), else the reason the verdict is unknown."""
    ce = report.counterexample
    if ce is None:
        return True
    if reduction.replay_elements > REPLAY_LIMIT:
        why = _differs_at_witnesses(report, reduction, seed)
        if why is not None:
            return why
        found = _differs_at_real_classes(report, reduction, seed)
        if isinstance(found, str):
            return found
        checked, skipped = found
        at_real = ""
        if checked:
            at_real = f", and with each of {checked} shrunk classes back at its real size"
            at_real += f" ({skipped} more too large to run)" if skipped else ""
        elif skipped:
            at_real = (
                f"; with any of its {skipped} shrunk classes back at its real size the pair "
                "is too large to run"
            )
        report.notes.append(
            "the counterexample is of the reduced programs (same ops and source lines); the "
            f"real programs ({reduction.replay_elements:,} elements) are too large to replay "
            f"it on; it also differs with each shrunk class a prime times larger{at_real}"
        )
        return True
    inputs = _blown_up(ce, reduction.spec.main.arg_types, spec)
    reduced_location = report.location
    try:
        # the reduced counterexample blown up runs the same ops on the same numbers: where the
        # reduced programs part ways stands, and the walk is not made again at the real sizes
        found = refutation(spec, impl, placement, inputs, locate=_unlocated(reduced_location))
        if found is not None and found[1] is None:
            found = (found[0], reduced_location, found[2])
        if found is None or _faint(found[0]):
            # none, or one too faint to show the bug (a layernorm without its residual, on
            # the blown-up input, differs by 6e-9 at 2.0): random inputs, if they show more
            other = _differs(spec, impl, placement, seed)
            if found is None or (other is not None and _faint(found[0]) and not _faint(other[0])):
                found = other
    except (OutOfTime, OutOfMemoryBudget) as e:
        return (
            f"refuted at reduced shapes ({ce.what()}), but the "
            f"replay at the real sizes did not finish ({e})"
        )
    if found is None:
        return False
    report.counterexample, report.location, report.outputs = found
    if _unlocated(report.location) and not _unlocated(reduced_location):
        # the same ops and source lines: where the reduced programs part ways
        report.notes.append(
            "the diverging op is the reduced programs' "
            f"({getattr(report.location, 'note', None) or 'not found'} at the real sizes)"
        )
        report.location = reduced_location
    report.notes.append(
        "counterexample found at reduced shapes and replayed at the real sizes (the reduced "
        "one with each element repeated over the positions it stands for, or random inputs)"
    )
    return True


def replay_blown_up(report: Report, spec: Module, impl: Module, placement, reduced_types):
    """The refutation's counterexample, of a pair whose arguments had `reduced_types`, blown
    up to `spec`'s argument shapes (each element repeated over the positions it stands for)
    and replayed on the pair: `refutation(...)`'s result without a location (the caller
    keeps the reduced pair's), or None when they agree there."""
    inputs = _blown_up(report.counterexample, reduced_types, spec)
    return refutation(spec, impl, placement, inputs, locate=False)


def _unlocated(location) -> bool:
    return location is None or location.impl is None


def _blown_up(ce, reduced_types: list, spec: Module) -> list:
    """The counterexample's inputs (of arguments of `reduced_types`) at `spec`'s argument
    shapes, each element repeated over the positions it stands for: real position p of a
    dimension of n reads reduced position p * m // n of its m (a block of n / m positions
    where a factor shrank it; for an affine class, the nearest position at that fraction)."""
    inputs = []
    for x, r, t in zip(ce.inputs.values(), reduced_types, spec.main.arg_types, strict=True):
        if isinstance(t, TensorType) and isinstance(r, TensorType) and x is not None:
            x = np.asarray(x)
            for axis, (n, m) in enumerate(zip(t.shape, r.shape, strict=True)):
                if n != m and m:
                    x = np.take(x, np.arange(n) * m // n, axis=axis)
        inputs.append(x)
    return inputs


def _differs_at_witnesses(report: Report, reduction, seed: int) -> str | None:
    """None when the reduced counterexample (blown up), or random inputs, show a difference
    on every witness pair that fits in WITNESS_LIMIT; else why the refutation does not
    carry over."""
    for w, pair in _runnable(reduction.witnesses, [0]):
        if _still_differs(report, reduction, pair, seed):
            continue
        return (
            f"refuted at reduced shapes, but with {w.describe()} the programs agree on the "
            "same counterexample and on random inputs: their meaning depends on that size "
            "in a way shape reduction does not follow; the real programs are too large to "
            "run; check with --no-reduce (reduce_shapes=False)"
        )
    return None


def _still_differs(report: Report, reduction, pair, seed: int) -> bool:
    """Whether a witness pair differs on the reduced counterexample blown up to its shapes,
    or on random inputs (whether, not where: the location is the reduced programs')."""
    w_spec, w_impl, w_place = pair
    inputs = _blown_up(report.counterexample, reduction.spec.main.arg_types, w_spec)
    return differs(w_spec, w_impl, w_place, inputs, outputs_first=False) or _differs_anywhere(
        w_spec, w_impl, w_place, seed
    )


def _differs_at_real_classes(report: Report, reduction, seed: int) -> tuple[int, int] | str:
    """(pairs checked, pairs too large) when the reduced counterexample (blown up), or
    random inputs, show a difference with each shrunk class back at its real size (the
    others reduced) wherever that pair fits in WITNESS_LIMIT; else why the refutation does
    not carry over. A constant that is a count of that class in one program and not in the
    other (`sum(x) * 0.25 * 0.25` for a mean over 16) makes the reduced pair differ at
    every reduced size and agree at the real one: this is where that shows."""
    skipped = [0]
    checked = 0
    for w, pair in _runnable(reduction.real_class_witnesses, skipped):
        checked += 1
        if _still_differs(report, reduction, pair, seed):
            continue
        return (
            f"refuted at reduced shapes, but with {w.name} back at its real size {w.larger} "
            f"(the other classes reduced) the programs agree on the same counterexample and "
            "on random inputs: the difference comes from reducing that class, in a way shape "
            "reduction does not follow; the real programs are too large to run; check with "
            "--no-reduce (reduce_shapes=False)"
        )
    return checked, skipped[0]


def _runnable(witnesses: list, skipped: list[int]):
    """(witness, its pair) for each witness that builds and fits in WITNESS_LIMIT; one of
    several classes that does not is replaced by its classes' own witnesses. `skipped[0]`
    counts the witnesses neither it nor its classes could give."""
    for w in witnesses:
        try:
            pair = w.build()
        except Exception:  # inconsistent shapes at this size: no check from it
            pair = None
        if pair is not None and elements(pair[0]) + elements(pair[1]) <= WITNESS_LIMIT:
            yield w, pair
        elif w.members:
            yield from _runnable(w.members, skipped)
        else:
            skipped[0] += 1


WITNESS_LIMIT = 5_000_000  # elements over all values of one witness pair
# a pair at the real layer count (pipeline._by_layer_reduction), run once: its stacks hold
# every layer at reduced sizes (the 405B-shaped step at 126 layers: 25.9 million elements,
# 46 s wall on a loaded machine and 773 MB peak for the whole process)
LAYER_WITNESS_LIMIT = 40_000_000
RUNS = 2  # random inputs per concrete check


def refuted_by_replay(found, report: Report, note: str) -> Report:
    """A reduced proof that the real programs contradict: `found` is the replayed
    (counterexample, location, per-output results); `note` says what did not carry over."""
    from tv_ir.report.result import NOT_EQUIVALENT

    ce, loc, outputs = found
    out = Report(
        NOT_EQUIVALENT, outputs=outputs, counterexample=ce, location=loc, stats=report.stats
    )
    out.notes.append(note)
    return out


# a difference this small, relative to the value (or 1), is faint: random inputs are tried
# too, and shown instead where their difference is not
FAINT = 1e-4


def _faint(ce) -> bool:
    """A counterexample whose largest difference is hard to read in the report (its expected
    and actual values agree to 4 digits or more)."""
    scale = max(1.0, abs(ce.expected)) if isinstance(ce.expected, float) else 1.0
    return ce.max_abs_diff <= FAINT * scale


def _differs(spec: Module, impl: Module, placement, seed: int):
    """A difference of the pair on random inputs (refutation(...) result), or None."""
    from .simulate import random_inputs

    rng = np.random.default_rng(seed)
    for _ in range(RUNS):
        found = refutation(spec, impl, placement, random_inputs(spec.main, rng), outputs_first=True)
        if found is not None:
            return found
    return None


def differs_on_random_inputs(
    spec: Module, impl: Module, placement, seed: int, runs: int = RUNS, outputs_first: bool = True
) -> bool:
    """Whether the pair differs on `runs` random inputs (not localised); `outputs_first` as
    for `localise.differs` (False where a difference is expected)."""
    from .simulate import random_inputs

    rng = np.random.default_rng(seed)
    return any(
        differs(spec, impl, placement, random_inputs(spec.main, rng), outputs_first)
        for _ in range(runs)
    )


def _differs_anywhere(spec: Module, impl: Module, placement, seed: int) -> bool:
    """Whether the pair differs on `_differs`'s random inputs (without localising it)."""
    from .simulate import random_inputs

    rng = np.random.default_rng(seed)
    return any(differs(spec, impl, placement, random_inputs(spec.main, rng)) for _ in range(RUNS))


def agreement_parts(reduction, spec, impl, placement, seed: int = 0) -> list[Callable]:
    """`confirm_proof`'s concrete checks as independent parts, each giving (checks made,
    witnesses too large to run, whether the pair differed): one per random run at the real
    sizes, or one per witness. They do not depend on the proof, so they are computed beside
    it, shared between the processes there (`workers.ChecksBeside`); `agreement_of` gives
    the note of their outcomes."""
    if reduction.replay_elements <= REPLAY_LIMIT:
        return [partial(_run_agrees, spec, impl, placement, seed, k) for k in range(RUNS)]
    return [partial(_witness_outcome, w, seed) for w in reduction.witnesses]


def agreement_of(reduction, outcomes: list[tuple[int, int, bool]]) -> str | None:
    """What `confirm_proof` notes on a proof when every part of `agreement_parts` agreed;
    None when one differed (then `confirm_proof` itself says what follows)."""
    if any(differed for _, _, differed in outcomes):
        return None
    if reduction.replay_elements <= REPLAY_LIMIT:
        return REAL_SIZES_AGREE
    checked = sum(c for c, _, _ in outcomes)
    return _witnesses_note(reduction, checked, sum(s for _, s, _ in outcomes))


def _run_agrees(spec, impl, placement, seed: int, k: int) -> tuple[int, int, bool]:
    """The k-th of `_differs`'s random runs (the same inputs: the same generator)."""
    from .simulate import random_inputs

    rng = np.random.default_rng(seed)
    for _ in range(k):
        random_inputs(spec.main, rng)
    return 1, 0, differs(spec, impl, placement, random_inputs(spec.main, rng))


def _witness_outcome(w, seed: int) -> tuple[int, int, bool]:
    """`confirm_proof`'s check of one witness (its classes' own when it does not fit)."""
    checked, skipped = 0, [0]
    for _, (w_spec, w_impl, w_place) in _runnable([w], skipped):
        checked += 1
        if _differs_anywhere(w_spec, w_impl, w_place, seed):
            return checked, skipped[0], True
    return checked, skipped[0], False


def _witnesses_note(reduction, checked: int, skipped: int) -> str:
    classes = len({id(m) for w in reduction.witnesses for m in (w.members or [w])})
    note = f"each shrunk class checked concretely at a larger size ({classes} classes in "
    note += f"{checked} checks"
    note += f", {skipped} too large to run)" if skipped else ")"
    return note


REAL_SIZES_AGREE = "checked concretely at the real sizes too (random inputs)"


def confirm_proof(
    report: Report, reduction, spec, impl, placement, seed: int = 0, agreed: str | None = None
) -> Report:
    """A proof at reduced shapes stands only if the pair also agrees, concretely, at the real
    sizes (when they fit in memory) or else with each reduced class a prime times larger:
    a difference at the real sizes refutes (replayed there); one at a larger reduced size
    makes the verdict unknown (the pair's meaning depends on that size in a way the
    reduction does not follow). `agreed`: `agreement_of` the same pair's parts, computed
    already (the checks are not made again)."""
    from tv_ir.report.result import UNKNOWN

    if agreed is not None:
        report.notes.append(agreed)
        return report
    if reduction.replay_elements <= REPLAY_LIMIT:
        found = _differs(spec, impl, placement, seed)
        if found is None:
            report.notes.append(REAL_SIZES_AGREE)
            return report
        return refuted_by_replay(
            found,
            report,
            "proved at reduced shapes, but the programs differ at their real sizes: the "
            "reduction does not carry over for this pair (replayed at the real sizes)",
        )
    checked, skipped = 0, [0]
    for w, (w_spec, w_impl, w_place) in _runnable(reduction.witnesses, skipped):
        checked += 1
        found = _differs(w_spec, w_impl, w_place, seed)
        if found is None:
            continue
        w, found = _first_member_differing(w, seed) or (w, found)
        ce, loc, _ = found
        where = f" ({loc.impl})" if loc is not None and loc.impl is not None else ""
        out = Report(
            UNKNOWN,
            stats=report.stats,
            reason=(
                f"proved at reduced shapes, but with {w.describe()} the programs differ "
                f"({ce.what()}{where}): their meaning depends on that size in a way "
                "shape reduction does not follow; check with --no-reduce (reduce_shapes=False)"
            ),
        )
        return out
    report.notes.append(_witnesses_note(reduction, checked, skipped[0]))
    return report


def _first_member_differing(w, seed: int):
    """(a class's own witness, its difference) for the first class of a differing group
    whose pair alone differs too (to name it), or None."""
    for m, (m_spec, m_impl, m_place) in _runnable(w.members, [0]):
        found = _differs(m_spec, m_impl, m_place, seed)
        if found is not None:
            return m, found
    return None
