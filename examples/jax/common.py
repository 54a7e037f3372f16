"""Shared by the example scripts: meshes, the command line, and printing the report."""

from __future__ import annotations

import argparse
import sys

import jax
import numpy as np
from jax.sharding import Mesh


def mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    n = int(np.prod(shape))
    return Mesh(np.array(jax.devices()[:n]).reshape(shape), names)


def run(doc: str, verify_example) -> int:
    """`python <example>.py [--bug]`: verify the correct (or planted-bug) version, print the
    report, exit with tv's exit code (0 equivalent, 1 not equivalent, 2 unknown)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--bug", action="store_true", help="verify the planted-bug version")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    report = verify_example(bug=args.bug)
    print(report.to_json() if args.json else report)
    return report.exit_code


if __name__ == "__main__":
    sys.exit("common.py is a helper; run one of the llama_*.py examples")
