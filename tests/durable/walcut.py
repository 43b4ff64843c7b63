"""Copy a WAL cut after N records (a crash right after them), for the recovery tests."""

from __future__ import annotations

import shutil
from pathlib import Path


def cut_wal(src_wal: Path, dst_wal: Path, keep: int) -> None:
    """Copy a WAL keeping only its first ``keep`` records (a crash right after them)."""
    from tiffany.wal import iter_records

    shutil.copytree(src_wal, dst_wal)
    cut = None
    for i, rec in enumerate(iter_records(src_wal)):
        if i == keep:
            cut = rec
            break
    if cut is None:
        return
    seg = Path(cut.segment)
    seg = seg if seg.is_absolute() else src_wal / seg
    for path in sorted(dst_wal.iterdir()):
        if path.name > seg.name and path.suffix == seg.suffix:
            path.unlink()
    with open(dst_wal / seg.name, "r+b") as f:
        f.truncate(cut.offset)
