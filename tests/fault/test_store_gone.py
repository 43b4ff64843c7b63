"""The store's database goes away and comes back (through a TCP proxy the test cuts).

``tiffany serve`` with a PostgreSQL store reached through a small TCP proxy
on 127.0.0.1. The test cuts the proxy (open connections reset, new ones
closed at once) while runs are submitted, then restores it. While the
projector cannot write, ``/readyz`` answers 503 ("store stalled: ...");
after, every run is projected, none lost or duplicated (the store equals
a rebuild from the WAL), and ``/readyz`` is ready again. On the old code
``/readyz`` said ready throughout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from process_support import wait_for as _wait
from sqlalchemy import Engine, select, text

from tiffany.store import Base, make_engine

PLAN = {"name": "nap", "steps": [{"id": "a", "tool": "sleep", "args": {"seconds": 0}}]}


class Proxy:
    """A TCP proxy on 127.0.0.1 to ``target`` that can be cut and restored."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.up = True
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Reset every open connection; close new ones at once."""
        self.up = False
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def restore(self) -> None:
        """Forward again."""
        self.up = True

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._server.close()


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _submit(url: str, name: str) -> str:
    body = json.dumps({"plan": {**PLAN, "name": name}}).encode()
    req = urllib.request.Request(
        url + "api/runs", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 201
        return str(json.loads(resp.read())["run_id"])


def _readyz(url: str, status: int) -> dict[str, Any] | None:
    """``/readyz``'s body if it answers ``status``, else None."""
    got, body = _get(url + "readyz")
    return body if got == status else None


@pytest.fixture
def schema(postgres_url: str) -> Iterator[str]:
    """A private schema in the shared test database, dropped afterwards."""
    name = f"store_gone_{uuid.uuid4().hex[:10]}"
    admin = make_engine(postgres_url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{name}"'))
    try:
        yield name
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{name}" CASCADE'))
        admin.dispose()


def _url(postgres_url: str, port: int, schema: str) -> str:
    parts = urlsplit(postgres_url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"{netloc[0]}@127.0.0.1:{port}" if len(netloc) == 2 else f"127.0.0.1:{port}"
    return f"{parts.scheme}://{host}{parts.path}?options=-csearch_path%3D{schema}"


def _dump(engine: Engine) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    with engine.connect() as conn:
        for table in Base.metadata.sorted_tables:
            rows = conn.execute(select(table).order_by(*table.primary_key.columns)).mappings()
            out[table.name] = [dict(r) for r in rows]
    return out


def test_runs_submitted_while_the_store_is_away_are_all_projected_after(
    tmp_path: Path, postgres_url: str, schema: str
) -> None:
    parts = urlsplit(postgres_url)
    proxy = Proxy((parts.hostname or "127.0.0.1", parts.port or 5432))
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIFFANY_")}
    env["TIFFANY_DATABASE_URL"] = _url(postgres_url, proxy.port, schema)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tiffany", "serve", "--data-dir", str(data), "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        ready_file = data / "serve.json"
        _wait(lambda: ready_file.exists() or proc.poll() is not None, 60, "serve.json")
        assert proc.poll() is None, "serve exited while starting"
        url = json.loads(ready_file.read_text())["url"]
        assert _wait(lambda: _get(url + "readyz")[1].get("ready"), 60, "readyz")
        ids = [_submit(url, f"before-{i}") for i in range(2)]

        def projected() -> bool:
            runs = _get(url + "api/runs?limit=100")[1].get("runs") or []
            done = {r["run_id"] for r in runs if r["status"] == "succeeded"}
            return done == set(ids)

        _wait(projected, 60, "the first runs in the store")

        proxy.cut()
        ids += [_submit(url, f"away-{i}") for i in range(5)]
        body = _wait(lambda: _readyz(url, 503), 60, "/readyz to say the store is stuck")
        assert body["reason"].startswith("store stalled"), body
        assert body["store"]["lag_records"] > 0
        assert body["store"]["consecutive_errors"] > 0

        proxy.restore()
        _wait(projected, 60, "every run in the store after it came back")
        # Ready again, and caught up (readyz may say ready while the last few
        # records, written as the runs ended, are still on their way in).
        body = _wait(
            lambda: (b := _readyz(url, 200)) and b["store"]["lag_records"] == 0 and b,
            60,
            "/readyz to say ready again, with no lag",
        )
        assert body["store"]["dead_letters"] == 0
        runs = _get(url + "api/runs?limit=100")[1]["runs"]
        assert sorted(r["run_id"] for r in runs) == sorted(ids)
        assert len({r["run_no"] for r in runs}) == len(ids)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        proxy.close()

    # Nothing lost or duplicated: the store equals a rebuild from the WAL.
    from tiffany.cli.db import rebuild_store

    direct = make_engine(postgres_url, connect_args={"options": f"-csearch_path={schema}"})
    try:
        projected_rows = _dump(direct)
        records = projected_rows["journal_records"]
        assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
        report = rebuild_store(direct, data / "wal")
        assert report.quarantined == []
        assert _dump(direct) == projected_rows
    finally:
        direct.dispose()
