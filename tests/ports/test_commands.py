"""The ``Commands`` port (``tiffany/ports/commands.py``): chosen once, the same calls on both.

On the file WAL, a real engine process behind its control socket; on the
PostgreSQL journal, real rows of ``engine_requests`` claimed by a real
:class:`~tiffany.engine.db_requests.RequestClaimer` whose handler records
the typed commands it is given (the engine's own handler is tested with the
engine: tests/engine, tests/api/test_db_requests.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from engine_process import EngineProc

from tiffany.config import Settings, conninfo
from tiffany.errors import (
    InvalidCommand,
    KeyReused,
    RunFinished,
    RunNotFinished,
    RunNotFound,
)
from tiffany.ports.commands import Commands, SocketCommands, commands_for
from tiffany.ports.commands_pg import PgCommands
from tiffany.wire.control import (
    Cancel,
    Cancelling,
    Command,
    Rerun,
    Signal,
    Signalled,
    Submit,
    Submitted,
    Verify,
)

T = TypeVar("T")

PLAN = {
    "name": "nap",
    "steps": [{"id": "nap", "tool": "sleep", "args": {"seconds": 30}}],
}


def _through(commands: Commands, send: Callable[[Commands], Awaitable[T]]) -> T:
    async def main() -> T:
        commands.start()
        try:
            await commands.connected(5.0)
            return await send(commands)
        finally:
            await commands.close()

    return asyncio.run(main())


async def _nobody(_run_id: str) -> int | None:
    return None


# -- the file WAL: a real engine behind its socket -----------------------------------------


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[EngineProc]:
    proc = EngineProc(tmp_path / "data")
    try:
        proc.wait_ready()
        yield proc
    finally:
        assert proc.stop() == 0, proc.log()


def test_the_file_journal_gets_the_sockets_and_a_real_engine_answers(
    engine: EngineProc, settings: Settings
) -> None:
    settings = settings.model_copy(update={"data_dir": engine.data_dir})
    commands = commands_for(settings, _nobody)  # chosen once, here
    assert isinstance(commands, SocketCommands)
    assert not commands.remote

    async def session(c: Commands) -> dict[str, Any]:
        first = await c.submit(PLAN, {}, "key-1")
        again = await c.submit(PLAN, {}, "key-1")
        signalled = await c.signal(first.run_id, "early", {"n": 1}, "sig-1")
        refused: dict[str, BaseException] = {}
        try:
            await c.verify(first.run_id, 10.0)  # it naps for 30 s: still running
        except RunNotFinished as exc:
            refused["running"] = exc
        cancelled = await c.cancel(first.run_id, "enough")
        for name, call in {
            "unknown": c.cancel("run-nope", "x"),
            "reused": c.submit({**PLAN, "name": "other"}, {}, "key-1"),
            "bad_plan": c.submit({"name": "bad", "steps": [{"id": "a"}]}, {}, None),
            "bad_name": c.signal(first.run_id, "no spaces", None, "sig-2"),
            "rerun_unknown": c.rerun("run-nope", inputs={}, from_step=None, key=None),
        }.items():
            try:
                await call
            except Exception as exc:
                refused[name] = exc
        statuses = await c.status(10.0)
        return {
            "first": first,
            "again": again,
            "signalled": signalled,
            "cancelled": cancelled,
            "refused": refused,
            "statuses": statuses,
        }

    got = _through(commands, session)
    first = got["first"]
    assert isinstance(first, Submitted)
    assert first.created
    assert got["again"] == Submitted(run_id=first.run_id, created=False, seq=first.seq)
    assert isinstance(got["signalled"], Signalled)
    assert got["signalled"].signal_id == "sig-1"
    assert got["signalled"].warning  # no step waits for "early": kept, with a warning
    assert got["cancelled"] == Cancelling(run_id=first.run_id, status="cancelling")
    refused = got["refused"]
    assert isinstance(refused["unknown"], RunNotFound)
    assert isinstance(refused["reused"], KeyReused)
    assert refused["reused"].detail == {"run_id": first.run_id}
    assert isinstance(refused["bad_plan"], InvalidCommand)
    assert isinstance(refused["bad_name"], InvalidCommand)
    assert refused["bad_name"].field == "name"
    assert isinstance(refused["running"], RunNotFinished)
    assert isinstance(refused["rerun_unknown"], RunNotFound)
    (status,) = got["statuses"]
    assert status["ready"] is True


# -- PostgreSQL: rows, claimed by a real claimer -----------------------------------------


class Recorder:
    """An engine's handler that records the typed commands and answers as an engine would."""

    def __init__(self) -> None:
        self.seen: list[Command] = []
        self.lock = threading.Lock()

    def __call__(self, command: Command) -> Any:
        with self.lock:
            self.seen.append(command)
        if isinstance(command, Submit | Rerun):
            done: Future[Submitted] = Future()  # answered later, as a durable submission is
            run_id = command.run_id or "run-x"
            threading.Timer(
                0.05, done.set_result, [Submitted(run_id=run_id, created=True, seq=7)]
            ).start()
            return done
        if isinstance(command, Cancel):
            if command.run_id == "run-done":
                raise RunFinished("run run-done already finished (ok)", detail={"status": "ok"})
            return Cancelling(run_id=command.run_id, status="cancelling")
        if isinstance(command, Signal):
            return Signalled(run_id=command.run_id, name=command.name, seq=9, signal_id="s")
        assert isinstance(command, Verify)
        return {"identical": True, "run_id": command.run_id}


