"""docs/wal-format.md is normative: its constants table must match the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tiffany.wal import format as fmt

DOC = Path(__file__).resolve().parents[2] / "docs" / "wal-format.md"


def _doc_constants() -> dict[str, object]:
    out: dict[str, object] = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"^\| `([A-Z_]+)` \| `([^`]+)` \|", line)
        if m:
            name, raw = m.groups()
            try:
                out[name] = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                out[name] = raw
    return out


def test_every_documented_constant_matches_the_code():
    documented = _doc_constants()
    assert set(documented) >= {
        "MAGIC",
        "VERSION",
        "HEADER_SIZE_BYTES",
        "RECORD_HEADER_SIZE_BYTES",
        "ZERO_TYPE",
        "MAX_RECORD_BYTES",
        "SEGMENT_SIZE_BYTES",
        "SEGMENT_SUFFIX",
    }
    for name, value in documented.items():
        assert getattr(fmt, name) == value, name


def test_struct_sizes_match_the_documented_sizes():
    assert fmt.HEADER.size == fmt.HEADER_SIZE_BYTES == 24
    assert fmt.RECORD_HEADER.size == fmt.RECORD_HEADER_SIZE_BYTES == 9


def test_the_worked_example_is_what_the_writer_writes(tmp_path):
    from tiffany.wal import FsyncPolicy, Wal

    with Wal.open(tmp_path, fsync=FsyncPolicy.OFF) as wal:
        wal.append(1, b"hello")
        wal.append(3, b"\x01\x00\x00\x00\x93\x01\x01\xa5yield\xc0")
    data = (tmp_path / fmt.segment_name(1)).read_bytes()
    text = DOC.read_text()
    block = text[text.index("## Worked example") :]
    hexes = []
    for line in block.splitlines():
        m = re.match(r"^[0-9a-f]{8}  ((?:[0-9a-f]{2} ?)+)", line)
        if m:
            hexes.extend(m.group(1).split())
    assert bytes.fromhex("".join(hexes)) == data
