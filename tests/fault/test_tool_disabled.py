"""Finding 11: restarting the engine with a tool disabled must not fail that tool's runs.

A real engine process runs plans with a ``shell`` step; it is killed -9 with
one run's shell step in flight and another run's still ahead (behind a
sleep), then restarted without ``shell``: both runs stay running, their
shell steps wait with the reason (engine status, store, log), nothing fails.
Restarted once more with ``shell``: both finish with the outputs of an
uncrashed twin, the in-flight step runs once more and the other once, and
``tiffany replay RUN --verify`` passes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from engine_process import EngineProc
from sqlalchemy.orm import Session

from tiffany.store import make_engine, queries
from tiffany.store.models import Step as StepRow
from tiffany.wal import iter_records
from tiffany.wire.records import RecordType, StepStart, decode, run_of

REASON = "tool shell is disabled on this engine (--enable-tool shell)"
FINISHED = ("succeeded", "failed", "cancelled")


def _plan(name: str, nap: float) -> dict[str, Any]:
    # The shell step appends a line per start to a file outside the workspace,
    # so the test counts how often it really ran.
    return {
        "name": name,
        "inputs": {"log": ""},
        "steps": [
            {"id": "nap", "tool": "sleep", "args": {"seconds": nap}},
            {
                "id": "sh",
                "tool": "shell",
                "after": ["nap"],
                "args": {
                    "argv": [
                        "sh",
                        "-c",
                        'echo started >> "$1"; sleep 1; echo "hello from $2"',
                        "sh",
                        "${inputs.log}",
                        name,
                    ]
                },
            },
            {
                "id": "last",
                "tool": "file.write",
                "after": ["sh"],
                "args": {"path": "out.txt", "content": "${steps.sh.output.stdout}"},
            },
        ],
        "outputs": {"said": "${steps.sh.output.stdout}", "bytes": "${steps.last.output.bytes}"},
    }


def _env() -> dict[str, str]:
    return {**os.environ, "TIFFANY_LOG_FORMAT": "json", "TIFFANY_SHELL_SANDBOX": "none"}


def _step_starts(data: Path) -> list[tuple[int, StepStart]]:
    """``(run_no, record)`` of every STEP_START in the WAL."""
    return [
        (run_of(r.payload), decode(r.rtype, r.payload))
        for r in iter_records(data / "wal")
        if r.rtype == RecordType.STEP_START
    ]


def _wait(cond: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _store_run(data: Path, run_id: str) -> dict[str, Any] | None:
    db = make_engine(f"sqlite:///{data / 'tiffany.db'}")
    try:
        with Session(db) as session:
            run = queries.get_run(session, run_id)
            return queries.run_detail(run) if run is not None else None
    finally:
        db.dispose()


def _waiting_events(data: Path, run_id: str) -> list[dict[str, Any]]:
    """The run's activity events that say a step waits (the feed keeps them from the start)."""
    from tiffany.feed.transport import follow

    async def main() -> list[dict[str, Any]]:
        since = 0
        while True:
            async for frame in follow(data / "feed.sock", since, run_id, reconnect=False):
                if frame.get("type") == "gone":  # seqs are times: start at the oldest kept
                    since = frame["oldest"] - 1
                    break
                if str(frame.get("label", "")).startswith("waiting: "):
                    return [frame]

    return asyncio.run(asyncio.wait_for(main(), 20))


def _held_in_store(data: Path, run_id: str) -> dict[str, Any] | None:
    detail = _store_run(data, run_id)
    if detail is None:
        return None
    tasks = [t for t in detail["tasks"] if t.get("blocked_on") == f"waiting: {REASON}"]
    return detail if tasks else None


