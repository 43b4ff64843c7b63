"""``tiffany submit / status / tail / cancel`` against a real engine process."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from engine_process import EngineProc
from typer.testing import CliRunner

from tiffany.cli import app
from tiffany.feed.transport import FEED_SOCKET

runner = CliRunner()

LONG = {
    "name": "long",
    "steps": [
        {"id": "wait", "tool": "sleep", "args": {"seconds": 30}},
        {"id": "after", "tool": "sleep", "after": ["wait"], "args": {"seconds": 0}},
    ],
}


def test_submit_tail_and_cancel_from_the_command_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    engine = EngineProc(data)
    try:
        engine.wait_ready()
        plan = tmp_path / "long.json"
        plan.write_text(json.dumps(LONG))
        status = runner.invoke(app, ["status", "--data-dir", str(data)])
        assert status.exit_code == 0, status.output
        assert json.loads(status.output)["ready"] is True

        bad = runner.invoke(app, ["submit", str(plan), "--input", "x=1", "--data-dir", str(data)])
        assert bad.exit_code == 2
        assert "tiffany: --input x: not an input of this plan (inputs: none)" in bad.output

        sub = runner.invoke(
            app, ["submit", str(plan), "--idempotency-key", "k", "--data-dir", str(data)]
        )
        assert sub.exit_code == 0, sub.output
        run_id = sub.output.strip().splitlines()[0]
        again = runner.invoke(
            app, ["submit", str(plan), "--idempotency-key", "k", "--data-dir", str(data)]
        )
        assert again.output.strip().splitlines()[0] == run_id

        tail = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tiffany",
                "tail",
                "--data-dir",
                str(data),
                "--run",
                run_id,
                "--json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        time.sleep(1.0)  # subscribed
        cancel = runner.invoke(app, ["cancel", run_id, "--data-dir", str(data)])
        assert cancel.exit_code == 0, cancel.output
        assert "cancelling" in cancel.output
        out, _ = tail.communicate(timeout=20)
        events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert events, out
        assert {e.get("run_id") for e in events if "seq" in e} == {run_id}
        assert events[-1]["kind"] == "run.finished"
        assert events[-1]["label"] == "cancelled"

        finished = runner.invoke(app, ["cancel", run_id, "--data-dir", str(data)])
        assert finished.exit_code == 1
        assert "already finished" in finished.output
    finally:
        assert engine.stop() == 0
    gone = runner.invoke(app, ["status", "--data-dir", str(data)])
    assert gone.exit_code == 5  # UNAVAILABLE (tiffany/cli/exits.py)
    assert "is `tiffany serve` running" in gone.output


def test_tail_of_a_run_that_already_finished_shows_its_events_and_ends(tmp_path: Path) -> None:
    # `tiffany submit` then `tiffany tail --run` followed the feed from now
    # on: a run that had finished meanwhile (a quick one always did) was
    # waited for forever, with nothing printed; an unknown run too.
    data = tmp_path / "data"
    engine = EngineProc(data)
    try:
        engine.wait_ready()
        plan = tmp_path / "quick.json"
        step = {"id": "w", "tool": "file.write", "args": {"path": "a.txt", "content": "a"}}
        plan.write_text(json.dumps({"name": "quick", "steps": [step]}))
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as feed:
            feed.settimeout(30)
            feed.connect(str(data / FEED_SOCKET))
            feed.sendall(json.dumps({"since": None, "run_id": None}).encode() + b"\n")
            sub = runner.invoke(app, ["submit", str(plan), "--data-dir", str(data)])
            assert sub.exit_code == 0, sub.output
            run_id = sub.output.strip().splitlines()[0]
            for line in feed.makefile("rb"):  # until the run has finished
                event = json.loads(line)
                if (event.get("kind"), event.get("run_id")) == ("run.finished", run_id):
                    break
        tail = [sys.executable, "-m", "tiffany", "tail", "--data-dir", str(data), "--json"]
        done = subprocess.run([*tail, "--run", run_id], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        events = [json.loads(line) for line in done.stdout.splitlines()]
        assert events[0]["kind"] == "run.started"
        assert events[-1]["kind"] == "run.finished"
        assert {e["run_id"] for e in events} == {run_id}
        nope = subprocess.run([*tail, "--run", "nope"], capture_output=True, text=True, timeout=30)
        assert nope.returncode == 3, nope.stderr  # NOT_FOUND
        assert "no run 'nope'" in nope.stderr
    finally:
        assert engine.stop() == 0


def test_tail_follows_a_run_step_by_step_and_every_dispatch_with_kernel(tmp_path: Path) -> None:
    """``tail`` printed every kernel dispatch (44 lines, queue_get and woke, for 3 steps).

    By default it prints the run's steps: a line per run start and end, step
    start, retry and end (with its duration, a failure with its error);
    ``--kernel`` prints every event as before; ``--json`` the same selection
    as feed frames.
    """
    data = tmp_path / "data"
    engine = EngineProc(data)
    try:
        engine.wait_ready()
        plan = tmp_path / "three.json"
        steps = [
            {"id": "a", "tool": "sleep", "args": {"seconds": 0}},
            {"id": "b", "tool": "sleep", "after": ["a"], "args": {"seconds": 0}},
            {"id": "c", "tool": "file.write", "after": ["b"], "args": {"path": "x", "content": ""}},
        ]
        plan.write_text(json.dumps({"name": "three", "steps": steps}))
        sub = runner.invoke(app, ["submit", str(plan), "--data-dir", str(data)])
        assert sub.exit_code == 0, sub.output
        run_id = sub.output.strip().splitlines()[0]
        tail = [sys.executable, "-m", "tiffany", "tail", "--data-dir", str(data), "--run", run_id]
        steps_only = subprocess.run(tail, capture_output=True, text=True, timeout=60)
        assert steps_only.returncode == 0, steps_only.stderr
        lines = steps_only.stdout.splitlines()
        shown = [line.split(None, 4)[2:] for line in lines]  # time, run, then the event
        assert [" ".join(words[:2]) for words in shown] == [
            "run started",
            *(f"step {event}" for _ in "abc" for event in ("started", "finished")),
            "run finished",
        ], steps_only.stdout
        assert [words[2].split()[0] for words in shown[1:-1]] == ["a", "a", "b", "b", "c", "c"]
        assert all(run_id in line for line in lines)
        assert "succeeded" in lines[-1]
        assert " ms" in lines[2] or " s" in lines[2]  # the step's duration
        assert not any(word in steps_only.stdout for word in ("queue_get", "woke", "blocked"))

        kernel = subprocess.run([*tail, "--kernel"], capture_output=True, text=True, timeout=60)
        assert kernel.returncode == 0, kernel.stderr
        assert "queue_get" in kernel.stdout
        assert "woke" in kernel.stdout
        assert len(kernel.stdout.splitlines()) > 3 * len(lines)

        frames = subprocess.run([*tail, "--json"], capture_output=True, text=True, timeout=60)
        events = [json.loads(line) for line in frames.stdout.splitlines()]
        assert [e["kind"] for e in events] == [
            "run.started",
            *("spawned", "exit") * 3,
            "run.finished",
        ]

        failing = tmp_path / "failing.json"
        step = {"id": "r", "tool": "file.read", "retries": 1, "backoff": 0, "args": {"path": "no"}}
        failing.write_text(json.dumps({"name": "failing", "steps": [step]}))
        sub = runner.invoke(app, ["submit", str(failing), "--data-dir", str(data)])
        assert sub.exit_code == 0, sub.output
        failed = subprocess.run(
            [*tail[:-1], sub.output.strip().splitlines()[0]],
            capture_output=True,
            text=True,
            timeout=60,
        )
        lines = failed.stdout.splitlines()
        assert [" ".join(line.split(None, 4)[2:4]) for line in lines] == [
            "run started",
            "step started",
            "step retrying",
            "step failed",
            "run finished",
        ], failed.stdout
        assert "r  attempt 1 failed" in lines[2]
        assert "2 attempts: " in lines[3]  # and why: the step's error, from the feed
        assert "tool.file" in lines[3], lines[3]
    finally:
        assert engine.stop() == 0


def test_a_misspelt_key_input_or_step_gets_a_did_you_mean_naming_the_flag_typed(
    tmp_path: Path,
) -> None:
    """A misspelt plan field, ``--input`` or ``--from`` was refused without a hint.

    The refusal named the request's field (``inputs.txt``, ``from_step``,
    ``Idempotency-Key``) under "invalid plan", not the option the user
    typed (``-i``, ``--from``, ``--idempotency-key``); and a misspelt plan
    key was "Extra inputs are not permitted".
    """
    data = tmp_path / "data"
    engine = EngineProc(data)
    local = ("--data-dir", str(data))
    try:
        engine.wait_ready()
        write = {"path": "t", "content": "${inputs.text}"}
        steps = [
            {"id": "write", "tool": "file.write", "args": write},
            {"id": "nap", "tool": "sleep", "after": ["write"], "args": {"seconds": 0}},
        ]
        good = tmp_path / "good.json"
        good.write_text(json.dumps({"name": "good", "inputs": {"text": "a"}, "steps": steps}))
        typo = tmp_path / "typo.json"
        typo.write_text(json.dumps({"name": "typo", "step": steps}))

        def refused(*args: str) -> list[str]:
            proc = runner.invoke(app, [*args, *local])
            assert proc.exit_code == 2, proc.output
            return proc.output.splitlines()

        assert refused("submit", str(typo)) == [
            "tiffany: invalid plan:",
            "  steps: Field required",
            "  step: unknown field 'step'; did you mean 'steps'? (allowed: name, description, "
            "inputs, steps, outputs, concurrency, budget)",
        ]
        hint = "not an input of this plan; did you mean 'text'? (inputs: text)"
        assert refused("submit", str(good), "-i", "txt=b") == [f"tiffany: -i txt: {hint}"]
        assert refused("submit", str(good), "-i", "text=b", "--input=txt=b") == [
            f"tiffany: --input txt: {hint}"
        ]
        assert refused("submit", str(good), "-itext") == ["tiffany: -i wants key=value, got 'text'"]
        assert refused("submit", str(good), "--idempotency-key", "") == [
            "tiffany: --idempotency-key: must be 1 to 255 characters"
        ]

        sub = runner.invoke(app, ["submit", str(good), *local])
        assert sub.exit_code == 0, sub.output
        run_id = sub.output.strip().splitlines()[0]
        tail = [sys.executable, "-m", "tiffany", "tail", *local, "--run", run_id]
        assert subprocess.run(tail, capture_output=True, timeout=60).returncode == 0  # finished
        assert refused("rerun", run_id, "--from", "wrte") == [
            f"tiffany: --from: run {run_id} has no step 'wrte'; did you mean 'write'?"
        ]
        assert refused("rerun", run_id, "--from", "nap", "-i", "txt=c") == [
            f"tiffany: -i txt: {hint}"
        ]
    finally:
        assert engine.stop() == 0
