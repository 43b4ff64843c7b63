"""docs/workflows.md "Testing: replay in CI": its pytest file, run as a user's CI would run it.

The page's ``python`` block is written to a project's ``tests/``, an export
of a real ``examples/code-fanout`` run is its fixture, and pytest runs it
twice: against the code that recorded the run (it passes) and against a
changed copy whose yields differ (it fails, with the divergence).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FANOUT = REPO / "examples" / "code-fanout"


def _page_test() -> str:
    page = (REPO / "docs" / "workflows.md").read_text()
    section = page.split("## Testing: replay in CI", 1)
    assert len(section) == 2, "docs/workflows.md has no 'Testing: replay in CI' section"
    found = re.search(r"```python\n(.*?)```", section[1], re.S)
    assert found, "the section has no python block"
    assert "replay_file" in found.group(1)
    return found.group(1)


def _env(pythonpath: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env["PYTHONPATH"] = str(pythonpath)
    return env


def _pytest(project: Path, code: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=project,
        env=_env(code),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_pages_pytest_file_passes_on_the_recording_code_and_fails_on_a_change(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    (project / "tests" / "runs").mkdir(parents=True)
    (project / "tests" / "test_recorded_runs.py").write_text(_page_test())
    data_dir = tmp_path / "data"
    tiffany = [sys.executable, "-m", "tiffany"]
    ran = subprocess.run(
        [*tiffany, "run", "fanout:fanout", "--input", 'words=["a", "bc"]', "--input",
         "pause_s=0.01", "--json", "--data-dir", str(data_dir)],
        cwd=FANOUT, env=_env(FANOUT), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    run_id = json.loads(ran.stdout.strip().splitlines()[-1])["run_id"]
    fixture = project / "tests" / "runs" / "fanout-a-bc.tfx"
    exported = subprocess.run(
        [*tiffany, "export", run_id, "-o", str(fixture), "--data-dir", str(data_dir)],
        env=_env(FANOUT), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr

    same = _pytest(project, FANOUT)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "1 passed" in same.stdout

    changed = tmp_path / "changed"
    changed.mkdir()
    source = (FANOUT / "fanout.py").read_text()
    assert "yield Sleep(pause_s)" in source
    (changed / "fanout.py").write_text(source.replace("Sleep(pause_s)", "Sleep(pause_s * 2)"))
    broken = _pytest(project, changed)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "1 failed" in broken.stdout
    assert "NondeterminismError" in broken.stdout
    assert f"{changed / 'fanout.py'}:" in broken.stdout
