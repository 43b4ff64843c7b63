"""The ``Commands`` port over PostgreSQL (``TIFFANY_JOURNAL=postgres``): requests as rows.

A submission (or a run's cancel, signal or verify) is a row of ``engine_requests``,
inserted and notified in one transaction; an engine claims it, carries it
out and stores its answer (``tiffany/engine/db_requests.py``,
docs/engines.md). The client (the API, the CLI) LISTENs on ``tiffany_answers`` on one
connection and wakes the request waiting for that row; a request re-reads
its row after every wake-up, and after a reconnect, so a lost notification
costs a wait of :data:`RECHECK_S` at most, never an answer.

No engine socket is needed: several API replicas, on hosts without an
engine, serve the same engines. The ``Idempotency-Key`` is unique in SQL:
a repeated key on any replica finds the first submission's row (409 if the
body differs, else the first answer with ``created: false``).

A submission no engine took within ``TIFFANY_ENGINE_WAIT_S`` (default
:data:`SUBMIT_WAIT_S`) is withdrawn (only
while still pending, in one ``UPDATE``): the client gets 503 and nothing
starts later behind its back. One an engine took is waited for longer, up
to the timeout the caller gives. Retried with its ``Idempotency-Key``, a
withdrawn submission is submitted again: its row goes back to ``pending``
(only while still withdrawn, in one ``UPDATE``), with the same run id.

The row's ``op`` column routes it: ``submit`` for what starts a run (any
engine may claim it; the idempotency key and the run's owner are looked up
by it), the command's own ``op`` otherwise; the body is the command, with
its own ``op`` (a re-run's row is routed as a ``submit``, its body is a
``rerun``).

Discussion: the retry used to find the withdrawn row and answer 503 again,
for the rest of the idempotency window: an engine paused (SIGSTOP) or away
for 10 s turned every keyed submission made meanwhile into a key no retry
could ever get a run for (the PostgreSQL soak's "no answer in 300 s of
retries"). Withdrawn means no engine claimed it, so nothing of it started:
taking it again runs it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Awaitable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Final, Protocol

import msgspec
import psycopg
import structlog

from tiffany.config import Settings, conninfo
from tiffany.errors import EngineFault, EngineUnavailable, KeyReused, RunNotFound
from tiffany.ports.commands import LocalEngines, Owner
from tiffany.store.models import (
    ANSWERS_CHANNEL,
    DB_NOW_SQL,
    REQUESTS_CHANNEL,
    channel,
)
from tiffany.wire.control import (
    Cancel,
    Command,
    Export,
    Rerun,
    Signal,
    Submit,
    Submitted,
    Verify,
    Waits,
    answer_of,
    refused,
    submission_digest,
)

__all__ = ["RECHECK_S", "SUBMIT_WAIT_S", "DbRequests", "PgCommands"]

log = structlog.get_logger(__name__)

#: How long a submission waits for an engine to take it before it is withdrawn, in
#: seconds, by default: the setting's own default (``Settings.engine_wait_s``).
SUBMIT_WAIT_S: Final[float] = Settings.model_fields["engine_wait_s"].default
#: How long a request waits for the engine's answer once taken, in seconds (default).
ANSWER_WAIT_S: Final = 30.0
#: A waiting request re-reads its row at least this often, in seconds.
RECHECK_S: Final = 1.0
#: How often :meth:`PgCommands.connected` looks whether the listener is up, in seconds.
LISTEN_POLL_S: Final = 0.01
#: Connections for statements (the listener has its own).
POOL_SIZE: Final = 4

_NOW: Final = DB_NOW_SQL
# One statement (autocommit: one round trip): the row, and its notification.
_INSERT: Final = f"""
WITH ins AS (
  INSERT INTO engine_requests (op, engine, run_id, idem_key, digest, body, state, created_at)
  VALUES (%(op)s, %(engine)s, %(run_id)s, %(key)s, %(digest)s, %(body)s, 'pending', {_NOW})
  ON CONFLICT (idem_key) DO NOTHING
  RETURNING id
)
SELECT id, pg_notify(%(channel)s, id::text) FROM ins
"""
#: Answers that arrived before their request waited for them (kept a while).
EARLY_ANSWERS: Final = 10_000
_BY_KEY: Final = "SELECT id, digest, run_id FROM engine_requests WHERE idem_key = %s"
_ROW: Final = "SELECT state, answer FROM engine_requests WHERE id = %s"
#: A withdrawn submission retried with its key: pending again, notified (one statement).
_REOPEN: Final = f"""
WITH up AS (
  UPDATE engine_requests SET state = 'pending', created_at = {_NOW}
   WHERE id = %(id)s AND state = 'withdrawn'
  RETURNING id
)
SELECT id, pg_notify(%(channel)s, id::text) FROM up
"""
_WITHDRAW: Final = (
    "UPDATE engine_requests SET state = 'withdrawn' WHERE id = %s AND state = 'pending' "
    "RETURNING id"
)
_OWNER: Final = (
    "SELECT engine FROM engine_requests WHERE op = 'submit' AND run_id = %s "
    "AND engine IS NOT NULL ORDER BY id DESC LIMIT 1"
)
_LEASES: Final = f"SELECT count(*) FROM wal_streams WHERE lease_until > {_NOW} AND owner <> ALL(%s)"


class Connections(Protocol):
    """Autocommit connections to the database, for statements on the event loop."""

    def connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """A connection, for one statement or a few."""
        ...

    async def close(self) -> None:
        """Close every connection."""


class Listening(Protocol):
    """One connection LISTENing on some channels, reconnecting until closed."""

    listening: bool

    def start(self) -> None:
        """Start listening (in the running loop)."""

    async def close(self) -> None:
        """Stop listening."""


class DbRequests:
    """Requests to the engines through ``engine_requests`` (module docstring).

    Args:
        url: The database (``TIFFANY_DATABASE_URL``, a PostgreSQL URL).
        submit_wait_s: How long a submission waits for an engine to take it
            before it is withdrawn (``TIFFANY_ENGINE_WAIT_S``).
    """

    def __init__(self, url: str, submit_wait_s: float = SUBMIT_WAIT_S) -> None:
        from tiffany.ports.pg import AsyncPool, Listener  # the postgres extra

        self.dsn = conninfo(url)
        self.submit_wait_s = submit_wait_s
        self._requests = channel(REQUESTS_CHANNEL, url)
        self._waiters: dict[int, asyncio.Event] = {}
        #: Answers carried by their notification, by row id, until taken.
        self._answers: dict[int, Any] = {}
        self._pool = AsyncPool(self.dsn, POOL_SIZE)
        self._listener = Listener(
            self.dsn,
            {ANSWERS_CHANNEL: self._answered},
            "tiffany-api-db-answers",
            self._reconnected,
        )

    # -- lifecycle -------------------------------------------------------------------

    @property
    def listening(self) -> bool:
        """Whether the listener is connected (the answers' notifications arrive)."""
        return self._listener.listening

    def start(self) -> None:
        """Start listening for answers (reconnects until :meth:`close`)."""
        self._listener.start()

    async def close(self) -> None:
        """Stop listening and close every connection."""
        await self._listener.close()
        await self._pool.close()

    # -- requests ----------------------------------------------------------------------

    async def submit(
        self,
        plan: Any,
        inputs: Any,
        key: str | None,
        *,
        timeout: float = ANSWER_WAIT_S,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Submit a plan; return the engine's answer ``{"run_id", "created", "seq"}``.

        ``extra``: more fields of the request (a re-run's ``rerun_of`` and
        ``from_step``), in its body and its idempotency digest.

        Raises:
            Refusal: The engine refused it (invalid), or the key names another
                body (:class:`~tiffany.errors.KeyReused`).
            EngineUnavailable: No engine took it in time (withdrawn: nothing
                starts), or the engine that took it did not answer in time.
        """
        digest = submission_digest(plan if not extra else {"plan": plan, **extra}, inputs)
        run_id = f"run-{uuid.uuid4().hex[:12]}"
        rid = await self._insert(
            "submit", None, run_id, key, digest, {"plan": plan, "inputs": inputs, **(extra or {})}
        )
        if rid is None:  # the key names an earlier submission
            assert key is not None
            row = await self._fetch(_BY_KEY, (key,))
            if row is None:  # deleted meanwhile (past its window): a new one
                return await self.submit(plan, inputs, key, timeout=timeout, extra=extra)
            first, first_digest, first_run = row
            if first_digest != digest:
                raise KeyReused(
                    f"Idempotency-Key {key!r} was used for a different submission "
                    f"(run {first_run})",
                    detail={"run_id": first_run},
                )
            if await self._fetch(_REOPEN, {"id": first, "channel": self._requests}):
                # Withdrawn, so nothing started: this retry submits it (created, if it runs now).
                return await self._answer(first, timeout, withdraw=True, fresh=True)
            answer = await self._answer(first, timeout, withdraw=False)
            return {**answer, "created": False}
        return await self._answer(rid, timeout, withdraw=True, fresh=True)

    async def request(
        self, op: str, engine: int, run_id: str, *, timeout: float = ANSWER_WAIT_S, **fields: Any
    ) -> dict[str, Any]:
        """Ask engine ``engine`` to do ``op`` (cancel, signal, verify) for ``run_id``."""
        rid = await self._insert(op, engine, run_id, None, None, fields)
        assert rid is not None
        return await self._answer(rid, timeout, withdraw=True, fresh=True)

    async def owner(self, run_id: str) -> int | None:
        """The engine that took ``run_id``'s submission (None: not submitted through here)."""
        row = await self._fetch(_OWNER, (run_id,))
        return None if row is None else int(row[0])

    async def engines_alive(self, besides: Sequence[str] = ()) -> int:
        """How many journal streams are held under a current lease, by owners not in ``besides``.

        ``besides``: the lease owners of this data dir's own engines
        (:func:`tiffany.wire.shards.owners_here`), which are not engines elsewhere.
        """
        row = await self._fetch(_LEASES, (list(besides),))
        return 0 if row is None else int(row[0])

    def _answered(self, payload: str) -> None:
        """A notification on ``tiffany_answers``: ``"<id>"``, or ``"<id> <answer JSON>"``."""
        number, _, answer = payload.partition(" ")
        if not number.isdigit():
            return
        rid = int(number)
        if answer:
            self._answers[rid] = answer
            if len(self._answers) > EARLY_ANSWERS:  # nobody waits for the oldest
                del self._answers[next(iter(self._answers))]
        woken = self._waiters.get(rid)
        if woken is not None:
            woken.set()

    def _reconnected(self) -> None:
        """After a (re)connect: what was answered meanwhile is re-read by its request."""
        for event in list(self._waiters.values()):
            event.set()

    # -- internals -------------------------------------------------------------------

    async def _insert(
        self,
        op: str,
        engine: int | None,
        run_id: str,
        key: str | None,
        digest: str | None,
        body: dict[str, Any],
    ) -> int | None:
        args = {
            "op": op,
            "engine": engine,
            "run_id": run_id,
            "key": key,
            "digest": digest,
            "body": json.dumps(body),
            "channel": self._requests,
        }
        row = await self._fetch(_INSERT, args)
        return None if row is None else int(row[0])

    async def _fetch(self, sql: str, args: Any) -> tuple[Any, ...] | None:
        async with self._connection() as conn:
            row: tuple[Any, ...] | None = await (await conn.execute(sql, args)).fetchone()
            return row

    async def _answer(
        self, rid: int, timeout: float, *, withdraw: bool, fresh: bool = False
    ) -> dict[str, Any]:
        """Wait for row ``rid``'s answer (module docstring).

        ``fresh``: the row was just inserted (pending: no need to read it first).
        Most answers come in their notification; the row is read only when
        one came without it, after a reconnect, and every :data:`RECHECK_S`.
        """
        event = self._waiters.setdefault(rid, asyncio.Event())
        start = time.monotonic()
        taken_by = start + (min(self.submit_wait_s, timeout) if withdraw else timeout)
        read = not fresh
        try:
            while True:
                event.clear()
                if rid in self._answers:
                    return _unwrap(self._answers.pop(rid))
                if read:
                    row = await self._fetch(_ROW, (rid,))
                    state, answer = row if row is not None else ("withdrawn", None)
                else:
                    state, answer, read = "pending", None, True
                if state == "done":
                    return _unwrap(answer)
                if state == "withdrawn":
                    raise EngineUnavailable("the request was withdrawn before an engine took it")
                now = time.monotonic()
                if state == "pending" and now >= taken_by and withdraw:
                    if await self._fetch(_WITHDRAW, (rid,)) is not None:
                        raise EngineUnavailable(
                            f"no engine took the request within {taken_by - start:g} s "
                            "(are the engines up?); it was withdrawn: nothing started"
                        )
                    continue  # an engine took it just now
                if now - start >= timeout:
                    raise EngineUnavailable(
                        f"the engine that took the request did not answer within {timeout:g} s; "
                        "retry with the same Idempotency-Key"
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), RECHECK_S)
        finally:
            self._waiters.pop(rid, None)

    @contextlib.asynccontextmanager
    async def _connection(self) -> Any:
        try:
            async with self._pool.connection() as conn:
                yield conn
        except psycopg.OperationalError as exc:
            raise EngineUnavailable(f"the database cannot be reached: {exc}") from exc


def _unwrap(answer: Any) -> dict[str, Any]:
    """The engine's answer, or its refusal raised (``tiffany.wire.control.refusal_fields``)."""
    if isinstance(answer, str):
        answer = json.loads(answer)
    if not isinstance(answer, dict):
        raise EngineFault(f"the engine's answer is not an object: {answer!r}")
    error = answer.get("error")
    if isinstance(error, dict):
        raise refused(error)
    return answer


class PgCommands(LocalEngines):
    """The :class:`~tiffany.ports.commands.Commands` port through ``engine_requests``.

    Submissions go to whichever engine claims them first, a run's commands
    to the engine that took the run's submission (the store's ``start_seq``
    names it; else the row of its submission), on any host. Status, metrics,
    tools and plan checks ask the engines of this host over their sockets.

    Args:
        url: The database (``TIFFANY_DATABASE_URL``, a PostgreSQL URL).
        homes: This host's engines' homes (their control sockets).
        owner: The engine that started a run, as the store says.
        submit_wait_s: How long a submission waits for an engine to take it
            before it is withdrawn (``TIFFANY_ENGINE_WAIT_S``).
    """

    remote = True

    def __init__(
        self,
        url: str,
        homes: Sequence[Path],
        owner: Owner,
        submit_wait_s: float = SUBMIT_WAIT_S,
    ) -> None:
        super().__init__(homes)
        self.db = DbRequests(url, submit_wait_s)
        self._owner = owner

    @property
    def listening(self) -> bool:
        """Whether the answers' notifications arrive (else a row is re-read each second)."""
        return self.db.listening

    def start(self) -> None:
        """Start listening for the answers."""
        self.db.start()

    async def connected(self, wait_s: float) -> None:
        """Until the listener is up (the answers come as notifications), ``wait_s`` at most."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while not self.db.listening and loop.time() < deadline:
            await asyncio.sleep(LISTEN_POLL_S)

    async def close(self) -> None:
        """Close the sockets and the database's connections."""
        await super().close()
        await self.db.close()

    async def submit(
        self, plan: Any, inputs: Any, key: str | None, *, workflow: str | None = None
    ) -> Submitted:
        """A submission as a row; any engine claims it."""
        extra = {"workflow": workflow} if workflow is not None else None
        answer: Submitted = _typed(Submit(), await self.db.submit(plan, inputs, key, extra=extra))
        return answer

    async def rerun(
        self, run_id: str, *, inputs: dict[str, Any], from_step: str | None, key: str | None
    ) -> Submitted:
        """A re-run as a row routed as a submission (its body a ``rerun``)."""
        extra: dict[str, Any] = {"op": "rerun", "rerun_of": run_id}
        if from_step is not None:
            extra["from_step"] = from_step
        answer: Submitted = _typed(Submit(), await self.db.submit(None, inputs, key, extra=extra))
        return answer

    async def engines_elsewhere(self, besides: Sequence[str]) -> int:
        """How many journal streams are held under a current lease, by owners not in ``besides``."""
        return await self.db.engines_alive(besides)

    async def _for_run(
        self, command: Cancel | Signal | Verify | Export | Waits, timeout: float | None = None
    ) -> Any:
        run_id = command.run_id
        owner = await self._owner(run_id)
        if owner is None:
            owner = await self.db.owner(run_id)
        if owner is None:
            raise RunNotFound(f"no run {run_id!r}")
        fields = msgspec.to_builtins(command)
        op = fields.pop("op")
        fields.pop("run_id", None)
        asked: Awaitable[dict[str, Any]] = (
            self.db.request(op, owner, run_id, **fields)
            if timeout is None
            else self.db.request(op, owner, run_id, timeout=timeout, **fields)
        )
        return _typed(command, await asked)


def _typed(command: Command | Rerun, fields: dict[str, Any]) -> Any:
    return answer_of(command, fields)
