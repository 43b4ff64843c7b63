"""``GET /api/tools`` and strict plan validation at ``POST /api/runs``, on ``tiffany serve``.

A real ``tiffany serve`` (engine and API processes, real sockets): the API
asks the engine which tools it runs (the control op ``tools``), a bad
argument is a 422 naming ``steps[N].args.FIELD`` with the allowed fields, a
disabled tool is told apart from an unknown one with the fix, and ``tiffany
tools`` on the same data dir lists what the engine has.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from api_support import clean_env, finished_run, serve, short_dir

TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[Path, str]]:
    """``tiffany serve`` with the default tools (shell disabled)."""
    from process_support import terminate

    data_dir = short_dir("tft-")
    proc, url = serve(data_dir)
    try:
        yield data_dir, url
    finally:
        terminate(proc)
        shutil.rmtree(data_dir, ignore_errors=True)


def _tiffany(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tiffany", "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
        check=False,
    )


def _submit(url: str, steps: list[dict]) -> httpx.Response:
    plan = {"name": "p", "inputs": {"n": 0.01, "u": "http://x"}, "steps": steps}
    return httpx.post(f"{url}/api/runs", json={"plan": plan}, timeout=TIMEOUT_S)


def _detail(r: httpx.Response) -> dict[tuple, str]:
    assert r.status_code == 422, r.text
    return {tuple(d["loc"]): d["msg"] for d in r.json()["detail"]}


def test_the_enabled_tools_with_their_schemas_and_the_disabled_ones(server) -> None:
    _, url = server
    r = httpx.get(f"{url}/api/tools", timeout=TIMEOUT_S)
    assert r.status_code == 200, r.text
    body = r.json()
    names = [t["name"] for t in body["tools"]]
    assert names[0] == "http"
    assert set(names) == {
        "http",
        "python",
        "llm",
        "file.read",
        "file.write",
        "sleep",
        "signal.wait",
        "plan.run",
        "agent",
        "memory.put",
        "memory.get",
        "memory.search",
        "memory.link",
        "memory.neighbors",
        "memory.delete",
    }
    assert body["disabled"] == ["shell"]
    sleep = next(t for t in body["tools"] if t["name"] == "sleep")
    assert sleep["durable"] is False
    assert sleep["args"]["required"] == ["seconds"]
    assert sleep["output"]["properties"]["slept"]["type"] == "number"
    python = next(t for t in body["tools"] if t["name"] == "python")
    assert python["output"]["description"].startswith("Free-form")

    one = httpx.get(f"{url}/api/tools/file.write", timeout=TIMEOUT_S)
    assert one.status_code == 200
    assert set(one.json()["args"]["properties"]) == {"path", "content", "mode"}
    off = httpx.get(f"{url}/api/tools/shell", timeout=TIMEOUT_S)
    assert off.status_code == 404
    assert "--enable-tool shell" in off.json()["message"]
    nope = httpx.get(f"{url}/api/tools/teleport", timeout=TIMEOUT_S)
    assert nope.status_code == 404
    assert nope.json()["message"].startswith("unknown tool 'teleport'")

    schema = httpx.get(f"{url}/openapi.json", timeout=TIMEOUT_S).json()
    answer = schema["paths"]["/api/tools"]["get"]["responses"]["200"]
    assert answer["content"]["application/json"]["schema"]["$ref"].endswith("/ToolList")


def test_a_bad_argument_is_a_422_naming_its_path_and_the_allowed_fields(server) -> None:
    _, url = server
    detail = _detail(
        _submit(
            url,
            [
                {"id": "a", "tool": "sleep", "args": {"seconds": 0}},
                {"id": "b", "tool": "sleep", "args": {"seconds": 0}},
                {"id": "c", "tool": "http", "args": {"urll": "${inputs.u}"}},
            ],
        )
    )
    assert detail[("steps", 2, "args", "urll")].startswith(
        "unknown argument 'urll' of tool 'http'; did you mean 'url'? (allowed: method, url, "
    )
    assert detail[("steps", 2, "args", "url")] == "missing required argument 'url' of tool 'http'"


def test_disabled_and_unknown_tools_are_told_apart(server) -> None:
    _, url = server
    detail = _detail(
        _submit(
            url,
            [
                {"id": "a", "tool": "shell", "args": {"argv": ["ls"]}},
                {"id": "b", "tool": "slep", "args": {"seconds": 0}},
            ],
        )
    )
    assert detail[("steps", 0, "tool")] == (
        "tool 'shell' is disabled on this server: start it with --enable-tool shell "
        "(or add shell to TIFFANY_ENABLED_TOOLS)"
    )
    assert detail[("steps", 1, "tool")].startswith("unknown tool 'slep'; did you mean 'sleep'?")


def test_references_are_not_refused_and_the_run_succeeds(server) -> None:
    _, url = server
    r = _submit(url, [{"id": "a", "tool": "sleep", "args": {"seconds": "${inputs.n}"}}])
    assert r.status_code == 201, r.text
    run = finished_run(url, r.json()["run_id"])
    assert run["status"] == "succeeded", run


def test_tiffany_tools_lists_what_the_engine_runs(server) -> None:
    data_dir, _ = server
    listed = _tiffany(data_dir, "tools", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "no engine serving" not in listed.stderr  # the engine answered
    body = json.loads(listed.stdout)
    assert body["disabled"] == ["shell"]
    one = _tiffany(data_dir, "tools", "http")
    assert one.returncode == 0, one.stderr
    assert "url" in one.stdout
    assert "raise_for_status" in one.stdout
    off = _tiffany(data_dir, "tools", "shell")
    assert off.returncode == 1
    assert "--enable-tool shell" in off.stderr


def test_enable_tool_on_serve_enables_it_everywhere() -> None:
    from process_support import terminate

    data_dir = short_dir("tft-")
    proc, url = serve(data_dir, "--enable-tool", "shell")
    try:
        body = httpx.get(f"{url}/api/tools", timeout=TIMEOUT_S).json()
        assert "shell" in [t["name"] for t in body["tools"]]
        assert body["disabled"] == []
        r = _submit(url, [{"id": "a", "tool": "shell", "args": {"argv": ["true"]}}])
        assert r.status_code == 201, r.text
    finally:
        terminate(proc)
        shutil.rmtree(data_dir, ignore_errors=True)


def test_tiffany_tools_without_an_engine_lists_what_these_settings_enable(tmp_path) -> None:
    listed = _tiffany(tmp_path, "tools", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "no engine serving" in listed.stderr
    assert json.loads(listed.stdout)["disabled"] == ["shell"]
    env_on = subprocess.run(
        [sys.executable, "-m", "tiffany", "--data-dir", str(tmp_path), "tools", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean_env(), "TIFFANY_ENABLED_TOOLS": "sleep,shell"},
        check=False,
    )
    assert env_on.returncode == 0, env_on.stderr
    body = json.loads(env_on.stdout)
    assert [t["name"] for t in body["tools"]] == ["shell", "sleep"]
    assert "http" in body["disabled"]
