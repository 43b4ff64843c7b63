"""Run exports: written from a journal, read back and checked, replayed against changed code.

``tiffany export RUN`` and ``tiffany replay FILE --verify`` as a user runs
them (real subprocesses), ``tiffany.testing.replay_file`` as a test suite
calls it, the format held to docs/replay.md, and every byte of a file
truncated and flipped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import export_workloads
import pytest

import tiffany
from tiffany.config import Settings
from tiffany.durable import Runtime
from tiffany.durable import export as fmt
from tiffany.durable.export import export_run, is_export, read_export
from tiffany.errors import ExportError, ExportTooNew, NondeterminismError
from tiffany.kernel import Instrument
from tiffany.testing import replay_file
from tiffany.wal import spans_of
from tiffany.wire.records import JOURNAL_COMPAT, RecordType

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GOLDEN = ROOT / "tests" / "data" / "golden"
DOC = ROOT / "docs" / "replay.md"


@pytest.fixture(autouse=True)
def _mode_a():
    export_workloads.MODE["value"] = "a"
    export_workloads.CALLS.clear()
    yield
    export_workloads.MODE["value"] = "a"


def _callable_run(data_dir: Path, run_id: str = "fan-run") -> str:
    with Runtime(data_dir) as rt:
        rt.submit("export_workloads:fan", 3, run_id=run_id)
        rt.run()
        assert rt.status(run_id).status == "succeeded"
    return run_id


def _plan_run(data_dir: Path, run_id: str = "plan-run") -> str:
    from tiffany.engine import build

    engine = build(Settings(data_dir=data_dir, _env_file=None), enabled_tools=["python"])
    with engine.runtime as rt:
        engine.submit_plan(export_workloads.PLAN, run_id=run_id)
        rt.run()
        state = rt.status(run_id)
        assert state.status == "succeeded", state.error
        assert state.result["outputs"] == {"a": 3, "b": 1}
    return run_id


def _export(data_dir: Path, run_id: str, out: Path) -> fmt.ExportMeta:
    return export_run(data_dir / "wal", run_id, out, tiffany_version=tiffany.__version__)


# -- the format -----------------------------------------------------------------


def test_the_constants_match_the_format_document():
    text = DOC.read_text()
    table = dict(re.findall(r"^\| `([A-Z_]+)` \| `([^`]+)` \|", text, re.M))
    assert table["EXPORT_MAGIC"] == repr(fmt.EXPORT_MAGIC)
    assert int(table["EXPORT_VERSION"]) == fmt.EXPORT_VERSION
    assert int(table["HEADER_SIZE_BYTES"]) == fmt.HEADER_SIZE_BYTES == fmt.HEADER.size
    assert int(table["SEQ_SIZE_BYTES"]) == fmt.SEQ.size
    assert table["FORMAT_NAME"] == fmt.FORMAT_NAME
    assert int(table["MAX_META_BYTES"]) == fmt.MAX_META_BYTES


def test_an_export_holds_the_runs_records_as_journaled_with_their_seqs(tmp_path):
    data = tmp_path / "data"
    _callable_run(data, "other")  # another run's records are left out
    run_id = _callable_run(data)
    meta = _export(data, run_id, tmp_path / "run.tfx")
    wal = [
        (seq, rtype, bytes(d[a:b]))
        for seq, rtype, d, a, b, _ in spans_of(data / "wal")
        if seq >= meta.first_seq
    ]
    exported = read_export(tmp_path / "run.tfx")
    got = [(seq, rtype, bytes(d[a:b])) for seq, rtype, d, a, b, _ in exported.spans()]
    assert got == wal  # the second run is the last: every record from its start is its own
    assert got[0][1] == RecordType.RUN_START
    assert got[-1][1] == RecordType.RUN_END
    assert exported.meta == meta
    assert meta.to_dict() | {"exported_at": "-"} == {
        "format": "tiffany.run-export",
        "version": 1,
        "run_id": run_id,
        "name": "export_workloads:fan",
        "status": "succeeded",
        "journal_compat": JOURNAL_COMPAT,
        "records": len(wal),
        "first_seq": wal[0][0],
        "last_seq": wal[-1][0],
        "journal": (data / "wal" / "JOURNAL").read_text().strip(),
        "tiffany_version": tiffany.__version__,
        "exported_at": "-",
    }
    raw = (tmp_path / "run.tfx").read_bytes()
    assert raw.startswith(fmt.EXPORT_MAGIC)
    assert b'"run_id": "fan-run"' in raw[:600]  # `head -c 600 FILE` says what it is
    assert is_export(tmp_path / "run.tfx")
    assert not is_export(data / "wal" / "JOURNAL")


# -- replay: identical, then changed code -------------------------------------------


def test_a_callable_run_replays_from_its_export_and_a_change_is_named(tmp_path):
    run_id = _callable_run(tmp_path / "data")
    path = tmp_path / "fan.tfx"
    _export(tmp_path / "data", run_id, path)
    shutil.rmtree(tmp_path / "data")  # the file is self-contained
    report = replay_file(path)
    assert report.ok
    assert not report.partial
    assert report.status == "succeeded"
    export_workloads.MODE["value"] = "b"  # the code changed: a Sleep where a Now() was
    with pytest.raises(NondeterminismError) as diverged:
        replay_file(path)
    err = diverged.value
    assert f"run {run_id}" in str(err)
    assert str(path) in str(err)
    assert err.fields["task"] == 1  # the root
    assert err.fields["actual"][2] == "sleep"
    assert err.fields["expected"][2] == "now"
    seqs = [seq for seq, *_ in read_export(path).spans()]
    assert err.fields["seq"] in seqs  # the seq in the journal it was exported from
    assert any("export_workloads.py" in frame for frame in err.fields["stack"])


def test_a_plan_run_replays_from_its_export_without_calling_its_tools(tmp_path):
    run_id = _plan_run(tmp_path / "data")
    path = tmp_path / "plan.tfx"
    _export(tmp_path / "data", run_id, path)
    calls = list(export_workloads.CALLS)
    report = replay_file(path, imports=["export_workloads"])
    assert report.ok
    assert report.status == "succeeded"
    # A python step is one durable step: its recorded result is reused, so a
    # change inside the tool is no divergence (the plan itself is in the export).
    export_workloads.MODE["value"] = "b"
    assert replay_file(path, imports=["export_workloads"]).ok
    assert calls == export_workloads.CALLS  # no tool ran


class _StopAtJoin(Instrument):
    """Stop the scheduler once the root waits for its children: the run stays unfinished."""

    def __init__(self, sched_ref: list) -> None:
        self.sched_ref = sched_ref

    def task_blocked(self, task, call) -> None:
        if getattr(call, "kind", "") == "wait_task" and task.name == "export_workloads:fan":
            self.sched_ref[0].stop()


def test_an_unfinished_run_replays_up_to_the_end_of_its_journal(tmp_path):
    ref: list = []
    with Runtime(tmp_path / "data", instruments=[_StopAtJoin(ref)]) as rt:
        ref.append(rt.sched)
        rt.submit("export_workloads:fan", 3, run_id="in-flight")
        rt.run()
        assert rt.status("in-flight").status == "running"
    path = tmp_path / "in-flight.tfx"
    meta = _export(tmp_path / "data", "in-flight", path)
    assert meta.status == "running"
    assert not meta.finished
    report = replay_file(path)
    assert report.ok
    assert report.partial
    assert report.status == "running"
    export_workloads.MODE["value"] = "b"  # a deploy that would break this run in flight
    with pytest.raises(NondeterminismError, match="diverged from the journal"):
        replay_file(path)


@pytest.mark.parametrize("run_id", ["inflight-plan", "inflight-sleeper"])
def test_a_golden_run_in_flight_exports_and_replays_its_prefix(tmp_path, run_id):
    data = tmp_path / "inflight"
    shutil.copytree(GOLDEN / "inflight_v2", data)
    meta = _export(data, run_id, tmp_path / "x.tfx")
    assert not meta.finished
    assert meta.journal_compat == 2
    report = replay_file(tmp_path / "x.tfx")
    assert report.ok
    assert report.partial


def _records_at(raw: bytes) -> int:
    """Where the first record starts: after the header and the meta it announces."""
    return fmt.HEADER_SIZE_BYTES + int.from_bytes(raw[12:16], "little")


def read_export_bytes(tmp_path: Path, raw: bytes) -> fmt.Export:
    (tmp_path / "read.tfx").write_bytes(raw)
    return read_export(tmp_path / "read.tfx")


def test_the_golden_exports_of_format_1_replay_as_recorded():
    """Written once by tests/data/make_export_golden.py: every later version reads them."""
    import durable_workloads

    exports = GOLDEN / "exports"
    report = replay_file(exports / "fan_in.tfx", imports=["durable_workloads"])
    assert report.ok
    assert read_export(exports / "fan_in.tfx").meta.version == 1
    durable_workloads.MODE["value"] = "a"  # recorded in mode b: this code takes another path
    with pytest.raises(NondeterminismError) as diverged:
        replay_file(exports / "nondeterministic.tfx")
    assert diverged.value.fields["run_id"] == "golden-nondeterministic"
    assert any("moody" in frame for frame in diverged.value.fields["stack"])


# -- bad files --------------------------------------------------------------------------


@pytest.fixture
def exported(tmp_path) -> bytes:
    run_id = _callable_run(tmp_path / "data")
    _export(tmp_path / "data", run_id, tmp_path / "good.tfx")
    return (tmp_path / "good.tfx").read_bytes()


def test_a_file_cut_at_any_byte_is_refused_naming_the_offset(tmp_path, exported):
    cut = tmp_path / "cut.tfx"
    for size in range(len(exported)):
        cut.write_bytes(exported[:size])
        with pytest.raises(ExportError) as refused:
            read_export(cut)
        offset = refused.value.fields["offset"]
        assert 0 <= offset <= size, (size, refused.value)
        assert f"byte offset {offset}" in str(refused.value)
    records_at = _records_at(exported)
    cut.write_bytes(exported[: records_at + 5])  # inside the first record's header
    with pytest.raises(ExportError, match=f"byte offset {records_at}: truncated"):
        read_export(cut)


def test_a_flipped_bit_anywhere_is_refused(tmp_path, exported):
    bad = tmp_path / "bad.tfx"
    for i in range(len(exported)):
        raw = bytearray(exported)
        raw[i] ^= 0x04
        bad.write_bytes(bytes(raw))
        with pytest.raises(ExportError):  # ExportTooNew too, for the version's bytes
            read_export(bad)


def test_a_damaged_record_names_its_byte_offset(tmp_path, exported):
    meta_end = _records_at(exported)
    second = meta_end + 9 + int.from_bytes(exported[meta_end + 4 : meta_end + 8], "little")
    raw = bytearray(exported)
    raw[second + 20] ^= 0xFF  # inside the second record's body
    (tmp_path / "bad.tfx").write_bytes(bytes(raw))
    with pytest.raises(ExportError) as refused:
        read_export(tmp_path / "bad.tfx")
    assert refused.value.fields["offset"] == second
    assert f"byte offset {second}: damaged: record 2: bad checksum" in str(refused.value)


def test_a_newer_format_version_is_refused_clearly(tmp_path, exported):
    raw = bytearray(exported)
    raw[8:10] = (fmt.EXPORT_VERSION + 1).to_bytes(2, "little")
    (tmp_path / "new.tfx").write_bytes(bytes(raw))
    with pytest.raises(ExportTooNew) as refused:
        read_export(tmp_path / "new.tfx")
    assert refused.value.fields["version"] == fmt.EXPORT_VERSION + 1
    assert "newer than this tiffany reads" in str(refused.value)


def test_a_run_of_a_newer_journal_version_is_refused_clearly(tmp_path, exported):
    meta = read_export_bytes(tmp_path, exported).meta
    newer = dataclasses.replace(meta, journal_compat=JOURNAL_COMPAT + 1)
    (tmp_path / "compat.tfx").write_bytes(fmt._header(newer) + exported[_records_at(exported) :])
    with pytest.raises(ExportTooNew, match=f"journal version {JOURNAL_COMPAT + 1}"):
        read_export(tmp_path / "compat.tfx")


def test_an_unknown_run_is_refused(tmp_path):
    from tiffany.durable import UnknownRun

    _callable_run(tmp_path / "data")
    with pytest.raises(UnknownRun):
        _export(tmp_path / "data", "nope", tmp_path / "nope.tfx")
    assert not (tmp_path / "nope.tfx").exists()


# -- PostgreSQL ---------------------------------------------------------------------


def test_a_run_in_the_postgres_journal_exports_like_one_in_a_file(tmp_path, pg_migrated_url):
    from tiffany.wal.pg import PgLog, PgStream

    with Runtime(tmp_path / "engine", log=PgLog.open(pg_migrated_url)) as rt:
        rt.submit("export_workloads:fan", 3, run_id="pg-run")
        rt.run()
    meta = export_run(PgStream(pg_migrated_url), "pg-run", tmp_path / "pg.tfx", tiffany_version="x")
    assert meta.journal == "postgres:main"
    assert meta.status == "succeeded"
    assert replay_file(tmp_path / "pg.tfx").ok
    proc = _cli(
        "export",
        "pg-run",
        "-o",
        str(tmp_path / "cli.tfx"),
        data_dir=tmp_path / "engine",
        TIFFANY_JOURNAL="postgres",
        TIFFANY_DATABASE_URL=pg_migrated_url,
    )
    assert proc.returncode == 0, proc.stderr
    assert [s for s, *_ in read_export(tmp_path / "cli.tfx").spans()] == [
        s for s, *_ in read_export(tmp_path / "pg.tfx").spans()
    ]


# -- the CLI, as a user runs it ---------------------------------------------------------


def _cli(*args: str, data_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]),
        TIFFANY_LOG_FORMAT="json",
        TIFFANY_LOG_LEVEL="warning",
        **env,
    )
    return subprocess.run(
        [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=120,
        check=False,
        cwd=data_dir.parent,
    )


def test_the_cli_exports_and_replays_a_plan_run(tmp_path):
    data = tmp_path / "data"
    run_id = _plan_run(data)
    done = _cli("export", run_id, data_dir=data)
    assert done.returncode == 0, done.stderr
    path = tmp_path / f"{run_id}.tfx"  # the default name, in the working directory
    assert f"exported run {run_id}" in done.stdout
    assert path.exists()
    ok = _cli(
        "replay",
        str(path),
        "--verify",
        "--import",
        "export_workloads",
        data_dir=tmp_path / "elsewhere",  # no journal needed: the file is the run
    )
    assert ok.returncode == 0, ok.stderr
    assert f"run {run_id} (from {path}) replays identically" in ok.stdout


def test_the_cli_names_the_divergence_of_changed_code(tmp_path):
    data = tmp_path / "data"
    run_id = _callable_run(data)
    path = tmp_path / "fan.tfx"
    assert _cli("export", run_id, "-o", str(path), data_dir=data).returncode == 0
    changed = _cli("replay", str(path), "--verify", data_dir=data, TIFFANY_EXPORT_MODE="b")
    assert changed.returncode == 1, changed.stderr
    assert f"run {run_id} (from {path}) does NOT replay identically" in changed.stderr
    assert "expected (journal):" in changed.stderr
    assert "'now'" in changed.stderr
    assert "export_workloads.py" in changed.stderr  # the code's stack
    as_json = _cli(
        "replay", str(path), "--verify", "--json", data_dir=data, TIFFANY_EXPORT_MODE="b"
    )
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["divergence"]["code"] == "replay.nondeterminism"


def test_the_cli_refuses_bad_files_with_their_exit_codes(tmp_path):
    data = tmp_path / "data"
    run_id = _callable_run(data)
    out = tmp_path / "run.tfx"
    assert _cli("export", run_id, "-o", str(out), data_dir=data).returncode == 0
    unfinished = _cli("replay", str(out), data_dir=data)  # an export is verified, not resumed
    assert unfinished.returncode == 2
    assert "--verify" in unfinished.stderr
    raw = out.read_bytes()
    (tmp_path / "cut.tfx").write_bytes(raw[:-3])
    cut = _cli("replay", str(tmp_path / "cut.tfx"), "--verify", data_dir=data)
    assert cut.returncode == 4, cut.stderr
    assert re.search(r"byte offset \d+: truncated", cut.stderr)
    newer = bytearray(raw)
    newer[8] += 1
    (tmp_path / "newer.tfx").write_bytes(bytes(newer))
    refused = _cli("replay", str(tmp_path / "newer.tfx"), "--verify", data_dir=data)
    assert refused.returncode == 2
    assert "newer than this tiffany reads" in refused.stderr
    (tmp_path / "notes.txt").write_text("hello")
    other = _cli("replay", str(tmp_path / "notes.txt"), "--verify", data_dir=data)
    assert other.returncode == 2
    assert "not a tiffany run export" in other.stderr
    unknown = _cli("export", "nope", data_dir=data)
    assert unknown.returncode == 3
    assert "no run 'nope'" in unknown.stderr
    to_stdout = subprocess.run(
        [sys.executable, "-m", "tiffany", "--data-dir", str(data), "export", run_id, "-o", "-"],
        capture_output=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), *sys.path])),
        timeout=120,
        check=False,
    )
    assert to_stdout.returncode == 0
    assert to_stdout.stdout[:8] == fmt.EXPORT_MAGIC
    assert to_stdout.stdout[fmt.HEADER_SIZE_BYTES : fmt.HEADER_SIZE_BYTES + 1] == b"{"
