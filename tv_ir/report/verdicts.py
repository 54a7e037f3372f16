"""The three verdicts, their exit codes, and what "equivalent" means (one line)."""

from __future__ import annotations

EQUIVALENT = "equivalent"
NOT_EQUIVALENT = "not_equivalent"
UNKNOWN = "unknown"
EXIT_CODES = {EQUIVALENT: 0, NOT_EQUIVALENT: 1, UNKNOWN: 2}
SEMANTICS_NOTE = "equal over the reals, up to floating-point reassociation and rounding"
