"""Each child of a real ``tiffany serve`` holds only the secrets it uses; ``serve.json`` is current.

Finding 4 (``serve`` handed the API token to the engine, which never uses
it, and from there to every tool subprocess) and finding 12 (``serve.json``
kept the pids of children that had died and been restarted).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from process_support import alive as _alive
from process_support import serve_json as _serve_json
from process_support import terminate
from process_support import wait_for as _wait

API_TOKEN = "api-token-3f9c1d7e5b"
LLM_KEY = "llm-key-8a2b6c4d0e"
OTHER = "other-secret-71e0c9a4"


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out += [int(p) for p in text]
    return out


def test_each_serve_child_gets_only_its_secrets_and_serve_json_follows_restarts(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    env = {
        **os.environ,
        "TIFFANY_LOG_FORMAT": "json",
        "TIFFANY_API_TOKEN": API_TOKEN,
        "TIFFANY_LLM_API_KEY": LLM_KEY,
        "GITHUB_TOKEN": OTHER,
        "SOME_DB_PASSWORD": OTHER,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "tiffany", "serve", "--data-dir", str(data), "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        info = _wait(lambda: _serve_json(data) or proc.poll() is not None, 60, "serve.json")
        assert proc.poll() is None, "serve exited while starting"
        engine, api = int(info["engine_pid"]), int(info["api_pid"])
        projector = _wait(lambda: _children(engine), 30, "the projector process")[0]

        engine_env, api_env, projector_env = _environ(engine), _environ(api), _environ(projector)
        assert "projector" in Path(f"/proc/{projector}/cmdline").read_text()
        # the API: its token, not the LLM key
        assert api_env.get("TIFFANY_API_TOKEN") == API_TOKEN
        assert "TIFFANY_LLM_API_KEY" not in api_env
        # the engine: the LLM key, not the API token
        assert engine_env.get("TIFFANY_LLM_API_KEY") == LLM_KEY
        assert "TIFFANY_API_TOKEN" not in engine_env
        # the projector: the store only
        assert "TIFFANY_DATABASE_URL" in projector_env
        for name, child_env in (("engine", engine_env), ("api", api_env), ("proj", projector_env)):
            blob = "\0".join(f"{k}={v}" for k, v in child_env.items())
            assert OTHER not in blob, name
            if name != "api":
                assert API_TOKEN not in blob, name
            if name != "engine":
                assert LLM_KEY not in blob, name

        # a restarted child's new pid replaces the dead one in serve.json
        os.kill(api, signal.SIGKILL)

        def new_api() -> int | None:
            doc = _serve_json(data)
            pid = int(doc["api_pid"]) if doc else api
            return pid if pid != api and _alive(pid) else None

        fresh = _wait(new_api, 60, "serve.json to name the restarted API")
        assert not _alive(api)
        assert _serve_json(data) == {**info, "api_pid": fresh}
    finally:
        terminate(proc)
    assert not (data / "serve.json").exists()
