"""examples/code-fanout: run with ``tiffany run fanout:fanout``, then verified with replay."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "code-fanout"


def _tiffany(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    return subprocess.run(
        [sys.executable, "-m", "tiffany", *args, "--data-dir", str(data_dir)],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_the_code_fanout_example_runs_and_replays_identically(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    ran = _tiffany(
        "run",
        "fanout:fanout",
        "--input",
        'words=["durable", "code", "replay"]',
        "--input",
        "pause_s=0.01",
        "--json",
        data_dir=data_dir,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    assert result["status"] == "succeeded"
    scores = result["outputs"]["scores"]
    assert [s["word"] for s in scores] == ["durable", "code", "replay"]
    expected = {w: sum(ord(c) for c in w) % 97 for w in ("durable", "code", "replay")}
    assert {s["word"]: s["score"] for s in scores} == expected
    assert result["outputs"]["best"] == max(expected, key=lambda w: expected[w])
    report = data_dir / "workspaces" / result["run_id"] / "report.txt"
    assert report.read_text().splitlines()[0] == f"durable: {expected['durable']}"
    verified = _tiffany(
        "replay", result["run_id"], "--verify", "--import", "fanout", "--json", data_dir=data_dir
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert json.loads(verified.stdout)["ok"] is True


def test_tiffany_run_refuses_a_function_that_is_no_workflow_and_bad_inputs(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    no_workflow = _tiffany("run", "fanout:score", data_dir=data_dir)
    assert no_workflow.returncode == 2
    assert "has no @workflow function 'score'" in no_workflow.stderr
    assert "code-fanout" in no_workflow.stderr
    missing = _tiffany("run", "fanout:fanout", "--input", "word=x", data_dir=data_dir)
    assert missing.returncode == 2
    assert "--input word: workflow 'code-fanout' (fanout:fanout) takes no input 'word'" in (
        missing.stderr
    )
    assert "did you mean 'words'?" in missing.stderr
    assert "--input words: missing required input 'words'" in missing.stderr
