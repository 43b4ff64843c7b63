"""``tiffany run`` and ``tiffany plan`` as a user runs them (real subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def tiffany(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def user_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``tiffany --data-dir CWD/data ARGS`` run in ``cwd`` (a user's tool modules beside it).

    No ``TIFFANY_*`` of the caller's environment: what the command line says is all it gets.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    return subprocess.run(
        [sys.executable, "-m", "tiffany", "--data-dir", str(cwd / "data"), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def test_run_prints_outputs_and_exits_zero(tmp_path):
    proc = tiffany(
        "run", str(ROOT / "examples" / "build" / "plan.yaml"), "--json", data_dir=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "succeeded"
    assert out["outputs"]["tests"] == "wordcount: ok\n"
    assert out["steps"]["flaky_integration"] == "succeeded"
    assert (tmp_path / "wal").is_dir()
    assert (tmp_path / "workspaces" / out["run_id"] / "dist").is_dir()
    # the embedded SQLite store holds the run, its steps and tasks
    import sqlite3

    db = sqlite3.connect(tmp_path / "tiffany.db")
    status = db.execute("select status from runs where run_id = ?", (out["run_id"],)).fetchone()
    assert status == ("succeeded",)
    steps = dict(db.execute("select step_id, status from steps where run_id = ?", (out["run_id"],)))
    assert steps == dict.fromkeys(out["steps"], "succeeded")


def test_a_run_that_never_writes_makes_no_workspace(tmp_path):
    # A step gets its workspace's path alone; file tools make it when they
    # write (in the thread pool), so the scheduler thread makes no directory
    # for a sleep.
    plan = tmp_path / "naps.json"
    plan.write_text(
        json.dumps(
            {
                "name": "naps",
                "steps": [
                    {"id": "a", "tool": "sleep", "args": {"seconds": 0.01}},
                    {"id": "b", "tool": "sleep", "args": {"seconds": 0.01}, "after": ["a"]},
                ],
            }
        )
    )
    data = tmp_path / "data"
    proc = tiffany("run", str(plan), "--json", data_dir=data)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "succeeded"
    assert not (data / "workspaces" / out["run_id"]).exists()


def test_a_failing_plan_exits_one_with_the_failed_step(tmp_path):
    plan = tmp_path / "p.json"
    plan.write_text(
        json.dumps(
            {
                "name": "fails",
                "steps": [
                    {
                        "id": "bad",
                        "tool": "shell",
                        "args": {"argv": ["sh", "-c", "echo nope >&2; exit 3"]},
                    },
                    {"id": "after_bad", "tool": "sleep", "args": {"seconds": 0}, "after": ["bad"]},
                ],
            }
        )
    )
    proc = tiffany("run", str(plan), "--json", data_dir=tmp_path / "d")
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    assert out["status"] == "failed"
    assert out["steps"]["bad"]["status"] == "failed"
    assert out["steps"]["bad"]["error"]["code"] == "tool.shell.exit"
    assert out["steps"]["after_bad"]["status"] == "skipped"


def test_an_invalid_plan_exits_two_naming_the_field(tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text("name: x\nsteps:\n  - id: a\n    tool: sleep\n    after: [nope]\n")
    for cmd in (("run", str(plan)), ("plan", "validate", str(plan))):
        proc = tiffany(*cmd, data_dir=tmp_path / "d")
        assert proc.returncode == 2
        assert "steps[0].after[0]: unknown step 'nope'" in proc.stderr
    assert not (tmp_path / "d" / "wal").exists()  # nothing was opened, nothing written


def test_a_key_given_twice_in_a_plan_file_exits_two_naming_it(tmp_path):
    """The last of two ``tool:`` (or ``name:``, or an argument) won silently."""
    yaml_plan = tmp_path / "p.yaml"
    yaml_plan.write_text(
        "name: x\nsteps:\n  - id: a\n    tool: sleep\n    tool: sleep\n    args: {seconds: 0}\n"
    )
    json_plan = tmp_path / "p.json"
    json_plan.write_text(
        '{"name": "x", "name": "y", "steps": [{"id": "a", "tool": "sleep", "args": {}}]}'
    )
    cases = {
        yaml_plan: "steps[0].tool: p.yaml: not valid yaml: key given twice",
        json_plan: "name: p.json: not valid json: key given twice",
    }
    for path, message in cases.items():
        for cmd in (("run", str(path)), ("plan", "validate", str(path))):
            proc = tiffany(*cmd, data_dir=tmp_path / "d")
            assert proc.returncode == 2, proc.stderr
            assert message in proc.stderr
    assert not (tmp_path / "d" / "wal").exists()


def test_a_plan_path_that_is_no_text_file_exits_two_without_a_traceback(tmp_path):
    binary = tmp_path / "p.yaml"
    binary.write_bytes(b"name: x\nsteps: []\n\xff\xfe")
    cases = {
        str(binary): "p.yaml: not UTF-8 text: byte 0xff at offset 18",
        str(tmp_path): f"cannot read plan file {tmp_path}: Is a directory",
    }
    for path, message in cases.items():
        for cmd in (("run", path), ("plan", "validate", path)):
            proc = tiffany(*cmd, data_dir=tmp_path / "d")
            assert proc.returncode == 2, proc.stderr
            assert message in proc.stderr
            assert "Traceback" not in proc.stderr
    assert not (tmp_path / "d" / "wal").exists()


def test_plan_graph_text_and_mermaid(tmp_path):
    plan = str(ROOT / "examples" / "build" / "plan.yaml")
    text = tiffany("plan", "graph", plan, data_dir=tmp_path)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith("write_lib [file.write]") or lines[0].startswith("write_test")
    assert any("package [shell]  <- flaky_integration" in ln for ln in lines)
    mermaid = tiffany("plan", "graph", plan, "--mermaid", data_dir=tmp_path)
    assert mermaid.stdout.splitlines()[0] == "flowchart TD"
    assert "    test --> flaky_integration" in mermaid.stdout


def test_the_task_summary_shows_the_runs_tree_not_a_steps_insides(tmp_path):
    """A shell step's body and its pipe readers (pidN.stdout...) are not the run's tasks."""
    plan = tmp_path / "sh.json"
    argv = [sys.executable, "-c", "print('hi')"]
    plan.write_text(
        json.dumps({"name": "sh", "steps": [{"id": "s", "tool": "shell", "args": {"argv": argv}}]})
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tiffany", "--data-dir", str(tmp_path / "d"), "run", str(plan)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "TIFFANY_SHELL_SANDBOX": "none", "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stderr.splitlines() if line.startswith("│")]
    names = [row.split("│")[2].strip() for row in rows]
    assert names == ["sh", "worker:s", "tool:shell:s"], proc.stderr
    assert all("succeeded" in row for row in rows)


def test_run_and_wal_dump_print_values_json_cannot_hold_as_the_store_shows_them(tmp_path):
    # A tuple key and NaN from a python tool: `run --json` and `wal dump`
    # ended in a TypeError traceback, or printed NaN, which is no JSON.
    (tmp_path / "oddtools.py").write_text(
        "from tiffany import python_tool\n\n"
        "@python_tool('test.odd')\n"
        "def odd():\n"
        "    return {(1, 2): 'a', 'nan': float('nan')}\n"
    )
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "name": "odd",
                "steps": [{"id": "a", "tool": "python", "args": {"function": "test.odd"}}],
                "outputs": {"v": "${steps.a.output}"},
            }
        )
    )
    run = user_cli(tmp_path, "run", str(plan), "--json", "--import", "oddtools")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1], parse_constant=pytest.fail)
    assert out["outputs"] == {"v": {"(1, 2)": "a", "nan": "nan"}}
    for extra in (["--json"], []):
        dump = user_cli(tmp_path, "wal", "dump", "--run", out["run_id"], *extra)
        assert dump.returncode == 0, dump.stderr
        assert '{"(1, 2)": "a", "nan": "nan"}' in dump.stdout


def test_replay_takes_the_tool_modules_a_crashed_run_needs(tmp_path):
    # `tiffany run --import mytools` crashes in a python step; `tiffany replay RUN`
    # imported no module (neither --import, which it lacked, nor
    # TIFFANY_TOOL_MODULES): the step was held, the run stayed "running", and
    # nothing but a log line said why.
    (tmp_path / "crashtools.py").write_text(
        "import os, signal\n"
        "from pathlib import Path\n"
        "from tiffany import python_tool\n\n"
        "@python_tool('test.crash_once')\n"
        "def crash_once(n: int) -> dict:\n"
        "    mark = Path('crashed.mark')\n"
        "    if not mark.exists():  # the first call takes the process down\n"
        "        mark.write_text('x')\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return {'n': n * 2}\n"
    )
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "name": "crashy",
                "steps": [
                    {
                        "id": "a",
                        "tool": "python",
                        "args": {"function": "test.crash_once", "kwargs": {"n": 21}},
                    },
                ],
                "outputs": {"n": "${steps.a.output.n}"},
            }
        )
    )
    crashed = user_cli(tmp_path, "run", str(plan), "--json", "--no-live", "--import", "crashtools")
    assert crashed.returncode == -9, crashed.stderr
    run_id = json.loads(user_cli(tmp_path, "runs", "--json").stdout.splitlines()[0])["run_id"]

    without = user_cli(tmp_path, "replay", run_id, "--no-live")
    assert without.returncode != 0
    assert f"run {run_id} cannot go on here: python function test.crash_once" in without.stderr
    assert "--import" in without.stderr

    resumed = user_cli(tmp_path, "replay", run_id, "--no-live", "--json", "--import", "crashtools")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["outputs"] == {"n": 42}


def test_a_failed_python_step_prints_its_traceback_as_python_does(tmp_path):
    """`tiffany run` and `tiffany status RUN` showed a failed step's type and message only."""
    (tmp_path / "parsetools.py").write_text(
        "from tiffany import python_tool\n\n"
        "def count(text):\n"
        "    return int(text)\n\n"
        "@python_tool('test.count')\n"
        "def counted(text: str) -> int:\n"
        "    return count(text)\n"
    )
    plan = tmp_path / "plan.json"
    args = {"function": "test.count", "kwargs": {"text": "x"}}
    step = {"id": "c", "tool": "python", "args": args}
    plan.write_text(json.dumps({"name": "counting", "steps": [step]}))
    failed = user_cli(tmp_path, "run", str(plan), "--no-live", "--import", "parsetools")
    assert failed.returncode == 1, failed.stderr
    where = str(tmp_path / "parsetools.py")
    expected = (
        "step c failed: Traceback (most recent call last):\n"
        f'  File "{where}", line 8, in counted\n'
        "    return count(text)\n"
        f'  File "{where}", line 4, in count\n'
        "    return int(text)\n"
        "tool.python.error: python tool 'test.count' raised ValueError: "
        "invalid literal for int() with base 10: 'x'\n"
    )
    assert expected in failed.stderr
    error = json.loads(failed.stdout)["steps"]["c"]["error"]
    assert [f["line"] for f in error["traceback"]] == [8, 4]
    run_id = json.loads(failed.stdout)["run_id"]
    shown = user_cli(tmp_path, "status", run_id)
    assert shown.returncode == 0, shown.stderr
    assert expected in shown.stderr
    assert json.loads(shown.stdout)["steps"]["c"]["error"]["traceback"] == error["traceback"]
    assert user_cli(tmp_path, "status", "run-nope").returncode == 3
