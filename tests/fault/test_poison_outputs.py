"""Poison outputs: a tool result the journal cannot take must fail its step, never the engine.

A lone surrogate (an HTTP JSON body ``"x\\ud800y"``, a model's reply, a
python tool's string) raised ``UnicodeEncodeError`` in the journal's
``task_woken`` hook: the engine fail-stopped, ``serve`` restarted it,
recovery ran the step again (sending the request again) and died again,
for good, and every other run on the engine stalled with it.

One real ``tiffany serve`` runs a plan per tool whose output is poisoned
(a local HTTP server on 127.0.0.1 plays the remote server and the
OpenAI-compatible model). Each row: the step fails with ``journal.value``
(or, where the tool decodes bytes itself, its output is kept with the bad
bytes replaced; an error's message is kept escaped), the engine process
is the same one throughout, a plain run submitted after all of them
succeeds, and every run replays identically (``tiffany replay RUN
--verify``). A signal whose payload holds a lone surrogate is refused with
422 before anything is journaled.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fault_support import TERMINAL, Served, cli, tools_env

#: Generous: a loaded 2-core machine; the unfixed engine never ends these runs.
RUN_TIMEOUT_S = 120.0
#: The escaped JSON of a lone surrogate, as a remote server sends it.
POISON_JSON = b'{"a": "x\\ud800y", "n": 1}'
#: Bytes that are no UTF-8 (a lone surrogate's encoding among them).
BAD_BYTES = "\\377\\376 x \\355\\240\\200 y"

POISON_TOOLS = {
    "poison.surrogate": "poison_tools:surrogate",
    "poison.cyclic": "poison_tools:cyclic",
    "poison.unencodable": "poison_tools:unencodable",
    "poison.raise_surrogate": "poison_tools:raise_surrogate",
}


class _Remote(http.server.BaseHTTPRequestHandler):
    """The remote server and the model: both answer with a lone surrogate's escape."""

    def do_GET(self) -> None:
        self._send(POISON_JSON)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        doc = {
            "id": "cmpl-1",
            "model": "mock",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "x\ud800y"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        self._send(json.dumps(doc).encode())  # ensure_ascii: "\ud800" escaped

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def remote() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Remote)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _env(base: Path, remote: str) -> dict[str, str]:
    env = tools_env(
        base,
        {
            "TIFFANY_HTTP_ALLOW": "127.0.0.1",
            "TIFFANY_LLM_BASE_URL": remote,
            "TIFFANY_LLM_MODEL": "mock",
            "TIFFANY_ENABLED_TOOLS": "python,http,llm,agent,shell,file.read,signal.wait,sleep",
            "TIFFANY_SHELL_SANDBOX": "none",
        },
    )
    points = base / "entry-points" / "fault_tools-0.dist-info" / "entry_points.txt"
    with points.open("a") as f:
        f.writelines(f"{name} = {target}\n" for name, target in POISON_TOOLS.items())
    return env


def _python(function: str, **step: Any) -> dict[str, Any]:
    return {"tool": "python", "args": {"function": function}, **step}


#: Each row: the poisoned step, and what must become of it: ``("code", C)``
#: the step fails with code C; ``("ok", check)`` it succeeds and
#: ``check(output)`` holds; ``("message", text)`` it fails, its message
#: ending with ``text`` (kept escaped).
ROWS: dict[str, tuple[dict[str, Any], tuple[str, Any]]] = {
    "http": (
        {"tool": "http", "args": {"method": "GET", "url": "${inputs.remote}/data"}},
        ("code", "journal.value"),
    ),
    "llm": ({"tool": "llm", "args": {"prompt": "hello"}}, ("code", "journal.value")),
    "agent": (
        {"tool": "agent", "args": {"goal": "hello", "tools": []}},
        ("code", "journal.value"),  # its model call's result, in the agent's own step
    ),
    "python.string": (_python("poison.surrogate"), ("code", "journal.value")),
    "python.string.tool_task": (
        _python("poison.surrogate", timeout_s=60),
        ("code", "journal.value"),
    ),
    "python.cyclic": (_python("poison.cyclic"), ("code", "journal.value")),
    "python.unencodable": (
        _python("poison.unencodable"),
        ("ok", lambda out: out["n"] == 1 and "opaque x\\ud800y" in str(out["obj"])),
    ),
    "python.error": (
        _python("poison.raise_surrogate"),
        ("message", "ValueError: remote said x\\ud800y"),
    ),
    "shell": (
        {"tool": "shell", "args": {"argv": ["sh", "-c", f"printf '{BAD_BYTES}'"]}},
        ("ok", lambda out: out["stdout"] == "\ufffd\ufffd x \ufffd\ufffd\ufffd y"),
    ),
}


