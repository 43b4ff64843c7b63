"""``tiffany serve`` survives what its children survive, and its children die with it (issue 38).

Real processes: ``serve`` with its engine and API on loopback.

* ``kill -9`` of ``serve``: its children follow it (the parent-death
  signal), the port is free, and a new ``serve`` starts on it.
* An engine killed while starting (before its ready file), on the file WAL
  and on the PostgreSQL journal: ``serve`` restarts it; the API is the
  same process throughout, and the service comes up.
* The API killed (``kill -9``) on ``--port 0``: its restart listens on
  the same port (serve holds the listening socket and hands it over), a
  request sent while no API runs is answered by the next one, and
  ``serve.json`` keeps naming the address.
* A disk filled (through a file in the data dir, as a workspace would)
  under ``serve``: its ``serve.json`` cannot be written when an engine is
  restarted (ENOSPC); ``serve`` says so and goes on, and once space is
  freed the service answers and ``serve.json`` names the live engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from process_support import alive, serve_argv, serve_json, terminate, wait_for

PLAN = {"name": "after", "steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 0}}]}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    return {**env, "TIFFANY_LOG_FORMAT": "json", **extra}


def _start(
    data_dir: Path, log: Path, env: dict[str, str], port: int = 0
) -> subprocess.Popen[bytes]:
    data_dir.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            serve_argv(data_dir, port), stdout=out, stderr=subprocess.STDOUT, env=env
        )


def _children(pid: int) -> dict[str, int]:
    """``{"engine": pid, "api": pid}`` among the children of process ``pid``."""
    found: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for thread in Path(f"/proc/{pid}/task").iterdir():
            for child in (thread / "children").read_text().split():
                with contextlib.suppress(OSError):
                    argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
                    for role in ("engine", "api"):
                        if role.encode() in argv:
                            found[role] = int(child)
    return found


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _ready(url: str) -> bool:
    try:
        return bool(_get(url + "readyz")["ready"])
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _up(data_dir: Path, proc: subprocess.Popen[bytes], log: Path) -> str:
    """The URL once ``serve.json`` is there and the service ready."""

    def url() -> str | None:
        assert proc.poll() is None, f"serve exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        doc = serve_json(data_dir)
        return str(doc["url"]) if doc and _ready(str(doc["url"])) else None

    return str(wait_for(url, 120, "serve to be up"))


def _run_succeeds(url: str) -> None:
    req = urllib.request.Request(
        url + "api/runs",
        data=json.dumps(PLAN).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        run_id = json.loads(resp.read())["run_id"]
    wait_for(
        lambda: _get(url + f"api/runs/{run_id}")["status"] == "succeeded", 60, "the run to finish"
    )


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_kill_9_of_serve_takes_its_children_and_frees_the_port(tmp_path: Path) -> None:
    data, log = tmp_path / "data", tmp_path / "serve.log"
    proc = _start(data, log, _env())
    try:
        url = _up(data, proc, log)
        kids = _children(proc.pid)
        assert set(kids) == {"engine", "api"}, kids
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        proc.kill()
        proc.wait(30)
        wait_for(lambda: not any(alive(pid) for pid in kids.values()), 60, "the children to go")
        assert _port_free(port)
    finally:
        terminate(proc)
    # A new serve starts on the same port and data dir, and serves.
    again = _start(data, log, _env(), port)
    try:
        url = _up(data, again, log)
        assert url.rstrip("/").endswith(f":{port}")
        _run_succeeds(url)
    finally:
        assert terminate(again) == 0, log.read_text()[-3000:]


@pytest.mark.parametrize("journal", ["file", "postgres"])
def test_an_engine_killed_while_starting_is_restarted_and_the_api_stays(
    tmp_path: Path, journal: str, request: pytest.FixtureRequest
) -> None:
    extra = {}
    if journal == "postgres":
        url = request.getfixturevalue("pg_migrated_url")
        extra = {
            "TIFFANY_JOURNAL": "postgres",
            "TIFFANY_DATABASE_URL": url,
            "TIFFANY_JOURNAL_LEASE_S": "2",
        }
    data, log = tmp_path / "data", tmp_path / "serve.log"
    proc = _start(data, log, _env(**extra))
    try:
        kids = wait_for(
            lambda: (k := _children(proc.pid)) and "engine" in k and "api" in k and k,
            60,
            "serve's children",
            interval=0.01,
        )
        os.kill(kids["engine"], signal.SIGKILL)  # in its first moments: imports, the WAL
        wait_for(lambda: not alive(kids["engine"]), 30, "the engine to die")
        assert not (data / "engine.json").exists(), "the engine was up already: not a start"
        url = _up(data, proc, log)
        doc = serve_json(data)
        assert doc is not None
        assert doc["api_pid"] == kids["api"], "the API was stopped or restarted"
        assert doc["engine_pid"] != kids["engine"]
        assert "exited with code -9 while starting; restarting it" in log.read_text()
        _run_succeeds(url)
    finally:
        assert terminate(proc) == 0, log.read_text()[-3000:]


def test_a_killed_api_comes_back_on_the_same_port_with_port_0(tmp_path: Path) -> None:
    data, log = tmp_path / "data", tmp_path / "serve.log"
    proc = _start(data, log, _env())
    try:
        url = _up(data, proc, log)
        api = _children(proc.pid)["api"]
        os.kill(api, signal.SIGKILL)
        wait_for(lambda: not alive(api), 30, "the API to die")
        # Sent while no API runs: the listening socket is serve's, so the
        # connection waits in its backlog for the next API instead of being refused.
        with urllib.request.urlopen(url + "healthz", timeout=120) as resp:
            assert resp.status == 200
        doc = serve_json(data)
        assert doc is not None
        assert doc["url"] == url
        new_api = wait_for(lambda: _children(proc.pid).get("api"), 30, "the new API")
        assert new_api != api
        wait_for(lambda: (serve_json(data) or {}).get("api_pid") == new_api, 60, "serve.json")
        assert _ready(url)
        _run_succeeds(url)
    finally:
        code = terminate(proc)
    assert code == 0, log.read_text()[-3000:]
    assert "the api process exited with code -9; restarting it" in log.read_text()


@pytest.fixture
def small_disk(tmp_path: Path, unavailable: Any) -> Iterator[Path]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        unavailable("mounting a tmpfs needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        unavailable(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path: Path) -> None:
    """Write ``path`` until the disk is full."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\xff" * 65536)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\xff" * 512)
    finally:
        os.close(fd)


