"""``tiffany serve`` started as a user does, from the directory that holds their code.

Importable by name (``from sdk_support import ...``; ``conftest.py`` puts this
directory on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from process_support import serve_argv, terminate, wait_for

from tiffany.config import ENV_PREFIX

#: A user's tool module: what ``--import usertools`` registers on the servers of these tests.
USER_TOOLS = """\
from tiffany import python_tool


@python_tool("word_count")
def word_count(text: str) -> dict:
    return {"words": len(text.split())}


@python_tool("must_be_even")
def must_be_even(n: int) -> dict:
    if n % 2:
        raise ValueError(f"{n} is odd")
    return {"half": n // 2}
"""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env() -> dict[str, str]:
    """The environment without TIFFANY_* settings (a developer's must not leak in)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}


def short_dir(prefix: str) -> Path:
    """A fresh directory with a short path (Unix socket paths are limited to 107 bytes)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@dataclass
class Served:
    """A ``tiffany serve`` subprocess: its URL, data dir and working directory."""

    proc: subprocess.Popen[bytes]
    url: str
    data_dir: Path
    cwd: Path

    def log(self) -> str:
        path = self.data_dir / "serve.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def stop(self) -> int:
        code = terminate(self.proc)
        shutil.rmtree(self.cwd, ignore_errors=True)
        return code


def serve(
    cwd: Path,
    *extra: str,
    env_extra: dict[str, str] | None = None,
    token: str | None = None,
    port: int = 0,
) -> Served:
    """Start ``tiffany serve`` in ``cwd`` on the fresh data dir ``cwd/d``; wait until it is ready.

    ``port`` 0 takes any free port; a restarted API process then takes
    another, so a test that restarts it gives a port of its own.
    """
    data_dir = cwd / "d"
    data_dir.mkdir(parents=True, exist_ok=True)
    env = clean_env() | {"TIFFANY_LOG_FORMAT": "json", **(env_extra or {})}
    if token is not None:
        env["TIFFANY_API_TOKEN"] = token
    proc = subprocess.Popen(
        serve_argv(data_dir, port, *extra),
        cwd=cwd,
        stdout=(data_dir / "serve.log").open("ab"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    ready = data_dir / "serve.json"
    wait_for(lambda: ready.exists() or proc.poll() is not None, 90, "serve.json")
    served = Served(proc, "", data_dir, cwd)
    assert proc.poll() is None, served.log()
    served.url = str(json.loads(ready.read_text())["url"]).rstrip("/")
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    wait_for(
        lambda: httpx.get(served.url + "/readyz", headers=headers).status_code == 200, 60, "readyz"
    )
    return served


class CuttingFront:
    """A TCP front on loopback for the server at ``url``: it cuts the first ``cut`` connections.

    A cut connection is closed once the request's first bytes have arrived,
    unanswered and not passed on (so the server never sees that request):
    the client cannot tell whether it was carried out. Later connections
    are piped through both ways. ``accepted`` counts connections.
    """

    def __init__(self, url: str, cut: int, *, deliver: bool = False) -> None:
        target = urlsplit(url)
        self.target = (target.hostname or "127.0.0.1", int(target.port or 80))
        self.cut = cut
        #: Pass a cut connection's request on, and lose the answer: the server
        #: carried it out, the client cannot tell.
        self.deliver = deliver
        self.accepted = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            self.accepted += 1
            if self.accepted <= self.cut:
                if self.deliver:
                    threading.Thread(target=self._lose_answer, args=(conn,), daemon=True).start()
                    continue
                with conn:
                    conn.recv(1)  # the request is under way
                continue
            upstream = socket.create_connection(self.target)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _lose_answer(self, conn: socket.socket) -> None:
        """Pass the request on; once the answer starts, close the client's connection."""
        with conn, socket.create_connection(self.target) as upstream:
            threading.Thread(target=self._pipe, args=(conn, upstream), daemon=True).start()
            upstream.recv(1)  # the server answered: the request was carried out
            for sock in (conn, upstream):  # wakes the pipe's recv; close alone would not
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()
