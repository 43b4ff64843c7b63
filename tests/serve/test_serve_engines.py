"""``tiffany serve --engines N``: runs spread over engine processes behind one API and store.

Real processes on loopback: ``serve`` with two engines on a data dir a
``tiffany run`` used before (the file WAL), and on the local PostgreSQL
(a stream per engine). Runs go to both engines; every read with the
submission's ``min_seq`` finds its run; the feed shows both engines'
events with strictly increasing seqs; a run is cancelled and another
verified through the engine that holds it; the CLI's ``status``, ``runs``
and ``replay --verify`` see every engine; a kill -9 of one engine loses
none of its runs; a restart with fewer engines still starts the others.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from process_support import projector_pid, terminate, wait_for
from websockets.sync.client import connect

from tiffany.feed.events import SEQS_PER_RECORD
from tiffany.feed.transport import FEED_SOCKET
from tiffany.wire.control import call
from tiffany.wire.shards import engine_for_key, engine_home, engine_of, seq_base

NAP = {"name": "nap", "steps": [{"id": "nap", "tool": "sleep", "args": {"seconds": 0.2}}]}
LONG = {"name": "long", "steps": [{"id": "wait", "tool": "sleep", "args": {"seconds": 60}}]}
#: Held running on its first step until the test sends ``go`` (a 1 s sleep could
#: end before a loaded machine's CLI had started to list it).
TWO = {
    "name": "two",
    "steps": [
        {"id": "first", "tool": "signal.wait", "args": {"name": "go"}},
        {"id": "second", "tool": "sleep", "args": {"seconds": 0.1}, "after": ["first"]},
    ],
}


def _http(url: str, body: dict[str, Any] | None = None, method: str | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _http_keyed(url: str, body: dict[str, Any], key: str) -> Any:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "Idempotency-Key": key},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _one_run_per_key(
    data: Path, env: dict[str, str], url: str, plan: Path, keys: list[str]
) -> list[tuple[str, dict[str, Any]]]:
    """Submit each key from the CLI then over HTTP, and a twin key the other way round.

    Each pair must give one run (``created`` false the second time, the
    CLI saying so); returns ``(key, the HTTP answer)`` for the CLI-first keys.
    """
    out = []
    for key in keys:
        by_cli = _cli(data, env, "submit", str(plan), "--idempotency-key", key)
        assert by_cli.returncode == 0, by_cli.stderr
        again = _http_keyed(url + "api/runs", {"plan": NAP}, key)
        assert again["created"] is False, (key, again)
        assert again["run_id"] == by_cli.stdout.strip()
        out.append((key, again))
        first = _http_keyed(url + "api/runs", {"plan": NAP}, key + "-api")
        by_cli = _cli(data, env, "submit", str(plan), "--idempotency-key", key + "-api")
        assert by_cli.returncode == 0, by_cli.stderr
        assert by_cli.stdout.strip() == first["run_id"]
        assert "an earlier submission with this idempotency key" in by_cli.stderr
    return out


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    return env | {"TIFFANY_LOG_FORMAT": "json"} | (extra or {})


def _serve(data_dir: Path, engines: int, env: dict[str, str], log: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "tiffany", "serve", "--data-dir", str(data_dir)),
            *("--port", "0", "--engines", str(engines)),
        ],
        stdout=(data_dir.parent / log).open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )


def _cli(data_dir: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tiffany", *args, "--data-dir", str(data_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _up(data_dir: Path) -> dict[str, Any]:
    ready = data_dir / "serve.json"
    wait_for(ready.exists, 90, f"{ready}")
    info: dict[str, Any] = json.loads(ready.read_text())
    wait_for(lambda: _ready(info["url"]), 60, "/readyz")
    return info


def _ready(url: str) -> bool:
    try:
        return bool(_http(url + "readyz")["ready"])
    except urllib.error.HTTPError:
        return False


def _finished(url: str, run_id: str, seq: int) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        run: dict[str, Any] = _http(f"{url}api/runs/{run_id}?min_seq={seq}")
        return run if run["status"] in ("succeeded", "failed", "cancelled") else None

    result: dict[str, Any] = wait_for(done, 60, f"run {run_id} to finish")
    return result


def test_two_engines_share_the_runs_of_a_data_dir_used_before(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = _env()
    plan = tmp_path / "nap.json"
    plan.write_text(json.dumps(NAP))
    # The data dir has history: a run of the CLI, before any server.
    before = _cli(data, env, "run", str(plan), "--json")
    assert before.returncode == 0, before.stderr
    earlier = json.loads(before.stdout)["run_id"]

    serve = _serve(data, 2, env, "serve.log")
    try:
        info = _up(data)
        url = info["url"]
        assert len(info["engine_pids"]) == 2
        with connect(url.replace("http", "ws", 1) + "ws/activity") as ws:
            answers = [_http(url + "api/runs", {"plan": NAP}) for _ in range(12)]
            # Each engine got runs, in its own seq range.
            engines = {engine_of(a["seq"]) for a in answers}
            assert engines == {0, 1}, answers
            for a in answers:  # read your writes: no 404, whichever engine ran it
                run = _finished(url, a["run_id"], a["seq"])
                assert run["status"] == "succeeded", run
            seen: list[dict[str, Any]] = []
            deadline = time.monotonic() + 10
            mine = {a["run_id"] for a in answers}
            while time.monotonic() < deadline:
                finished = {e["run_id"] for e in seen if e["kind"] == "run.finished"}
                if mine <= finished:
                    break
                try:
                    frame = json.loads(ws.recv(timeout=0.5))
                except TimeoutError:
                    continue
                seen += [e for e in (frame if isinstance(frame, list) else [frame]) if "seq" in e]
        # The one feed shows both engines' activity, seqs strictly increasing.
        assert {e["engine"] for e in seen} == {0, 1}
        seqs = [e["seq"] for e in seen]
        assert seqs == sorted(set(seqs)), "feed seqs must strictly increase"
        assert mine <= {e["run_id"] for e in seen if e["kind"] == "run.finished"}
        for e in seen:
            assert engine_of(e["wal_seq"]) == e["engine"] or e["wal_seq"] == seq_base(e["engine"])

        # The list holds every run, the CLI's earlier one too, with both engines' min_seqs.
        q = "&".join(f"min_seq={a['seq']}" for a in answers[-2:])
        listed = _http(f"{url}api/runs?limit=100&{q}")
        assert {a["run_id"] for a in answers} | {earlier} <= {r["run_id"] for r in listed["runs"]}

        # A run's commands reach the engine that holds it.
        longs = [_http(url + "api/runs", {"plan": LONG}) for _ in range(2)]
        assert {engine_of(a["seq"]) for a in longs} == {0, 1}
        for a in longs:
            wait_for(
                lambda a=a: (
                    _http(f"{url}api/runs/{a['run_id']}?min_seq={a['seq']}")["status"] == "running"
                ),
                30,
                "the long run to be running",
            )
            _http(f"{url}api/runs/{a['run_id']}/cancel", {}, method="POST")
            assert _finished(url, a["run_id"], a["seq"])["status"] == "cancelled"
        on_one = next(a for a in answers if engine_of(a["seq"]) == 1)

        # An idempotency key meets the same engine from the CLI as from the API,
        # whichever submits first: one run per key (keys for both engines).
        keys = {engine_for_key(k, 2): k for k in ("key-a", "key-b", "key-c", "key-d")}
        assert set(keys) == {0, 1}
        for key, run in _one_run_per_key(data, env, url, plan, list(keys.values())):
            assert engine_of(run["seq"]) == engine_for_key(key, 2)

        report = _http(f"{url}api/runs/{on_one['run_id']}/verify", {}, method="POST")
        assert report["ok"] is True, report

        # The CLI beside the server sees every engine.
        status = _cli(data, env, "status")
        assert status.returncode == 0, status.stderr
        listed_engines = json.loads(status.stdout)["engines"]
        assert [e["engine"] for e in listed_engines] == [0, 1]
        assert all(e["ready"] for e in listed_engines)

        # kill -9 one engine mid-run: serve restarts it, its run resumes and finishes.
        two = [_http(url + "api/runs", {"plan": TWO}) for _ in range(4)]
        victim = next(a for a in two if engine_of(a["seq"]) == 1)
        wait_for(
            lambda: any(
                s["step_id"] == "first" and s["status"] == "running"
                for s in _http(f"{url}api/runs/{victim['run_id']}?min_seq={victim['seq']}")["steps"]
            ),
            30,
            "the first step to run",
        )
        # `tiffany status` lists each engine's running runs.
        running = json.loads(_cli(data, env, "status").stdout)["engines"][1]["running"]
        assert victim["run_id"] in running
        os.kill(info["engine_pids"][1], signal.SIGKILL)
        for a in two:  # the restarted engine's run waits again, and takes its signal

            def sent(a: dict[str, Any] = a) -> bool:
                try:
                    _http(f"{url}api/runs/{a['run_id']}/signals/go", {"payload": 1}, method="POST")
                except urllib.error.HTTPError as exc:
                    if exc.code == 503:  # its engine is restarting
                        return False
                    raise
                return True

            wait_for(sent, 60, "the signal to be taken")
        for a in two:
            run = _finished(url, a["run_id"], a["seq"])
            assert run["status"] == "succeeded", run
    finally:
        assert terminate(serve) == 0, (tmp_path / "serve.log").read_text()[-3000:]

    # Offline: the journals of both engines are read by the CLI.
    runs = _cli(data, env, "runs", "--json")
    assert runs.returncode == 0, runs.stderr
    ids = {json.loads(line)["run_id"] for line in runs.stdout.splitlines()}
    assert {a["run_id"] for a in answers} | {earlier} <= ids
    replay = _cli(data, env, "replay", on_one["run_id"], "--verify")
    assert replay.returncode == 0, replay.stdout + replay.stderr
    verify = _cli(data, env, "wal", "verify", "--engine", "1")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "WAL ok" in verify.stdout

    # Served again with one engine asked: the second engine's journal is still served.
    again = _serve(data, 1, env, "again.log")
    try:
        info = _up(data)
        assert len(info["engine_pids"]) == 2
        listed = _http(info["url"] + "api/runs?limit=100")
        assert on_one["run_id"] in {r["run_id"] for r in listed["runs"]}
    finally:
        assert terminate(again) == 0
    assert "starting them all" in (tmp_path / "again.log").read_text()


def test_two_engines_on_postgresql_each_write_a_stream(tmp_path: Path, pg_schema_url: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    env = _env({"TIFFANY_DATABASE_URL": pg_schema_url, "TIFFANY_JOURNAL": "postgres"})
    serve = _serve(data, 2, env, "serve.log")
    try:
        info = _up(data)
        url = info["url"]
        # Whichever engine claims first takes a submission (the less loaded
        # one asks sooner): on a busy machine one engine can take eight in a
        # row, so submit until each has taken some, forty at most.
        answers = [_http(url + "api/runs", {"plan": NAP}) for _ in range(8)]
        while {engine_of(a["seq"]) for a in answers} != {0, 1} and len(answers) < 40:
            answers.append(_http(url + "api/runs", {"plan": NAP}))
        assert {engine_of(a["seq"]) for a in answers} == {0, 1}
        for a in answers:
            assert _finished(url, a["run_id"], a["seq"])["status"] == "succeeded"
        streams = _cli(data, env, "wal", "streams", "--json")
        assert streams.returncode == 0, streams.stderr
        heads = {s["stream"]: s["head"] for s in map(json.loads, streams.stdout.splitlines())}
        assert set(heads) == {"main", "main-1"}
        assert 0 < heads["main"] < seq_base(1) < heads["main-1"]
        on_one = next(a for a in answers if engine_of(a["seq"]) == 1)
        # The CLI submits through the database too: a key is one run, from either side.
        plan = tmp_path / "nap.json"
        plan.write_text(json.dumps(NAP))
        _one_run_per_key(data, env, url, plan, ["pg-key-a", "pg-key-b", "pg-key-c"])
        # A run's command from the CLI on another host (a data dir with no
        # engine) reaches the run's engine through the database.
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        longs = [_http(url + "api/runs", {"plan": LONG}) for _ in range(2)]
        while {engine_of(a["seq"]) for a in longs} != {0, 1} and len(longs) < 20:
            longs.append(_http(url + "api/runs", {"plan": LONG}))
        for a in longs:
            run = _http(f"{url}api/runs/{a['run_id']}?min_seq={a['seq']}")
            assert run["status"] in ("pending", "running")
            cancelled = _cli(elsewhere, env, "cancel", a["run_id"])
            assert cancelled.returncode == 0, cancelled.stderr
            assert _finished(url, a["run_id"], a["seq"])["status"] == "cancelled"
        unknown = _cli(elsewhere, env, "cancel", "run-nobody")
        assert unknown.returncode == 3, unknown.stderr
        assert "no run 'run-nobody'" in unknown.stderr

        report = _http(f"{url}api/runs/{on_one['run_id']}/verify", {}, method="POST")
        assert report["ok"] is True, report
    finally:
        assert terminate(serve) == 0, (tmp_path / "serve.log").read_text()[-3000:]
    replay = _cli(data, env, "replay", on_one["run_id"], "--verify")
    assert replay.returncode == 0, replay.stdout + replay.stderr


GATED = {
    "name": "gated",
    "steps": [
        {"id": "wait", "tool": "signal.wait", "args": {"name": "go"}},
        {
            "id": "w",
            "tool": "file.write",
            "args": {"path": "t.txt", "content": "x"},
            "after": ["wait"],
        },
    ],
}


def _finished_on_engine(home: Path, url: str, *, projected_start: bool) -> str:
    """Start a gated run on the engine at ``home``, follow its feed, return the id at its end.

    ``projected_start``: the store shows the run before its engine's
    projector is stopped (else its start is not in the store either).
    """
    answer = call(home, "submit", plan=GATED, inputs={})
    run_id = str(answer["run_id"])
    if projected_start:
        shown = _http(f"{url}api/runs/{run_id}?min_seq={answer['seq']}")["status"]
        assert shown in ("running", "waiting")  # waiting once its step waits for go
    os.kill(_projector(home), signal.SIGSTOP)  # the store stops moving; the journal does not
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as feed:
        feed.settimeout(60)
        feed.connect(str(home / FEED_SOCKET))
        # From the run's start (as `tail --run` follows): its end is not missed
        # if the signal ends the run before the feed takes the subscription.
        since = (answer["seq"] - seq_base(engine_of(answer["seq"]))) * SEQS_PER_RECORD - 1
        feed.sendall(json.dumps({"since": since, "run_id": run_id}).encode() + b"\n")
        call(home, "signal", run_id=run_id, name="go", payload=None)
        for line in feed.makefile("rb"):
            if json.loads(line).get("kind") == "run.finished":
                return run_id
    raise AssertionError(f"the feed ended before {run_id} finished")


def _projector(home: Path) -> int:
    return projector_pid(int(json.loads((home / "engine.json").read_text())["pid"]))


def _while_behind(home: Path, send: Callable[[], Any]) -> Any:
    """``send()`` while the projector of ``home`` is stopped; it goes on after half a second.

    A re-run may wait for the store (up to 5 s); one sent to an engine that
    does not wait for it is answered at once, from a store without the run.
    """
    answers: list[Any] = []
    sender = threading.Thread(target=lambda: answers.append(send()))
    sender.start()
    sender.join(0.5)
    os.kill(_projector(home), signal.SIGCONT)
    sender.join(60)
    return answers[0]


def test_a_rerun_sent_as_its_run_finishes_reaches_the_store_of_the_engine_that_ran_it(
    tmp_path: Path,
) -> None:
    # Following the feed (`tiffany tail`, the dashboard) and re-running at
    # run.finished: the engine that took the re-run (round robin, or the
    # key's) waited for its own projection only, read the store before the
    # other engine's projection held the run's end, and refused the re-run
    # as unknown (404) or not finished (409). Engine 1's projector is held
    # back (SIGSTOP) to make its lag certain.
    data = tmp_path / "data"
    env = _env()
    serve = _serve(data, 2, env, "serve.log")
    try:
        url = _up(data)["url"]
        one = engine_home(data, 1)  # every source run on engine 1, the re-runs anywhere
        keys = iter([k for k in (f"again-{i}" for i in range(40)) if engine_for_key(k, 2) == 0])
        for i in range(8):  # no key (round robin: engine 0 half the time) and a key of engine 0
            source = _finished_on_engine(one, url, projected_start=i % 4 >= 2)
            headers = {"Idempotency-Key": next(keys)} if i % 2 else {}

            def rerun(source: str = source, headers: dict[str, str] = headers) -> httpx.Response:
                return httpx.post(
                    f"{url}api/runs/{source}/rerun",
                    json={"from_step": "w"},
                    headers=headers,
                    timeout=30,
                )

            again = _while_behind(one, rerun)
            assert again.status_code == 201, (i, again.text)
            new = again.json()
            run = _finished(url, new["run_id"], new["seq"])
            assert run["status"] == "succeeded", run
            assert run["entry"]["rerun_of"]["run_id"] == source
            if headers:  # the key's engine took it, and remembers it
                assert engine_of(new["seq"]) == 0
                same = rerun()
                assert (same.status_code, same.json()["run_id"]) == (200, new["run_id"])
            else:  # the engine of the source run
                assert engine_of(new["seq"]) == 1
        # `tiffany rerun` beside the server, likewise.
        source = _finished_on_engine(one, url, projected_start=False)
        cli = _while_behind(one, lambda: _cli(data, env, "rerun", source, "--from", "w"))
        assert cli.returncode == 0, cli.stderr
        assert _http(f"{url}api/runs/{cli.stdout.strip()}")["entry"]["rerun_of"]["run_id"] == source
    finally:
        assert terminate(serve) == 0, (tmp_path / "serve.log").read_text()[-3000:]
