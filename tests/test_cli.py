"""The ``tiffany`` command line, in-process and as a real process."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from typer.main import get_command
from typer.testing import CliRunner

import tiffany
from tiffany.cli import app, plain_help

runner = CliRunner()


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Undo the logging setup that commands do, so later tests see none of it.

    Inside ``CliRunner`` the handler would otherwise keep writing to the
    runner's stream, which is closed once the command returns.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    config = structlog.get_config()
    yield
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    structlog.configure(**config)


SUBPROCESS_TIMEOUT_S = 60


def test_version_in_process() -> None:
    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"tiffany {tiffany.__version__} ")


def test_version_flag() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"tiffany {tiffany.__version__}"


def test_version_ignores_bad_configuration() -> None:
    result = runner.invoke(app, ["version"], env={"TIFFANY_PORT": "not-a-port"})
    assert result.exit_code == 0, result.output


def test_no_arguments_shows_help() -> None:
    result = runner.invoke(app, [])
    assert "version" in result.output
    assert "demo" in result.output


def test_config_prints_settings_with_secrets_masked(tmp_path: Path) -> None:
    env = {
        "TIFFANY_API_TOKEN": "s3cret-token",
        "TIFFANY_DATABASE_URL": "postgresql+psycopg://tiffany:hunter2@db:5432/tiffany",
        "TIFFANY_ENABLED_TOOLS": "shell, http",
        "TIFFANY_WAL_FSYNC": "always",
    }
    result = runner.invoke(app, ["--data-dir", str(tmp_path), "config"], env=env)
    assert result.exit_code == 0, result.output
    assert "s3cret-token" not in result.output
    assert "hunter2" not in result.output
    shown = json.loads(result.output)
    assert shown["data_dir"] == str(tmp_path)
    assert shown["database_url"] == "postgresql+psycopg://tiffany:[REDACTED]@db:5432/tiffany"
    assert shown["enabled_tools"] == ["shell", "http"]
    assert shown["wal_fsync"] == "always"
    assert shown["api_token"] is not None


def test_config_defaults_to_sqlite_under_the_data_dir(tmp_path: Path) -> None:
    env = {"TIFFANY_DATABASE_URL": "", "TIFFANY_API_TOKEN": ""}
    result = runner.invoke(app, ["--data-dir", str(tmp_path), "config"], env=env)
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["database_url"] == f"sqlite:///{tmp_path}/tiffany.db"
    assert shown["api_token"] is None


def test_bad_configuration_is_a_usage_error() -> None:
    result = runner.invoke(app, ["config"], env={"TIFFANY_WAL_FSYNC": "sometimes"})
    assert result.exit_code == 2
    assert "wal_fsync" in result.output


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        env=env,
        check=False,
    )


def test_version_as_python_m_tiffany() -> None:
    proc = _run([sys.executable, "-m", "tiffany", "version"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"tiffany {tiffany.__version__} ")


def test_version_as_console_script() -> None:
    script = shutil.which("tiffany", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("the tiffany console script is not installed next to this Python")
    proc = _run([script, "version"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"tiffany {tiffany.__version__} ")


def test_a_commands_own_data_dir_wins_over_the_global_one(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {"name": "tiny", "steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 0}}]}
        )
    )
    mine, other = tmp_path / "mine", tmp_path / "other"
    result = runner.invoke(
        app,
        [
            "--data-dir",
            str(other),
            "run",
            str(plan),
            "--no-live",
            "--json",
            "--data-dir",
            str(mine),
        ],
    )
    assert result.exit_code == 0, result.output
    assert (mine / "wal").is_dir()
    assert not (other / "wal").exists()
    listed = runner.invoke(app, ["runs", "--data-dir", str(mine)])
    assert listed.exit_code == 0, listed.output
    assert "tiny" in listed.output
    for command in ("serve", "replay", "runs", "run"):
        assert "--data-dir" in runner.invoke(app, [command, "--help"]).output


def test_help_shows_defaults_in_brackets_and_flags_without_a_type() -> None:
    """Help texts are plain: "[default: ...]" is text, not markup, and a flag takes no value."""
    out = CliRunner().invoke(app, ["serve", "--help"]).output
    assert "Address the API binds to [default: 127.0.0.1]." in out
    assert "<bool>" not in out
    assert re.search(r"^\s+--demo\s+Submit the demo plan", out, re.MULTILINE), out


def _helps(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    """Every command's ``--help`` output, the root's and each group's included."""
    shown = runner.invoke(app, [*path, "--help"], terminal_width=100)
    assert shown.exit_code == 0, (path, shown.output)
    yield " ".join(("tiffany", *path)), shown.output
    for name, sub in sorted((getattr(command, "commands", None) or {}).items()):
        yield from _helps(sub, (*path, name))


#: What reST (the docstrings' markup) and Python's types look like in a help text.
MARKUP = re.compile(r"``|:(func|class|mod|meth|attr|data|exc|obj|ref):`|^\s*\\b\s*$|<list\[")


