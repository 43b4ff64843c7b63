"""The durable CLI as a user runs it: real subprocesses on golden and fresh journals."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
GOLDEN = HERE.parent / "data" / "golden"


def tiffany(
    *args: str, data_dir: Path, check: bool = False, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]),
        TIFFANY_LOG_FORMAT="json",
        **extra_env,
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture
def golden(tmp_path):
    for name in ("fan_in", "nondeterministic"):
        shutil.copytree(GOLDEN / name, tmp_path / name)
    return tmp_path


def test_replay_verify_exits_zero_for_an_identical_replay(golden):
    proc = tiffany("replay", "golden-fan_in", "--verify", "--json", data_dir=golden / "fan_in")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    assert report["status"] == "succeeded"


def test_replay_verify_exits_non_zero_with_the_divergence(golden):
    proc = tiffany(
        "replay", "golden-nondeterministic", "--verify", data_dir=golden / "nondeterministic"
    )
    assert proc.returncode == 1
    assert "does NOT replay identically" in proc.stderr
    assert "expected (journal)" in proc.stderr
    assert "moody" in proc.stderr  # the task's stack names the code at fault
    as_json = tiffany(
        "replay",
        "golden-nondeterministic",
        "--verify",
        "--json",
        data_dir=golden / "nondeterministic",
    )
    assert json.loads(as_json.stdout)["divergence"]["code"] == "replay.nondeterminism"


def test_a_divergence_at_a_task_exit_names_its_wal_seq(tmp_path):
    """It said "WAL seq -1" for a divergence anywhere but at a dispatch."""
    from tiffany.durable import Runtime

    with Runtime(tmp_path) as rt:
        run_id = rt.submit("durable_workloads:changed_result")
        rt.run()
    proc = tiffany("replay", run_id, "--verify", data_dir=tmp_path, TIFFANY_GOLDEN_MODE="b")
    assert proc.returncode == 1
    assert "at dispatch #4 (WAL seq 6), task 2 (_answer)" in proc.stderr
    assert "WAL seq -1" not in proc.stderr


def test_unknown_run_is_a_clear_error(golden):
    proc = tiffany("replay", "nope", "--verify", data_dir=golden / "fan_in")
    assert proc.returncode == 3
    assert "no run 'nope'" in proc.stderr


def test_wal_dump_verify_and_runs(golden):
    data = golden / "fan_in"
    dump = tiffany("wal", "dump", "--json", data_dir=data, check=True)
    rows = [json.loads(line) for line in dump.stdout.splitlines()]
    assert rows[0]["type"] == "RUN_START"
    assert rows[-1]["type"] == "RUN_END"
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
    human = tiffany(
        "wal", "dump", "--run", "golden-fan_in", "--limit", "3", data_dir=data, check=True
    )
    assert len(human.stdout.splitlines()) == 3
    ok = tiffany("wal", "verify", "--json", data_dir=data, check=True)
    assert json.loads(ok.stdout)["ok"] is True
    runs = tiffany("runs", "--json", data_dir=data, check=True)
    assert json.loads(runs.stdout)["run_id"] == "golden-fan_in"


def test_wal_verify_and_repair_on_a_corrupted_log(golden):
    data = golden / "fan_in"
    seg = next((data / "wal").glob("*.wal"))
    raw = bytearray(seg.read_bytes())
    raw[60] ^= 0x10  # inside an early record: good records follow it
    seg.write_bytes(bytes(raw))
    bad = tiffany("wal", "verify", data_dir=data)
    assert bad.returncode == 4  # WAL_DAMAGED
    assert "corrupt" in bad.stdout.lower() or "corrupt" in bad.stderr.lower()
    refused = tiffany("wal", "repair", data_dir=data)
    assert refused.returncode == 2  # only when asked
    fixed = tiffany("wal", "repair", "--yes", data_dir=data, check=True)
    assert "repaired" in fixed.stdout
    assert json.loads(tiffany("wal", "verify", "--json", data_dir=data, check=True).stdout)["ok"]
    assert list((data / "wal").glob("*.broken"))


def test_replay_resumes_a_crashed_run(tmp_path):
    from walcut import cut_wal

    from tiffany.durable import Runtime
    from tiffany.wal import iter_records

    with Runtime(tmp_path / "full") as rt:
        rt.submit("durable_workloads:fan_in", 3, run_id="crashed")
        rt.run()
    n = sum(1 for _ in iter_records(tmp_path / "full" / "wal"))
    cut_wal(tmp_path / "full" / "wal", tmp_path / "cut" / "wal", n // 2)
    proc = tiffany("replay", "crashed", "--json", data_dir=tmp_path / "cut")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "succeeded"
    assert out["outputs"][0] == 30  # the same shape as `tiffany run` prints
    again = tiffany("replay", "crashed", "--verify", data_dir=tmp_path / "cut")
    assert again.returncode == 0, again.stderr


WAIT_PLAN = {
    "name": "waits",
    "steps": [{"id": "ok", "tool": "signal.wait", "args": {"name": "go"}}],
}
QUICK_PLAN = {"name": "quick", "steps": [{"id": "nap", "tool": "sleep", "args": {"seconds": 0}}]}


def test_runs_lists_newest_first_with_ages_and_tells_an_interrupted_run(tmp_path):
    """Day-to-day use: a finished run, then one left waiting by Ctrl-C; then a server on the dir.

    The waiting run is newest, so it comes first; with no engine on the data
    dir it is "interrupted" with the command that resumes it; once ``serve``
    holds the data dir it is "waiting" (for its signal: it needs someone).
    """
    import signal
    import time

    data = tmp_path / "d"
    for doc in (QUICK_PLAN, WAIT_PLAN):
        (tmp_path / f"{doc['name']}.json").write_text(json.dumps(doc))
    tiffany("run", str(tmp_path / "quick.json"), data_dir=data, check=True)
    env = dict(os.environ, TIFFANY_LOG_FORMAT="json")
    cmd = [sys.executable, "-m", "tiffany", "--data-dir", str(data), "run"]
    waiting = subprocess.Popen(
        [*cmd, str(tmp_path / "waits.json")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 60
    seen = ""  # what the probe read: on a loaded machine the stall's message may be in it
    while "waits for signal go" not in (out := _runs_stderr_probe(waiting)):
        seen += out
        assert time.monotonic() < deadline, seen
    seen += out
    # Ctrl-C right after the wait began (it once landed inside the dispatch and
    # journaled the worker's records twice: the resumed run then diverged).
    waiting.send_signal(signal.SIGINT)
    waiting.wait(timeout=60)
    # Read through the pipes' file objects, not communicate(): the probe's
    # readline() may have read ahead into their buffers (the hint and the
    # message after the stall came in one read), which communicate() never sees.
    assert waiting.stderr is not None
    err = seen + waiting.stderr.read()
    assert waiting.returncode == 130, err
    # The loop stops once the run only waits (one group commit after the wait
    # began, when the hint is printed): the Ctrl-C lands in the loop (the
    # replay command), or just after it stalled (how to send the signal). A
    # loaded machine (CI, once) takes the second way; both leave the run here.
    # Either way the command it prints names the data dir: a bare one finds nothing.
    in_loop = re.search(rf"`tiffany replay run-\w+ --data-dir {data}` resumes it", err)
    after_stall = (
        "waits for signal go: pass --signal NAME=JSON, or serve its data dir "
        f"(`tiffany serve --data-dir {data}`"
        in err
        and f"NAME --data JSON --data-dir {data}`" in err
    )
    assert in_loop or after_stall, err
    assert "Traceback" not in err

    listed = tiffany("runs", data_dir=data, check=True)
    lines = listed.stdout.splitlines()
    assert [line.split()[1] for line in lines] == ["interrupted", "succeeded"]
    assert lines[0].endswith("waits")
    assert lines[1].endswith("quick")
    assert " ago " in lines[0]
    assert f"`tiffany replay RUN --data-dir {data}` resumes one" in listed.stderr
    as_json = [json.loads(x) for x in tiffany("runs", "--json", data_dir=data).stdout.splitlines()]
    assert [(r["name"], r["status"], r["interrupted"]) for r in as_json] == [
        ("waits", "waiting", True),  # for its signal go, and no engine holds it
        ("quick", "succeeded", False),
    ]
    newest = tiffany("runs", "--limit", "1", data_dir=data).stdout.splitlines()
    assert [line.split()[0] for line in newest] == [lines[0].split()[0]]

    # A server on the data dir resumes the run: it waits for go, not interrupted.
    served = subprocess.Popen(
        [*cmd[:-1], "serve", "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        while not (data / "serve.json").exists():
            assert served.poll() is None
            assert time.monotonic() < deadline + 60
            time.sleep(0.1)
        assert tiffany("runs", data_dir=data, check=True).stdout.split()[1] == "waiting"
    finally:
        served.send_signal(signal.SIGTERM)
        assert served.wait(timeout=60) == 0


def _runs_stderr_probe(proc: subprocess.Popen[str]) -> str:
    """The next line of ``tiffany run``'s output (stdout and stderr), or all of it if it ended."""
    import select

    assert proc.stdout is not None
    assert proc.stderr is not None
    ready, _, _ = select.select([proc.stdout, proc.stderr], [], [], 1.0)
    got = "".join(stream.readline() for stream in ready)
    if proc.poll() is not None:
        raise AssertionError(f"tiffany run ended early: {got}{proc.stderr.read()}")
    return got
