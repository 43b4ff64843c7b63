"""Three engines and a spare sharing PostgreSQL (``TIFFANY_ENGINE_SLOTS=3``); kill -9 of one.

Real processes on loopback and the local PostgreSQL, each on a data dir of
its own, as on four hosts: four ``tiffany engine`` processes with three
slots (the fourth waits: every stream is held), and one ``tiffany api``
process with no engine beside it. 50 runs of a chain of three HTTP
requests to a counting server go in through the API and spread over the
three engines. One engine is killed
with SIGKILL in the middle of its runs. The spare takes its stream after
the lease, replays its runs and finishes them: every run succeeds with the
outputs of the runs that never crashed, a crashed engine's run replays
identically, the server saw every step that had finished before the kill
once, and a step in flight at the kill twice (journaled as its second
attempt).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from process_support import terminate, wait_for

from tiffany.wire.shards import engine_of

LEASE_S = 2
#: How long the counting server takes to answer a step's request, in seconds.
STEP_S = 0.6


def _chain(port: int) -> dict[str, Any]:
    """Three requests in a row to the counting server, each naming its run and step."""
    base = f"http://127.0.0.1:{port}/${{inputs.tag}}"
    return {
        "name": "chain",
        "inputs": {"tag": "none"},
        "steps": [
            {"id": "a", "tool": "http", "args": {"url": f"{base}/a"}},
            {"id": "b", "tool": "http", "args": {"url": f"{base}/b"}, "after": ["a"]},
            {"id": "c", "tool": "http", "args": {"url": f"{base}/c"}, "after": ["b"]},
        ],
        "outputs": {"a": "${steps.a.output.json}", "c": "${steps.c.output.json}"},
    }


class _Counter(BaseHTTPRequestHandler):
    """Answers ``/<tag>/<step>`` after STEP_S with ``{"step": step}``; counts every request."""

    hits: Counter[str] = Counter()
    lock = threading.Lock()

    def do_GET(self) -> None:
        with self.lock:
            self.hits[self.path] += 1
        time.sleep(STEP_S)
        body = json.dumps({"step": self.path.rsplit("/", 1)[-1]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _env(url: str, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    return env | {
        "TIFFANY_DATA_DIR": str(data_dir),
        "TIFFANY_DATABASE_URL": url,
        "TIFFANY_JOURNAL": "postgres",
        "TIFFANY_ENGINE_SLOTS": "3",
        "TIFFANY_JOURNAL_LEASE_S": str(LEASE_S),
        "TIFFANY_LOG_FORMAT": "json",
        "TIFFANY_PORT": "0",
        "TIFFANY_HTTP_ALLOW": "127.0.0.1",  # the counting server
    }


def _start(kind: str, data_dir: Path, url: str) -> subprocess.Popen[bytes]:
    data_dir.mkdir(parents=True)
    ready = data_dir / f"{kind}.json"
    return subprocess.Popen(
        [sys.executable, "-m", "tiffany", kind, "--ready-file", str(ready)],
        stdout=(data_dir / f"{kind}.log").open("wb"),
        stderr=subprocess.STDOUT,
        env=_env(url, data_dir),
    )


def _http(url: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{url}: {exc.code} {exc.read()[:500]!r}") from None


def _ready(data_dir: Path, kind: str) -> dict[str, Any] | None:
    path = data_dir / f"{kind}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _engine_of(data_dir: Path) -> int | None:
    """Which slot the engine on ``data_dir`` took (from its log), or None while it waits."""
    for line in (data_dir / "engine.log").read_text().splitlines():
        if '"engine.slot_taken"' in line:
            return int(json.loads(line)["engine"])
    return None


def test_a_spare_engine_finishes_the_runs_of_a_killed_one(
    tmp_path: Path, pg_schema_url: str
) -> None:
    dirs = [tmp_path / f"host{i}" for i in range(4)]
    engines = []
    api = None
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Counter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    chain = _chain(server.server_address[1])
    try:
        for d in dirs[:3]:
            engines.append(_start("engine", d, pg_schema_url))
            wait_for(lambda d=d: _ready(d, "engine"), 60, f"the engine on {d.name}")
        engines.append(_start("engine", dirs[3], pg_schema_url))  # the spare: all slots held
        api = _start("api", tmp_path / "api", pg_schema_url)
        wait_for(lambda: _ready(tmp_path / "api", "api"), 60, "the API")
        url = str(_ready(tmp_path / "api", "api")["url"])  # type: ignore[index]
        slots = {_engine_of(d): i for i, d in enumerate(dirs[:3])}
        assert set(slots) == {0, 1, 2}
        time.sleep(1)
        assert _engine_of(dirs[3]) is None  # waiting
        assert engines[3].poll() is None

        answers = [
            _http(url + "api/runs", {"plan": chain, "inputs": {"tag": f"r{i}"}}) for i in range(50)
        ]
        tags = {a["run_id"]: f"r{i}" for i, a in enumerate(answers)}
        by_engine: dict[int, list[dict[str, Any]]] = {}
        for a in answers:
            by_engine.setdefault(engine_of(a["seq"]), []).append(a)
        assert set(by_engine) == {0, 1, 2}, {k: len(v) for k, v in by_engine.items()}

        # Kill the engine of slot 1 once one of its runs finished step a.
        victim = by_engine[1]

        def done_steps(a: dict[str, Any]) -> dict[str, Any]:
            run = _http(f"{url}api/runs/{a['run_id']}?min_seq={a['seq']}")
            return {s["step_id"]: s for s in run["steps"] if s["status"] == "succeeded"}

        def done_before_the_kill(a: dict[str, Any]) -> dict[str, Any]:
            # What the store shows now, however far it got: the killed
            # engine's later records wait for the spare (a read with min_seq
            # answers 503 until then), and what it shows was done before the
            # kill (the spare takes the slot only after the lease).
            try:
                run = _http(f"{url}api/runs/{a['run_id']}")
            except AssertionError as exc:
                if ": 404 " not in str(exc):
                    raise
                return {}  # not projected yet: nothing known done
            return {s["step_id"]: s for s in run["steps"] if s["status"] == "succeeded"}

        wait_for(lambda: done_steps(victim[0]), 30, "step a of a run on engine 1")
        os.kill(engines[slots[1]].pid, signal.SIGKILL)
        engines[slots[1]].wait(10)
        before = {a["run_id"]: done_before_the_kill(a) for a in victim}

        # The spare takes slot 1 after the lease and finishes its runs.
        wait_for(lambda: _engine_of(dirs[3]) == 1, LEASE_S + 30, "the spare to take slot 1")
        runs = {}
        for a in answers:
            wait_for(
                lambda a=a: _http(f"{url}api/runs/{a['run_id']}")["status"] == "succeeded",
                60,
                f"run {a['run_id']}",
            )
            runs[a["run_id"]] = _http(f"{url}api/runs/{a['run_id']}")
        # The outputs of an uncrashed twin: every run answers the same.
        twins = {json.dumps(r["outputs"], sort_keys=True) for r in runs.values()}
        assert twins == {json.dumps({"a": {"step": "a"}, "c": {"step": "c"}}, sort_keys=True)}
        hits = dict(_Counter.hits)
        on_victim = {a["run_id"] for a in victim}
        reran = 0
        for run_id, run in runs.items():
            tag = tags[run_id]
            counts = {step: hits.get(f"/{tag}/{step}", 0) for step in "abc"}
            if run_id not in on_victim:
                assert counts == {"a": 1, "b": 1, "c": 1}, (run_id, counts)
                continue
            for step_id in before[run_id]:
                assert counts[step_id] == 1, (run_id, step_id, counts)  # done: not run again
            assert all(n in (1, 2) for n in counts.values()), (run_id, counts)
            if 2 in counts.values():
                # In flight at the kill: run once more, journaled as a second attempt.
                step_of = {t["ltid"]: t.get("step_id") for t in run["tasks"]}
                records = _http(f"{url}api/runs/{run_id}/events?limit=5000")["records"]
                again = {
                    step_of.get(r["ltid"])
                    for r in records
                    if r["type"] == "STEP_START" and r["data"]["attempt"] == 2
                }
                assert {s for s, n in counts.items() if n == 2} <= again, (counts, again)
                reran += 1
        assert reran >= 1  # the kill came in the middle of steps
        report = _http(f"{url}api/runs/{victim[0]['run_id']}/verify", {})
        assert report["ok"] is True, report
    finally:
        server.shutdown()
        if api is not None:
            terminate(api)
        for proc in engines:
            if proc.poll() is None:
                terminate(proc)
