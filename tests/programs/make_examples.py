"""Regenerate the bundled demo programs in tv_ir/examples/ (forward block, with debug info).

    python tests/programs/make_examples.py

Source paths are written relative to the repository root, so the files do not depend on
where the repository was checked out.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.programs import transformer  # noqa: E402

EXAMPLES = {
    "block_spec.mlir": "spec",
    "block_fused_qkv.mlir": "fused_qkv",  # equivalent to the spec
    "block_bad_mask.mlir": "mask_off_by_one",  # causal mask off by one: not equivalent
}


def main() -> None:
    out = ROOT / "tv_ir" / "examples"
    out.mkdir(parents=True, exist_ok=True)
    for name, variant in EXAMPLES.items():
        text = transformer.lower(variant).replace(f'"{ROOT}/', '"')
        (out / name).write_text(text)
        print(f"wrote {out / name} ({variant}, {len(text)} bytes)")


if __name__ == "__main__":
    main()
