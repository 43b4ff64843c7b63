"""docs/wal-format.md is normative: its constants table and worked example must match the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from crc32c import crc32c

import tiffany.wal
from tiffany.wal import FsyncPolicy, Wal, frame
from tiffany.wal import format as fmt

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "wal-format.md"


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
        "SEGMENT_NAME_DIGITS",
        "SEGMENT_SUFFIX",
        "BROKEN_SUFFIX",
        "LOCK_NAME",
    }
    for name, value in documented.items():
        assert getattr(fmt, name) == value, name


def test_every_upper_case_constant_of_format_py_is_documented():
    documented = _doc_constants()
    code = {n for n in fmt.__all__ if n.isupper() and not isinstance(getattr(fmt, n), type)}
    structs = {"HEADER", "RECORD_HEADER", "MAX_TYPE"}  # described by the grammar
    assert code - structs <= set(documented)


def test_struct_sizes_match_the_grammar():
    assert fmt.HEADER.size == fmt.HEADER_SIZE_BYTES == 8 + 2 + 2 + 8 + 4
    assert fmt.RECORD_HEADER.size == fmt.RECORD_HEADER_SIZE_BYTES == 4 + 4 + 1
    grammar = DOC.read_text()
    assert "header     := magic:u8[8] version:u16 flags:u16 first_seq:u64 header_crc:u32" in grammar
    assert "record     := crc:u32 length:u32 type:u8 payload:u8[length]" in grammar


def test_the_frame_checks_are_listed_in_the_order_decode_applies_them():
    text = DOC.read_text()
    order = [
        frame.SHORT_HEADER,
        frame.ZERO_FILL,
        frame.IMPOSSIBLE_LENGTH,
        frame.SHORT_PAYLOAD,
        frame.RESERVED_TYPE,
        frame.BAD_CHECKSUM,
    ]
    positions = [text.index(f"*{name}*") for name in order]
    assert positions == sorted(positions)


def test_the_worked_example_is_what_the_writer_writes(tmp_path):
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
    assert f"file size {len(data)}" in block
    assert crc32c(bytes.fromhex("05000000016865 6c6c6f".replace(" ", ""))) == 0x3BD55829
    assert "crc 0x3bd55829" in block


def test_the_code_cites_the_document():
    for path in (ROOT / "tiffany" / "wal").glob("*.py"):
        if path.name in ("format.py", "__init__.py", "reader.py", "writer.py"):
            assert "docs/wal-format.md" in path.read_text(), path.name
    assert tiffany.wal.__doc__ is not None
