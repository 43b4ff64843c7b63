"""Write the golden run exports under tests/data/golden/exports (run from the repo root).

    python tests/data/make_export_golden.py

Each is ``tiffany export`` of a golden journal's run (``make_golden.py``):

* ``fan_in.tfx``: ``golden-fan_in``, which must replay identically;
* ``nondeterministic.tfx``: ``golden-nondeterministic``, recorded in mode
  ``b``, whose replay in mode ``a`` must name its divergence.

They pin export format version 1 on disk: a later version must still read
them (docs/replay.md, "Changing the format"). Regenerate only on purpose,
keeping the previous files beside the new ones under a suffix.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tiffany  # noqa: E402
from tiffany.durable.export import export_run  # noqa: E402

GOLDEN = ROOT / "tests" / "data" / "golden"


def main() -> None:
    out = GOLDEN / "exports"
    out.mkdir(exist_ok=True)
    for name in ("fan_in", "nondeterministic"):
        meta = export_run(
            GOLDEN / name / "wal",
            f"golden-{name}",
            out / f"{name}.tfx",
            tiffany_version=tiffany.__version__,
        )
        print(f"{name}.tfx: {meta.records} records")


if __name__ == "__main__":
    main()
