"""One record: encode/decode, the order of the checks, and the fast loops agreeing with them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiffany.errors import WalCorruptionError
from tiffany.wal import iter_records
from tiffany.wal.format import HEADER_SIZE_BYTES, MAX_RECORD_BYTES, encode_header
from tiffany.wal.frame import (
    BAD_CHECKSUM,
    IMPOSSIBLE_LENGTH,
    RESERVED_TYPE,
    SHORT_HEADER,
    SHORT_PAYLOAD,
    ZERO_FILL,
    Frame,
    decode,
    encode,
    next_frame,
)
from tiffany.wal.reader import scan_segment
from tiffany.wal.segments import Segment


def test_encode_decode_round_trip():
    for rtype, payload in [(1, b""), (255, b"x" * 1000), (7, bytes(range(256)))]:
        data = b"pre" + encode(rtype, payload) + b"post"
        frame = decode(data, 3)
        assert frame == Frame(rtype, 12, 12 + len(payload))
        assert data[frame.start : frame.end] == payload


def test_the_crc_covers_length_type_and_payload():
    good = encode(2, b"payload")
    for i in range(4, len(good)):  # every byte after the crc
        bad = bytearray(good)
        bad[i] ^= 0x40
        assert not isinstance(decode(bytes(bad), 0), Frame), i


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\x01" * 8, SHORT_HEADER),
        (bytes(9) + b"junk", ZERO_FILL),
        (
            (0).to_bytes(4, "little") + (MAX_RECORD_BYTES + 1).to_bytes(4, "little") + b"\1",
            IMPOSSIBLE_LENGTH,
        ),
        (encode(1, b"abcdef")[:-1], SHORT_PAYLOAD),
        (b"\x01" + bytes(8) + b"x", RESERVED_TYPE),
        (b"\x00\x00\x00\x00" + encode(1, b"abc")[4:], BAD_CHECKSUM),
    ],
)
def test_decode_names_the_first_problem(data, problem):
    assert decode(data, 0) == problem


def test_next_frame_finds_a_record_behind_garbage_and_zeros():
    rec = encode(3, b"hello")
    assert next_frame(b"\xee" * 30 + rec, 0) == 30
    assert next_frame(bytes(100_000) + rec, 0) == 100_000
    assert next_frame(rec + bytes(1000), 0) is None
    assert next_frame(b"\xee" * 50, 0) is None


class _Xorshift:
    """A tiny deterministic generator (``random`` is banned outside the kernel)."""

    def __init__(self, seed: int) -> None:
        self.state = seed or 1

    def below(self, n: int) -> int:
        x = self.state
        x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 7
        x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
        self.state = x
        return x % n


def _reference(seg: Segment, data: bytes, *, last: bool) -> tuple[str, int, int]:
    """The rules of docs/wal-format.md, written plainly with frame.decode."""
    off, n = HEADER_SIZE_BYTES, 0
    while off < len(data):
        frame = decode(data, off)
        if isinstance(frame, str):
            if last and next_frame(data, off) is None:
                return ("torn", n, off)
            return ("corrupt", n, off)
        off, n = frame.end, n + 1
    return ("ok", n, off)


def _fast(seg: Segment, data: bytes, *, last: bool) -> tuple[str, int, int]:
    try:
        scan = scan_segment(seg, data, last=last)
    except WalCorruptionError as exc:
        return ("corrupt", exc.fields["seq"] - seg.first_seq, exc.fields["offset"])
    if scan.torn is not None:
        return ("torn", scan.records, scan.torn.offset)
    return ("ok", scan.records, scan.end)


def _yielded(path: Path, blob: bytes) -> tuple[str, int]:
    """What iter_records makes of ``blob`` as the last (only) segment."""
    (path / "00000000000000000005.wal").write_bytes(blob)
    got = []
    try:
        got.extend(iter_records(path))
    except WalCorruptionError:
        return ("corrupt", len(got))
    assert [r.seq for r in got] == list(range(5, 5 + len(got)))
    return ("clean", len(got))


def test_the_fast_loops_agree_with_frame_decode_on_damaged_segments(tmp_path):
    seg = Segment(Path("00000000000000000005.wal"), 5)
    good = encode_header(5) + b"".join(encode(1 + i % 3, bytes([i]) * (i % 40)) for i in range(40))
    rng = _Xorshift(20260101)
    for trial in range(3000):
        data = bytearray(good)
        kind = trial % 4
        if kind == 0:  # flip bits
            for _ in range(1 + rng.below(3)):
                pos = HEADER_SIZE_BYTES + rng.below(len(data) - HEADER_SIZE_BYTES)
                data[pos] ^= 1 << rng.below(8)
        elif kind == 1:  # truncate
            del data[HEADER_SIZE_BYTES + rng.below(len(data) - HEADER_SIZE_BYTES) :]
        elif kind == 2:  # zero a run
            pos = HEADER_SIZE_BYTES + rng.below(len(data) - HEADER_SIZE_BYTES)
            run = data[pos : pos + 1 + rng.below(64)]
            data[pos : pos + len(run)] = bytes(len(run))
        else:  # append garbage
            data += bytes(rng.below(256) for _ in range(rng.below(40)))
        blob = bytes(data)
        for last in (False, True):
            want = _reference(seg, blob, last=last)
            assert _fast(seg, blob, last=last) == want, (trial, last)
        state = "corrupt" if want[0] == "corrupt" else "clean"
        assert _yielded(tmp_path, blob) == (state, want[1]), trial
