"""Fixtures for the tool tests: a workspace, tool contexts, a runner on a real scheduler.

``run_tool(tool, args, ctx)`` validates ``args`` with the tool's model and runs
it as the worker does, on a real :class:`Scheduler`: a plain ``run`` through
``yield RunInThread(...)``, a generator ``run`` with ``yield tool.run(...)``
in a task. It returns the tool's result or raises the tool's own exception.
"""

from __future__ import annotations

import dataclasses
import http.server
import inspect
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tiffany.agents.tools.base import ToolContext, ToolSettings
from tiffany.kernel import Clock, RunInThread, Scheduler

#: Set (to 1) by CI: a missing bubblewrap fails the sandbox tests instead of skipping them.
REQUIRE_SERVICES_ENV = "TIFFANY_REQUIRE_SERVICES"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """An empty workspace directory (its parent, ``tmp_path``, is "outside")."""
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def events() -> list[tuple[str, dict[str, Any]]]:
    """What the tools emitted through the contexts ``make_ctx`` builds."""
    return []


@pytest.fixture
def make_ctx(
    workspace: Path, events: list[tuple[str, dict[str, Any]]]
) -> Callable[..., ToolContext]:
    """Build a ToolContext on ``workspace``: ``make_ctx(shell_sandbox="none", ...)``."""

    def make(step_id: str = "step", attempt: int = 1, **settings: Any) -> ToolContext:
        return ToolContext(
            run_id="run-1",
            step_id=step_id,
            attempt=attempt,
            workspace=workspace,
            settings=dataclasses.replace(ToolSettings(), **settings),
            emit=lambda kind, data: events.append((kind, dict(data))),
        )

    return make


def tool_body(tool: Any, args: Any, ctx: ToolContext) -> Any:
    """The coroutine that runs ``tool`` once (thread or task flavour, as ``run`` is)."""
    if inspect.isgeneratorfunction(tool.run):
        return (yield tool.run(args, ctx))
    return (yield RunInThread(tool.run, args, ctx))


def _catching(body: Any) -> Any:
    # The error comes back as a value: a crashed task would be logged with a
    # (slow to render) traceback, and the test wants the exception itself.
    try:
        return True, (yield body)
    except Exception as exc:  # handed back to the test
        return False, exc


def run_tool(
    tool: Any, args: dict[str, Any], ctx: ToolContext, *, clock: Clock | None = None
) -> Any:
    """Run ``tool`` with ``args`` on a fresh scheduler; return its result or raise its error."""
    parsed = tool.Args.model_validate(args)
    with Scheduler(clock=clock) as sched:
        tid = sched.spawn(_catching(tool_body(tool, parsed, ctx)), name=f"tool:{tool.name}")
        sched.run()
        ok, value = sched.result(tid)
    if not ok:
        raise value
    return value


@pytest.fixture(name="run_tool")
def run_tool_fixture() -> Callable[..., Any]:
    """The :func:`run_tool` helper."""
    return run_tool


Handler = Callable[[http.server.BaseHTTPRequestHandler], None]


@pytest.fixture
def http_server() -> Iterator[Callable[[dict[str, Handler]], str]]:
    """Start HTTP servers on 127.0.0.1: ``base = http_server({"/path": handler})``.

    A handler gets the request handler object (``.command``, ``.path``,
    ``.headers``, ``.rfile``) and writes the response. Unknown paths get 404.
    The fixture's ``stop`` event (``handler.server.stop``) is set at teardown so
    slow handlers can end early.
    """
    servers: list[http.server.ThreadingHTTPServer] = []
    stop = threading.Event()

    def start(routes: dict[str, Handler]) -> str:
        class RequestHandler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _dispatch(self) -> None:
                fn = routes.get(self.path.split("?")[0])
                if fn is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                fn(self)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _dispatch

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RequestHandler)
        server.daemon_threads = True
        server.block_on_close = False  # type: ignore[attr-defined]
        server.stop = stop  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        host, port = server.server_address[:2]
        return f"http://{host}:{port}"

    yield start
    stop.set()
    for server in servers:
        server.shutdown()
        server.server_close()


def reply(
    handler: http.server.BaseHTTPRequestHandler,
    status: int,
    body: bytes = b"",
    content_type: str = "text/plain",
    headers: dict[str, str] | None = None,
) -> None:
    """Write a complete response (used by the tests' route handlers)."""
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    for k, v in (headers or {}).items():
        handler.send_header(k, v)
    handler.end_headers()
    handler.wfile.write(body)


def read_body(handler: http.server.BaseHTTPRequestHandler) -> bytes:
    """Read the request body (Content-Length framed)."""
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else b""


@pytest.fixture(name="reply")
def reply_fixture() -> Callable[..., None]:
    """The :func:`reply` helper."""
    return reply


@pytest.fixture(name="read_body")
def read_body_fixture() -> Callable[[Any], bytes]:
    """The :func:`read_body` helper."""
    return read_body


def require_bwrap_env() -> bool:
    """Return True when CI demands the sandbox tests run (never skip)."""
    return os.environ.get(REQUIRE_SERVICES_ENV, "").strip() == "1"
