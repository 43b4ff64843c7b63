"""The suite's own layout: what pytest needs of the test files to collect them all.

The test directories are not packages, so pytest imports each test file by
its basename: two files of one name in two directories collide ("import file
mismatch") and one of them is never run. CI once lost a file that way.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_every_test_file_has_a_basename_of_its_own() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        seen[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"rename one of each (pytest imports them by basename): {clashes}"


def test_the_slow_files_started_first_exist() -> None:
    """A renamed or moved slow file would silently start last again."""
    from suite_order import SLOW_FILES_FIRST

    root = Path(__file__).resolve().parent.parent
    missing = [name for name in SLOW_FILES_FIRST if not (root / name).is_file()]
    assert not missing, missing
    assert len(set(SLOW_FILES_FIRST)) == len(SLOW_FILES_FIRST)
