"""kill -9 in the middle of a workflow with concurrent children; resumed; verified.

The workflow (``flows.fanout``) starts two child tasks, each doing four
effects (``Step``) with a ``Sleep`` between. ``tiffany run flows:fanout``
is killed with SIGKILL once each child's third effect has run (waited on
through the effect files, not a fixed time), child ``b0``'s third effect
held in flight (it waits for a file); ``tiffany replay RUN --import flows``
resumes the run to its end; every effect whose result was journaled before
the kill ran once (counted by the files' lines), the one in flight ran again
as its second attempt (its STEP_START says so), and ``tiffany replay RUN
--verify --import flows`` replays it identically.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tiffany.durable.history import load_run, read_runs

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from process_support import wait_for  # noqa: E402

STEPS = 4


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    return env | {"TIFFANY_LOG_FORMAT": "json"}


def _tiffany(*args: str, data_dir: Path) -> list[str]:
    return [sys.executable, "-m", "tiffany", *args, "--data-dir", str(data_dir)]


def _lines(effects: Path, tag: str) -> int:
    path = effects / f"{tag}.count"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_killed_workflow_resumes_without_redoing_journaled_effects(tmp_path: Path) -> None:
    data_dir, effects = tmp_path / "data", tmp_path / "effects"
    effects.mkdir()
    (effects / "b0-2.hold").touch()  # b0-2 is in flight when the process is killed
    argv = _tiffany(
        "run",
        "flows:fanout",
        "--input",
        f"effects={effects}",
        "--input",
        f"steps={STEPS}",
        "--input",
        "pause_s=0.3",
        "--no-live",
        "--json",
        data_dir=data_dir,
    )
    log = (tmp_path / "run.log").open("wb")
    proc = subprocess.Popen(argv, cwd=HERE, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        # Both children past their second effect: b*-0 and b*-1 are journaled
        # (each child went on past them), b*-2 ran or is running.
        wait_for(
            lambda: (
                (_lines(effects, "b0-2") and _lines(effects, "b1-2")) or proc.poll() is not None
            ),
            120,
            "each child's third effect",
            interval=0.01,
        )
        assert proc.poll() is None, (tmp_path / "run.log").read_text()
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    before = {f"b{c}-{i}": _lines(effects, f"b{c}-{i}") for c in (0, 1) for i in range(STEPS)}
    assert all(before[f"b{c}-{i}"] == 1 for c in (0, 1) for i in (0, 1, 2)), before
    (effects / "b0-2.release").touch()
    unfinished = read_runs(data_dir / "wal", None, unfinished_only=True).index.runs
    run_ids = [r for r, info in unfinished.items() if not info.finished]
    assert len(run_ids) == 1, unfinished
    run_id = run_ids[0]

    resumed = subprocess.run(
        [
            *_tiffany(
                "replay", run_id, "--import", "flows", "--no-live", "--json", data_dir=data_dir
            )
        ],
        cwd=HERE,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    result = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert result["status"] == "succeeded"
    assert result["outputs"] == {"done": [[f"b{c}-{i}" for i in range(STEPS)] for c in (0, 1)]}
    after = {f"b{c}-{i}": _lines(effects, f"b{c}-{i}") for c in (0, 1) for i in range(STEPS)}
    # Journaled before the kill: never run again. In flight (at most one per
    # child, the third or fourth): run again once. Not started: run once.
    for c in (0, 1):
        for i in (0, 1):
            assert after[f"b{c}-{i}"] == 1, after
        again = [i for i in (2, 3) if after[f"b{c}-{i}"] == 2]
        assert len(again) <= 1, after
        assert all(after[f"b{c}-{i}"] in (1, 2) for i in (2, 3)), after
    assert after["b0-2"] == 2, after  # in flight at the kill: run again

    # The step in flight at the kill was started again, as its next attempt
    # (its STEP_START says so): every effect that ran twice is one of those.
    _, cursor = load_run(data_dir / "wal", run_id)
    restarted = {key for key, attempt in cursor.attempts.items() if attempt > 1}
    for c in (0, 1):
        for i in range(STEPS):
            if after[f"b{c}-{i}"] == 2:  # task b{c} is ltid 2 + c; effect i its step i + 1
                assert (2 + c, i + 1) in restarted, (after, cursor.attempts)
    assert cursor.attempts[(2, 3)] == 2

    verified = subprocess.run(
        _tiffany("replay", run_id, "--verify", "--import", "flows", "--json", data_dir=data_dir),
        cwd=HERE,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = json.loads(verified.stdout)
    assert report["ok"] is True, report
    assert report["status"] == "succeeded"
    # The verify ran no effect.
    assert after == {
        f"b{c}-{i}": _lines(effects, f"b{c}-{i}") for c in (0, 1) for i in range(STEPS)
    }