def test_a_disabled_tool_makes_its_steps_wait_and_an_enabled_one_resumes_them(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    count_a, count_b = tmp_path / "a.count", tmp_path / "b.count"
    plan_a, plan_b = _plan("a", 0.0), _plan("b", 3.0)

    first = EngineProc(data, "--enable-tool", "shell", env=_env())
    try:
        first.wait_ready()
        run_a = first.call("submit", plan=plan_a, inputs={"log": str(count_a)})["run_id"]
        run_b = first.call("submit", plan=plan_b, inputs={"log": str(count_b)})["run_id"]
        # Kill -9 while run a's shell step is in flight (started, not finished).
        _wait(lambda: count_a.exists(), "run a's shell step to start")
    finally:
        first.stop(signal.SIGKILL)
    assert any(f.name == "shell" for _, f in _step_starts(data))
    assert not count_b.exists()  # run b is still in its nap

    second = EngineProc(data, env=_env())  # shell not enabled
    try:
        second.wait_ready()
        status = _wait(
            lambda: (s := second.call("status"))["steps_waiting"] == 2 and s,
            "both shell steps held",
        )
        held = {(w["run_id"], w["step_id"], w["tool"], w["reason"]) for w in status["waiting"]}
        assert held == {(run_a, "sh", "shell", REASON), (run_b, "sh", "shell", REASON)}
        assert status["runs_active"] == 2
        for run_id in (run_a, run_b):
            # It needs an operator: waiting, for the tool, with the reason (the
            # task's hold and the run's status may land in two projector batches).
            detail = _wait(
                lambda r=run_id: (d := _held_in_store(data, r)) and d["status"] == "waiting" and d,
                f"{run_id} held in the store, and waiting",
            )
            assert [
                (w["kind"], w["name"], w["step"], w["reason"]) for w in detail["waiting_for"]
            ] == [("tool", "shell", "sh", REASON)]
            steps = {s["step_id"]: s for s in detail["steps"]}
            assert steps["nap"]["status"] == "succeeded"
            assert steps["sh"]["status"] == "running"
            if "waiting" in StepRow.__table__.c:  # the column comes with revision 0003
                assert steps["sh"]["waiting"] == REASON
            event = _waiting_events(data, run_id)[0]
            assert event["kind"] == "blocked"
            assert event["label"] == f"waiting: {REASON}"
        # `tiffany runs` beside the engine: the journal's HOLD says waiting, and why.
        listed = subprocess.run(
            [sys.executable, "-m", "tiffany", "runs", "--data-dir", str(data)],
            capture_output=True,
            text=True,
            timeout=60,
            env=_env(),
            check=True,
        )
        for run_id in (run_a, run_b):
            (line,) = [x for x in listed.stdout.splitlines() if x.startswith(run_id)]
            assert line.split()[1] == "waiting", listed.stdout
            assert f"held: {run_id} waits: {REASON}" in listed.stderr.splitlines()
        assert second.logged("step.held")
        assert not second.logged("replay.nondeterminism")
        assert not second.logged("engine.run_diverged")
    finally:
        assert second.stop() == 0
    assert count_a.read_text() == "started\n"  # nothing ran while shell was disabled
    assert not count_b.exists()

    third = EngineProc(data, "--enable-tool", "shell", env=_env())
    try:
        third.wait_ready()
        twin = third.call("submit", plan=plan_b, inputs={"log": str(tmp_path / "twin")})["run_id"]
        done = {}
        for run_id in (run_a, run_b, twin):
            done[run_id] = _wait(
                lambda r=run_id: (d := _store_run(data, r)) and d["status"] in FINISHED and d,
                f"{run_id} to finish",
            )
            assert done[run_id]["status"] == "succeeded", done[run_id]
        assert third.call("status")["steps_waiting"] == 0
    finally:
        assert third.stop() == 0
    assert done[run_a]["outputs"] == {"said": "hello from a\n", "bytes": 13}
    assert (
        done[run_b]["outputs"]
        == done[twin]["outputs"]
        == {
            "said": "hello from b\n",
            "bytes": 13,
        }
    )
    # The step in flight at the kill ran once more; the other ran once.
    assert count_a.read_text() == "started\n" * 2
    assert count_b.read_text() == "started\n"
    attempts: dict[int, list[int]] = {}
    for run_no, fields in _step_starts(data):
        if fields.name == "shell":
            attempts.setdefault(run_no, []).append(fields.attempt)
    # Held steps are not counted as attempts: a, b and the twin started 2, 1 and 1 times.
    assert sorted(attempts.values()) == [[1], [1], [1, 2]]
    for run_id in (run_a, run_b):
        verified = subprocess.run(
            [
                sys.executable,
                "-m",
                "tiffany",
                "--data-dir",
                str(data),
                "replay",
                run_id,
                "--verify",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr


def test_the_registry_gate_holds_only_steps_of_registered_tools_that_are_disabled() -> None:
    from tiffany.agents.registry import ToolRegistry
    from tiffany.kernel import Step

    registry = ToolRegistry.default()  # shell is not enabled by default
    gate = registry.step_gate
    assert gate(None, Step(print, name="shell")) == REASON
    # An enabled python tool holds a step only while its function is not registered.
    assert "python function pkg.mod.fn is not registered" in (
        gate(None, Step(print, name="python:pkg.mod.fn")) or ""
    )
    assert gate(None, Step(print, name="python")) is None
    assert gate(None, Step(print, name="file.write")) is None
    assert gate(None, Step(print)) is None  # builtins:print, no tool
    assert gate(None, Step(print, name="shellac:x")) is None
    registry.enable(["shell"])
    assert gate(None, Step(print, name="shell")) is None
    registry.enable(["shell", "sleep"], only=True)
    assert gate(None, Step(print, name="python:pkg.mod.fn")) == (
        "tool python is disabled on this engine (--enable-tool python)"
    )
    assert registry.lookup("python").name == "python"  # found, enabled or not
