"""A shell step's output on ``/ws/activity`` while it runs, from a real ``tiffany serve``.

``tiffany serve --enable-tool shell`` (unsandboxed on purpose: the sandbox's
own streaming is tested in tests/agents/test_tools_shell.py) runs a step
that prints a line, sleeps, prints another; a websocket following the run
gets the first line as a ``tool.output`` event while the step still sleeps,
long before the run ends, and the run's recorded output is the whole of it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from api_support import (
    clean_env,
    finished_run,
    run_step,
    short_dir,
    submit_plan,
    ws_connect,
    ws_recv_json,
)
from process_support import terminate, wait_for

#: How long the step sleeps between its two lines, in seconds.
PAUSE_S = 2.0

PLAN = {
    "name": "talker",
    "steps": [
        {
            "id": "talk",
            "tool": "shell",
            "args": {
                "argv": ["sh", "-c", f"echo first; echo oops >&2; sleep {PAUSE_S}; echo second"]
            },
        }
    ],
}


@pytest.fixture
def shell_served() -> Iterator[str]:
    """``tiffany serve --enable-tool shell`` with the sandbox off; yields its base URL."""
    data_dir = short_dir("tfl-")
    env = clean_env() | {"TIFFANY_LOG_FORMAT": "json", "TIFFANY_SHELL_SANDBOX": "none"}
    argv = [sys.executable, "-m", "tiffany", "serve", "--data-dir", str(data_dir)]
    with (data_dir / "serve.log").open("ab") as log:
        proc = subprocess.Popen(
            [*argv, "--port", "0", "--enable-tool", "shell"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        ready = data_dir / "serve.json"
        wait_for(lambda: ready.exists() or proc.poll() is not None, 60, "serve.json")
        assert proc.poll() is None, (data_dir / "serve.log").read_text()[-3000:]
        url = str(json.loads(ready.read_text())["url"]).rstrip("/")
        wait_for(lambda: httpx.get(url + "/readyz").status_code == 200, 60, "readyz")
        yield url
    finally:
        terminate(proc)
        shutil.rmtree(data_dir, ignore_errors=True)


def _follow(url: str, run_id: str) -> list[tuple[float, dict[str, Any]]]:
    """The run's events as they arrive (with the monotonic time of arrival), to run.finished."""
    got: list[tuple[float, dict[str, Any]]] = []
    ws_url = url.replace("http://", "ws://") + f"/ws/activity?run_id={run_id}&since=0"
    with ws_connect(ws_url) as ws:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            frame = ws_recv_json(ws, timeout=max(0.1, deadline - time.monotonic()))
            if frame.get("type") == "ping":
                continue
            assert frame.get("type") is None, frame  # a fresh server: nothing gone or cut
            got.append((time.monotonic(), frame))
            if frame["kind"] == "run.finished":
                return got
    raise AssertionError(f"run {run_id} did not finish: {[f['kind'] for _, f in got]}")


def test_a_shell_steps_first_line_is_on_the_feed_before_the_run_ends(shell_served: str) -> None:
    url = shell_served
    run_id = submit_plan(url, PLAN)["run_id"]
    events = _follow(url, run_id)
    lines = [
        (t, e)
        for t, e in events
        if e["kind"] == "tool.output" and "stream" in e["data"] and e["run_id"] == run_id
    ]
    out = [(t, e) for t, e in lines if e["data"]["stream"] == "stdout"]
    assert [e["data"]["text"] for _, e in out] == ["first", "second"]
    assert [e["data"]["text"] for _, e in lines if e["data"]["stream"] == "stderr"] == ["oops"]
    first_at, first = out[0]
    assert first["data"]["step"] == "talk"
    assert first["data"]["partial"] is False
    ended_at = events[-1][0]
    # the first line came while the step slept, not with the run's end
    assert ended_at - first_at >= PAUSE_S * 0.75
    # and the engine published the lines a pause apart (its own clock: on a loaded
    # machine the relay may hold the first line back a while, never the pause)
    assert out[-1][1]["ts"] - first["ts"] >= PAUSE_S * 0.75
    # the recorded result is the whole output, as the tool returned it
    run = finished_run(url, run_id)
    assert run["status"] == "succeeded"
    output = run_step(run, "talk")["output"]
    assert output["stdout"] == "first\nsecond\n"
    assert output["stderr"] == "oops\n"
    assert output["exit_code"] == 0
