"""``records_at``: the records at given seqs, from a file WAL (archive included) or PostgreSQL.

What a re-run reads its reused outputs from (``tiffany/engine/stored_runs.py``).
"""

from __future__ import annotations

from pathlib import Path

from tiffany.durable.history import records_at
from tiffany.wal import Wal
from tiffany.wal.segments import ARCHIVE_DIR_NAME, list_segments, release_segment
from tiffany.wire.records import RUN_PREFIX, Outcome, encode
from tiffany.wire.values import pack_value

PREFIX = RUN_PREFIX.pack(1)
#: Small segments, so that a few hundred records span several of them.
SEGMENT_BYTES = 4096


def _value(i: int) -> list[object]:
    """Record ``i``'s value: what JSON cannot hold (bytes, a tuple, a set, inf)."""
    return [b"\x00" * (i % 7), (i, "t"), {i}, float("inf")]


def _record(i: int) -> Outcome:
    """Record ``i``, its value packed as the journal packs values."""
    return Outcome(i, 1, "step", pack_value(_value(i)))


def _payloads(n: int) -> list[tuple[int, bytes]]:
    return [(rec.rtype, encode(PREFIX, rec)) for rec in map(_record, range(n))]


def test_records_are_read_from_the_archive_and_the_live_segments(tmp_path: Path) -> None:
    wal_dir = tmp_path / "wal"
    wal = Wal.open(wal_dir, fsync="off", segment_size_bytes=SEGMENT_BYTES)
    seqs = [wal.append(rtype, payload) for rtype, payload in _payloads(300)]
    wal.commit()
    wal.close()
    segments = list_segments(wal_dir)
    assert len(segments) >= 4
    release_segment(segments[0], fsync=None, archive=False)  # retention deleted the oldest
    release_segment(segments[1], fsync=None, archive=True)  # and archived the next one
    assert list((wal_dir / ARCHIVE_DIR_NAME).glob("*.wal"))
    gone, archived, live, last = seqs[0], segments[1].first_seq, seqs[200], seqs[-1]
    got = records_at(wal_dir, [gone, archived, live, last, last + 10])
    assert sorted(got) == [archived, live, last]  # what the log no longer holds is left out
    for seq, rec in got.items():
        assert isinstance(rec, Outcome)
        assert rec.value == _value(seqs.index(seq))  # decoded exactly: bytes, tuples, sets
    assert records_at(wal_dir, []) == {}


def test_records_are_read_from_a_postgresql_stream(pg_migrated_url: str) -> None:
    from tiffany.wal.pg import PgLog, PgStream

    with PgLog.open(pg_migrated_url) as log:
        seqs = [log.append(rtype, payload) for rtype, payload in _payloads(20)]
        log.commit()
    got = records_at(PgStream(pg_migrated_url), [seqs[3], seqs[17], seqs[-1] + 1])
    assert {seq: rec.value for seq, rec in got.items()} == {
        seqs[3]: _value(3),
        seqs[17]: _value(17),
    }
