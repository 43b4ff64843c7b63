"""The kernel loop's instructions a ring message and a bare yield, for one or more checkouts.

Wall-clock ratios of the loop move by 30-100% from run to run on a shared
two-core VM; instruction counts do not. Each figure is the difference of
two sizes of the same work under ``valgrind --tool=callgrind`` (so start-up
and imports cancel out), divided by the units of work between them, with
the hash seed fixed (``PYTHONHASHSEED=0``: without it the same tree's count
moved by up to 1.5%). Each checkout's own ``tiffany`` is imported (its
directory first on ``sys.path``, the editable install's finder set aside);
the work itself is ``bench/ring.py``'s, from this checkout.

    .venv/bin/python bench/instructions.py                       # this checkout
    .venv/bin/python bench/instructions.py --tree ../before --tree .   # side by side

Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: One unit of work each: (label, sizes, units a size step, the child's call).
WORK = {
    "ring": ("a ring message (8 rings of 2 tasks)", (1_000, 3_000), 16),
    "yields": ("a bare yield (1,000 tasks)", (100, 300), 1_000),
}

_CHILD = """
import sys
tree, mode, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f)]
sys.path.insert(0, {bench!r})
import ring
sys.path.insert(0, tree)
import tiffany
assert tiffany.__file__.startswith(tree), tiffany.__file__
if mode == "yields":
    ring.yields_tiffany(1000, size)
else:
    ring.ring_tiffany(8, 2, size, 2)
"""


def count(tree: Path, mode: str, size: int) -> int:
    """Instructions callgrind collected for one run of ``mode`` at ``size`` in ``tree``."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    child = _CHILD.format(bench=str(HERE))
    argv = [sys.executable, "-c", child, str(tree), mode, str(size)]
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode or found is None:
        raise SystemExit(f"callgrind failed in {tree} ({mode} {size}):\n{proc.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", type=Path, help="a checkout (repeatable)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    trees = [t.resolve() for t in (args.tree or [HERE.parent])]
    print("instructions a unit of work (callgrind, the difference of two sizes)")
    print(f"{'work':40s}" + "".join(f"{t.name[:22]:>24s}" for t in trees))
    for mode, (label, (small, large), units) in WORK.items():
        figures = []
        for tree in trees:
            diff = count(tree, mode, large) - count(tree, mode, small)
            figures.append(diff / (units * (large - small)))
        cells = [f"{f:,.0f}" for f in figures[:1]]
        cells += [f"{f:,.0f} ({(f / figures[0] - 1) * 100:+.1f}%)" for f in figures[1:]]
        print(f"{label:40s}" + "".join(f"{c:>24s}" for c in cells))


if __name__ == "__main__":
    main()