def _plan(row: str) -> dict[str, Any]:
    step, _ = ROWS[row]
    return {
        "name": f"poison-{row.replace('.', '-')}",
        "inputs": {"remote": ""},
        "steps": [{"id": "poison", **step}],
        "outputs": {"out": "${steps.poison.output}"},
    }


def _file_plan() -> dict[str, Any]:
    write = f"printf '{BAD_BYTES}' > bad.txt"
    return {
        "name": "poison-file-read",
        "steps": [
            {"id": "make", "tool": "shell", "args": {"argv": ["sh", "-c", write]}},
            {"id": "poison", "tool": "file.read", "after": ["make"], "args": {"path": "bad.txt"}},
        ],
        "outputs": {"out": "${steps.poison.output.content}"},
    }


def _signal_plan() -> dict[str, Any]:
    return {
        "name": "poison-signal",
        "steps": [{"id": "poison", "tool": "signal.wait", "args": {"name": "go"}}],
        "outputs": {"out": "${steps.poison.output}"},
    }


def _plain_plan() -> dict[str, Any]:
    return {
        "name": "after-the-poison",
        "steps": [{"id": "nap", "tool": "sleep", "args": {"seconds": 0.01}}],
        "outputs": {"done": "yes"},
    }


def _submit(http: httpx.Client, plan: dict[str, Any], inputs: dict[str, Any] | None = None) -> str:
    r = http.post("/api/runs", json={"plan": plan, "inputs": inputs or {}})
    assert r.status_code == 201, r.text
    return str(r.json()["run_id"])


def _finished(http: httpx.Client, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        r = http.get(f"/api/runs/{run_id}")
        if r.status_code == 200 and r.json()["status"] in TERMINAL:
            detail: dict[str, Any] = r.json()
            return detail
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} did not finish: {r.text[:2000]}")
        time.sleep(0.1)


def _step(detail: dict[str, Any]) -> dict[str, Any]:
    [step] = [s for s in detail["steps"] if s["step_id"] == "poison"]
    return step


def test_poison_outputs_fail_their_step_and_the_served_engine_goes_on(tmp_path, remote):
    base = tmp_path
    env = _env(base, remote)
    served = Served(base / "data", env, log_path=base / "serve.log")
    try:
        served.wait_ready()
        engine_pid = served.roles()["engine"]
        with httpx.Client(base_url=served.url, timeout=30) as http:
            runs = {row: _submit(http, _plan(row), {"remote": remote}) for row in ROWS}
            runs["file.read"] = _submit(http, _file_plan())
            runs["signal"] = _submit(http, _signal_plan())

            # A signal whose payload holds a lone surrogate: refused, nothing journaled.
            poisoned = b'{"v": "x\\ud800y"}'
            r = http.post(
                f"/api/runs/{runs['signal']}/signals/go",
                content=poisoned,
                headers={"Content-Type": "application/json"},
            )
            assert r.status_code == 422, r.text
            assert "surrogate" in r.text
            r = http.post(f"/api/runs/{runs['signal']}/signals/go", json={"v": "fine"})
            assert r.status_code == 202, r.text

            details = {row: _finished(http, run_id) for row, run_id in runs.items()}
            plain = _submit(http, _plain_plan())  # after every poison: the engine still runs
            after = _finished(http, plain)
            assert served.roles().get("engine") == engine_pid, served.log()[-4000:]
    finally:
        served.stop()

    problems = []
    for row, (_, (kind, want)) in ROWS.items():
        detail, step = details[row], _step(details[row])
        error = step.get("error") or {}
        if kind == "code":
            good = detail["status"] == "failed" and error.get("code") == want
        elif kind == "message":
            good = detail["status"] == "failed" and str(error.get("message", "")).endswith(want)
        else:
            good = detail["status"] == "succeeded" and want(step["output"])
        if not good:
            problems.append(f"{row}: {detail['status']}, step {step}")
    assert not problems, "\n".join(problems)
    assert details["file.read"]["status"] == "succeeded", details["file.read"]
    assert details["file.read"]["outputs"] == {"out": "\ufffd\ufffd x \ufffd\ufffd\ufffd y"}
    assert (details["signal"]["status"], details["signal"]["outputs"]) == (
        "succeeded",
        {"out": {"v": "fine"}},
    )
    assert after["status"] == "succeeded"
    for run_id in [*runs.values(), plain]:
        cli(base / "data", env, "replay", run_id, "--verify")