def _free_bytes(mnt: Path) -> int:
    st = os.statvfs(mnt)
    return st.f_bavail * st.f_frsize


def test_serve_survives_a_full_disk_and_serves_again_once_space_is_freed(
    small_disk: Path, tmp_path: Path
) -> None:
    data, log = small_disk / "data", tmp_path / "serve.log"  # its output off the full disk
    proc = _start(data, log, _env())
    try:
        url = _up(data, proc, log)
        engine = _children(proc.pid)["engine"]
        fillers = data / "workspaces" / "fillers"
        told = threading.Event()

        def keep_full() -> None:  # a step filling the disk through its workspace, on and on
            n = 0
            while not told.is_set():
                n += 1
                _fill(fillers / str(n))
                told.wait(0.01)  # whatever the engine frees at its restart is taken again

        filling = threading.Thread(target=keep_full, daemon=True)
        filling.start()
        try:
            wait_for(lambda: _free_bytes(small_disk) < 4096, 60, "the disk to fill")
            os.kill(engine, signal.SIGKILL)  # the engine dies: serve restarts it, writes serve.json
            wait_for(
                lambda: "cannot write" in log.read_text() or proc.poll() is not None,
                120,
                "serve to rewrite serve.json on the full disk",
            )
        finally:
            told.set()
            filling.join(30)
        assert proc.poll() is None, f"serve died on the full disk:\n{log.read_text()[-3000:]}"
        shutil.rmtree(fillers)  # space is freed
        wait_for(lambda: _ready(url), 120, "the service to come back")

        def names_the_live_engine() -> bool:
            doc = serve_json(data)
            return bool(doc) and doc["engine_pid"] == _children(proc.pid).get("engine")

        wait_for(names_the_live_engine, 60, "serve.json to name the live engine")
        _run_succeeds(url)
        assert proc.poll() is None
    finally:
        code = terminate(proc)
    assert code == 0, log.read_text()[-3000:]
