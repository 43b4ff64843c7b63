"""``--import MOD`` and ``TIFFANY_TOOL_MODULES``: a user's tools from the working directory.

Each command runs as its own ``python -m tiffany`` process in a directory
holding the user's module, as a user types it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sdk_support import USER_TOOLS, clean_env

PLAN = (
    "name: count\ninputs: {text: a b c d}\nsteps:\n"
    "  - {id: count, tool: python, args: {function: word_count, "
    "kwargs: {text: '${inputs.text}'}}}\n"
    "outputs: {words: '${steps.count.output.words}'}\n"
)
BROKEN = "import json\n\nraise RuntimeError('no config file')\n"


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    (tmp_path / "usertools.py").write_text(USER_TOOLS)
    (tmp_path / "broken.py").write_text(BROKEN)
    (tmp_path / "count.yaml").write_text(PLAN)
    return tmp_path


def tiffany(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tiffany", "--data-dir", str(cwd / "d"), *args],
        cwd=cwd,
        env=clean_env() | (env or {}),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_run_imports_a_module_from_the_working_directory(cwd: Path) -> None:
    ran = tiffany(cwd, "run", "count.yaml", "--json", "--import", "usertools")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["outputs"] == {"words": 4}


def test_the_setting_names_the_modules_too(cwd: Path) -> None:
    env = {"TIFFANY_TOOL_MODULES": "usertools"}
    ran = tiffany(cwd, "run", "count.yaml", "--json", env=env)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["outputs"] == {"words": 4}


def test_without_the_module_the_function_is_unknown(cwd: Path) -> None:
    ran = tiffany(cwd, "run", "count.yaml", "--json")
    assert ran.returncode == 2  # an invalid plan: the function is not registered here
    assert "no python tool function 'word_count'" in ran.stderr


@pytest.mark.parametrize("command", ["run", "serve", "engine"])
def test_a_module_that_fails_to_import_is_one_line_and_exit_2(cwd: Path, command: str) -> None:
    args = ["run", "count.yaml"] if command == "run" else [command]
    failed = tiffany(cwd, *args, "--import", "usertools", "--import", "broken")
    assert failed.returncode == 2, failed.stderr
    assert failed.stderr.splitlines() == [
        f"tiffany: cannot import tool module 'broken': RuntimeError: no config file "
        f"(at {cwd / 'broken.py'}:3)"
    ]
    assert not (cwd / "d" / "wal").exists()  # refused before anything started


def test_a_missing_module_is_named(cwd: Path) -> None:
    env = {"TIFFANY_TOOL_MODULES": "usertools,nosuchmodule"}
    failed = tiffany(cwd, "run", "count.yaml", env=env)
    assert failed.returncode == 2
    assert failed.stderr.strip() == (
        "tiffany: cannot import tool module 'nosuchmodule': "
        "ModuleNotFoundError: No module named 'nosuchmodule'"
    )