def test_the_postgres_journal_gets_the_rows_and_each_command_arrives_typed(
    pg_migrated_url: str, settings: Settings
) -> None:
    with psycopg.connect(conninfo(pg_migrated_url), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO wal_streams (stream, head, epoch, owner, lease_until) "
            "VALUES ('main', 0, 1, 'test', %s)",
            (time.time() + 600,),  # noqa: TID251 - a lease is wall-clock time
        )
    from tiffany.engine.db_requests import RequestClaimer

    recorder = Recorder()
    claimer = RequestClaimer(pg_migrated_url, 0, lambda: ("main", 1), recorder)
    claimer.start()
    settings = settings.model_copy(update={"journal": "postgres", "database_url": pg_migrated_url})
    owners = {"run-a": 0, "run-done": 0}

    async def owner(run_id: str) -> int | None:
        return owners.get(run_id)

    commands = commands_for(settings, owner)  # chosen once, here
    assert isinstance(commands, PgCommands)
    assert commands.remote

    async def session(c: Commands) -> dict[str, Any]:
        submitted = await c.submit(PLAN, {"a": 1}, "key-pg")
        again = await c.submit(PLAN, {"a": 1}, "key-pg")
        rerun = await c.rerun("run-a", inputs={"b": 2}, from_step="nap", key=None)
        cancelled = await c.cancel("run-a", "enough")
        signalled = await c.signal("run-a", "go", {"n": 1}, "sig-1")
        report = await c.verify("run-a", 10.0)
        refused: dict[str, BaseException] = {}
        for name, call in {
            "finished": c.cancel("run-done", "x"),
            "unknown": c.cancel("run-nope", "x"),
            "reused": c.submit({**PLAN, "name": "other"}, {}, "key-pg"),
        }.items():
            try:
                await call
            except Exception as exc:
                refused[name] = exc
        return locals()

    try:
        got = _through(commands, session)
    finally:
        claimer.stop()
    assert isinstance(got["submitted"], Submitted)
    assert got["again"] == Submitted(
        run_id=got["submitted"].run_id, created=False, seq=got["submitted"].seq
    )
    assert got["cancelled"] == Cancelling(run_id="run-a", status="cancelling")
    assert got["signalled"].seq == 9
    assert got["report"] == {"identical": True, "run_id": "run-a"}
    assert isinstance(got["refused"]["finished"], RunFinished)
    assert got["refused"]["finished"].detail == {"status": "ok"}
    assert isinstance(got["refused"]["unknown"], RunNotFound)  # no row, no store: asked nobody
    assert isinstance(got["refused"]["reused"], KeyReused)
    kinds = [type(c) for c in recorder.seen]
    assert kinds == [Submit, Rerun, Cancel, Signal, Verify, Cancel]
    submit, rerun, cancel, signal = recorder.seen[:4]
    assert isinstance(submit, Submit)
    assert (submit.key, submit.inputs) == ("key-pg", {"a": 1})
    assert isinstance(rerun, Rerun)
    assert (rerun.rerun_of, rerun.from_step, rerun.inputs) == ("run-a", "nap", {"b": 2})
    assert isinstance(cancel, Cancel)
    assert cancel.reason == "enough"
    assert isinstance(signal, Signal)
    assert (signal.name, signal.payload) == ("go", {"n": 1})
