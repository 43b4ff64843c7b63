"""The README's quick-start workflow: its ``greet.py`` and its two commands, as written.

tests/docs runs the README's shell blocks in the repository, where no
``greet.py`` is; this test writes the README's file where a reader would
(a directory of their own) and runs the README's ``tiffany run`` and
``tiffany replay`` lines there, so the block and the commands cannot drift.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_parts() -> tuple[str, list[str]]:
    """The ``# greet.py`` python block, and the ``tiffany`` lines of the text block after it."""
    text = README.read_text()
    found = re.search(r"```python\n(# greet\.py\n.*?)```\n(.*?)```text\n(.*?)```", text, re.S)
    assert found, "README.md has no ```python block starting `# greet.py` with commands after it"
    commands = [line for line in found.group(3).splitlines() if line.startswith("tiffany ")]
    return found.group(1), commands


def _tiffany(line: str, cwd: Path, data_dir: Path) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(line)
    assert argv[0] == "tiffany"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [sys.executable, "-m", "tiffany", *argv[1:], "--data-dir", str(data_dir)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_the_readme_workflow_runs_and_replays_as_written(tmp_path: Path) -> None:
    source, commands = _readme_parts()
    assert [shlex.split(c)[1] for c in commands] == ["run", "replay"]
    code_lines = [s for s in source.splitlines() if s.strip() and not s.startswith(("#", "from"))]
    assert len(code_lines) <= 12, "the quick start's workflow stays short"
    (tmp_path / "greet.py").write_text(source)
    data_dir = tmp_path / "data"

    ran = _tiffany(commands[0], tmp_path, data_dir)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    assert result["status"] == "succeeded", result
    assert result["outputs"] == {"greeting": "HELLO ANN", "approved_by": "ann"}
    greeting = data_dir / "workspaces" / result["run_id"] / "greeting.txt"
    assert greeting.read_text() == "HELLO ANN"

    replayed = _tiffany(commands[1].replace("RUN_ID", result["run_id"]), tmp_path, data_dir)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert f"run {result['run_id']} replays identically" in replayed.stdout