def test_no_help_shows_rest_markup_or_python_types() -> None:
    """``--help`` printed the docstrings' reST as it is: ````serve````, ``:func:``...

    Every command's help, found by walking the app (a command added later is
    checked too), is plain text: literals in single backquotes, a repeatable
    option named by its value (``--input KEY=VALUE``), not ``<list[str]>``.
    """
    helps = dict(_helps(get_command(app)))
    assert {"tiffany", "tiffany run", "tiffany plan validate", "tiffany wal repair"} <= set(helps)
    marked = {
        name: [line for line in text.splitlines() if MARKUP.search(line)]
        for name, text in helps.items()
    }
    assert {name: lines for name, lines in marked.items() if lines} == {}
    assert "Run the engine process alone (what `serve` starts)" in helps["tiffany engine"]
    assert "-i, --input KEY=VALUE" in helps["tiffany submit"]


def test_plain_help_rewrites_roles_and_literals() -> None:
    text = "See :func:`~tiffany.x.redact`, :class:`Settings <tiffany.config.Settings>`, ``serve``."
    assert plain_help(text) == "See `redact`, `Settings`, `serve`."


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_the_approval_example_runs_offline_with_its_signal_up_front(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "tiffany", "--data-dir", str(tmp_path), "run", "--json"]
    plan = str(EXAMPLES / "approval" / "plan.yaml")
    approval = 'approve={"approved": true, "by": "alice", "note": "ship it"}'
    done = _run([*cmd, plan, "--signal", approval])
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["outputs"] == {"approved_by": "alice", "published": "published.md"}
    published = tmp_path / "workspaces" / result["run_id"] / "published.md"
    assert published.read_text() == "Release 1.4.0, approved by alice."


def test_a_signal_option_its_waits_schema_refuses_is_refused_before_the_run(
    tmp_path: Path,
) -> None:
    """The approval example's schema holds ``--signal`` as a server holds a sent signal."""
    cmd = [sys.executable, "-m", "tiffany", "--data-dir", str(tmp_path), "run", "--json"]
    plan = str(EXAMPLES / "approval" / "plan.yaml")
    for payload, field in (('{"by": "alice"}', "approved"), ('{"approved": true}', "by")):
        refused = _run([*cmd, plan, "--signal", f"approve={payload}"])
        assert refused.returncode == 2, refused.stderr
        assert "--signal signal approve's payload does not satisfy step approve's schema" in (
            refused.stderr
        )
        assert f"  body.{field}: '{field}' is a required property" in refused.stderr
    assert not (tmp_path / "wal").exists()  # refused before the engine opened the data dir


def test_a_bad_signal_option_is_refused_naming_it(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "tiffany", "--data-dir", str(tmp_path), "run", "--json"]
    plan = str(EXAMPLES / "approval" / "plan.yaml")
    bad_json = _run([*cmd, plan, "--signal", "approve={oops"])
    assert bad_json.returncode == 2
    assert "--signal approve: malformed JSON at byte 1" in bad_json.stderr
    bad_name = _run([*cmd, plan, "--signal", "no name=1"])
    assert bad_name.returncode == 2
    assert "--signal wants NAME=JSON" in bad_name.stderr
    assert not (tmp_path / "wal").exists()  # refused before the engine opened the data dir


def test_a_ctrl_c_after_the_loop_ended_is_counted_not_raised() -> None:
    """``run``/``replay`` read the run's state and close the WAL after their loop ends.

    A Ctrl-C there raised ``KeyboardInterrupt`` (the handler covered only the
    loop) and the command exited 130 without saying what became of the run.
    """
    import os
    import signal

    from tiffany.cli.interrupt import CtrlC
    from tiffany.kernel import Scheduler

    sched = Scheduler()
    before = signal.getsignal(signal.SIGINT)
    with CtrlC(sched) as ctrl_c:
        with ctrl_c.loop():
            sched.run()  # nothing to run: the loop ends by itself
        os.kill(os.getpid(), signal.SIGINT)  # as the state is read, the WAL closed
        assert ctrl_c.pressed == 1
    assert signal.getsignal(signal.SIGINT) is before


def test_an_option_error_names_the_option_as_it_was_given(tmp_path: Path) -> None:
    """A bad ``TIFFANY_URL`` was told as ``--url: url: ...``, and ``-i k`` as ``--input``."""
    plan = tmp_path / "p.json"
    step = {"id": "a", "tool": "sleep", "args": {"seconds": 0}}
    plan.write_text(json.dumps({"name": "p", "steps": [step]}))
    from_env = runner.invoke(app, ["submit", str(plan)], env={"TIFFANY_URL": "htp:/x"})
    assert from_env.exit_code == 2
    assert from_env.output.splitlines() == ["tiffany: TIFFANY_URL: not an http(s) URL: 'htp:/x'"]
    typed = runner.invoke(app, ["submit", str(plan), "--url", "htp:/x"])
    assert typed.output.splitlines() == ["tiffany: --url: not an http(s) URL: 'htp:/x'"]
    for flag in ("-i", "--input"):
        bad = runner.invoke(app, ["run", str(plan), flag, "k", "--data-dir", str(tmp_path)])
        assert bad.exit_code == 2
        assert bad.output.splitlines() == [f"tiffany: {flag} wants key=value, got 'k'"]
    undeclared = runner.invoke(app, ["run", str(plan), "-i", "k=1", "--data-dir", str(tmp_path)])
    assert undeclared.exit_code == 2
    assert undeclared.output.splitlines() == [
        "tiffany: -i k: not an input of this plan (inputs: none)"
    ]
    assert not (tmp_path / "wal").exists()
