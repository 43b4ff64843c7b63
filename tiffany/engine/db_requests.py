"""An engine's side of the requests that come through the database (``TIFFANY_JOURNAL=postgres``).

API processes insert rows into ``engine_requests`` (a submission, a cancel,
a verify) and ``NOTIFY tiffany_requests``; docs/engines.md has the whole
protocol. Each engine runs a :class:`RequestClaimer`: a thread that LISTENs,
claims pending rows with ``FOR UPDATE SKIP LOCKED`` (a submission: whichever
engine comes first; a run's command: only the engine named in the row),
hands each to the engine's control handler (the same code as the socket's,
in a small pool of threads, never on the loop), stores the answer and
``NOTIFY tiffany_answers`` with the row's id.

A claim is fenced like a journal commit: it succeeds only while the
engine's stream lease is the one in ``wal_streams`` (same stream, same
epoch), so an engine that lost its stream claims nothing more. Rows an
engine claimed and did not answer before it died are settled by the next
holder of its stream (:meth:`RequestClaimer.settle`): a submission whose
run reached the journal is answered from it, anything else goes back to
``pending``.

Spreading: SKIP LOCKED gives a row to whichever engine asks first, so each
engine waits a millisecond per run it has active (up to 10 ms) before it
claims: the least loaded one asks first.

Discussion: the answer to a submission names the run and its seq, so it
is written only once the RUN_START is durable, as on the socket. The rows
are the requests' only queue: nothing lives in the API's memory, so an API
that restarts, or another API replica, loses no submission, and the
``Idempotency-Key`` is unique in SQL (one row a key) across replicas and
engines. Polling is the fallback (every :data:`POLL_S`) should a
notification be lost with a dropped connection.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final

import psycopg
import structlog

from tiffany.engine.control_server import as_refusal
from tiffany.errors import EngineNotReady
from tiffany.store.models import ANSWERS_CHANNEL, DB_NOW_SQL, REQUESTS_CHANNEL, channel
from tiffany.store.models import MAX_NOTIFY_BYTES as MAX_PAYLOAD_BYTES
from tiffany.wal.pg import conninfo
from tiffany.wire.control import Command, answer_fields, command_of, refusal_fields

__all__ = ["POLL_S", "RequestClaimer"]

log = structlog.get_logger(__name__)

#: How often the claimer looks for pending rows without a notification, in seconds.
POLL_S: Final = 1.0
#: Rows claimed at a time.
CLAIM_BATCH: Final = 8
#: Before a claim, an engine waits this long per run it has active, up to
#: :data:`MAX_DEFER_S`: the least loaded engine claims first (seconds).
DEFER_PER_RUN_S: Final = 0.001
MAX_DEFER_S: Final = 0.01
#: Threads that carry requests out (a submission waits for its RUN_START's commit).
WORKERS: Final = 8

_NOW: Final = DB_NOW_SQL
_CLAIM: Final = f"""
UPDATE engine_requests
   SET state = 'claimed', claimed_at = {_NOW}, engine = %(engine)s
 WHERE id IN (
        SELECT id FROM engine_requests
         WHERE state = 'pending'
           AND ((op = 'submit' AND engine IS NULL) OR engine = %(engine)s)
         ORDER BY id
         LIMIT %(limit)s
           FOR UPDATE SKIP LOCKED)
   AND EXISTS (SELECT 1 FROM wal_streams WHERE stream = %(stream)s AND epoch = %(epoch)s)
RETURNING id, op, run_id, idem_key, body
"""
_ANSWER: Final = "UPDATE engine_requests SET state = 'done', answer = %s WHERE id = %s"
# One statement (one round trip): the answer, and its notification, which
# carries the answer itself when it fits (the API then reads nothing).
_ANSWER_NOTIFY: Final = """
WITH up AS (
  UPDATE engine_requests SET state = 'done', answer = %(answer)s WHERE id = %(id)s RETURNING id
)
SELECT pg_notify(%(channel)s, %(payload)s) FROM up
"""
_NOTIFY: Final = "SELECT pg_notify(%s, %s)"
_MINE: Final = "SELECT id, op, run_id FROM engine_requests WHERE state = 'claimed' AND engine = %s"
_STORED: Final = "SELECT start_seq FROM runs WHERE run_id = %s"
_REQUEUE: Final = (
    "UPDATE engine_requests SET state = 'pending', claimed_at = NULL, "
    "engine = CASE WHEN op = 'submit' THEN NULL ELSE engine END WHERE id = %s"
)
#: Answered rows older than the idempotency window are deleted (their key is free again).
_FORGET: Final = (
    f"DELETE FROM engine_requests WHERE state IN ('done', 'withdrawn') AND created_at < {_NOW} - %s"
)


class RequestClaimer:
    """Claims and carries out an engine's requests from the database (module docstring).

    Args:
        url: The database (``TIFFANY_DATABASE_URL``).
        engine: This engine's number (``tiffany/wire/shards.py``).
        lease: Returns the engine's stream and lease epoch (the claim's fence).
        handle: The engine's control handler (``ControlRequests.handle``, ``engine/requests.py``).
        window_s: How long answered rows are kept (the idempotency window).
        load: The engine's active runs (its claims wait a little per run, so
            submissions spread over the engines by load).
    """

    def __init__(
        self,
        url: str,
        engine: int,
        lease: Callable[[], tuple[str, int]],
        handle: Callable[[Command], Any],
        *,
        window_s: float = 86_400.0,
        load: Callable[[], int] = lambda: 0,
    ) -> None:
        self.url = url
        self._requests = channel(REQUESTS_CHANNEL, url)
        self._answers = channel(ANSWERS_CHANNEL, url)
        self.load = load
        self.engine = engine
        self.lease = lease
        self.handle = handle
        self.window_s = window_s
        self.claimed = 0
        self.answered = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="tiffany-db-request")
        self._out: psycopg.Connection[Any] | None = None  # answers, under _out_lock
        self._out_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------

    def settle(self, known: Mapping[str, int]) -> int:
        """Settle the rows this engine's stream claimed before and never answered.

        ``known``: run id -> RUN_START seq of the runs the engine's start read
        from its journal. A submission whose run is there, or in the store
        (a run a checkpoint covers), is answered from it: the earlier life of
        the engine died between its commit and the answer. Every other row
        goes back to ``pending``. Returns how many rows were settled.
        """
        settled = 0
        with psycopg.connect(conninfo(self.url), autocommit=True) as conn:
            for rid, op, run_id in conn.execute(_MINE, (self.engine,)).fetchall():
                seq = known.get(run_id) if op == "submit" and run_id else None
                if seq is None and op == "submit" and run_id:
                    row = conn.execute(_STORED, (run_id,)).fetchone()
                    seq = int(row[0]) if row and row[0] is not None else None
                if seq is not None:
                    answer = {"run_id": run_id, "created": True, "seq": seq}
                    with conn.transaction():
                        conn.execute(_ANSWER, (json.dumps(answer), rid))
                        conn.execute(_NOTIFY, (self._answers, str(rid)))
                else:
                    with conn.transaction():
                        conn.execute(_REQUEUE, (rid,))
                        conn.execute(_NOTIFY, (self._requests, str(rid)))
                settled += 1
        if settled:
            log.info("engine.requests_settled", rows=settled, engine=self.engine)
        return settled

    def start(self) -> None:
        """Start claiming (a thread of its own)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="tiffany-db-requests", daemon=True
            )
            self._thread.start()

    def pause(self) -> None:
        """Claim nothing more (any thread; the engine is stopping)."""
        self._stop.set()

    def stop(self) -> None:
        """Stop claiming; finish the requests in hand (their answers are written)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._pool.shutdown(wait=True, cancel_futures=False)
        with self._out_lock:
            if self._out is not None:
                self._out.close()
                self._out = None

    # -- the claiming thread -------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen()
            except psycopg.Error as exc:
                log.warning("engine.requests_db_error", error=str(exc), retry_in_s=POLL_S)
                self._stop.wait(POLL_S)

    def _listen(self) -> None:
        with psycopg.connect(conninfo(self.url), autocommit=True) as conn:
            conn.execute(f'LISTEN "{self._requests}"')
            last_forget = 0.0
            while not self._stop.is_set():
                defer = min(self.load() * DEFER_PER_RUN_S, MAX_DEFER_S)
                if defer and self._stop.wait(defer):
                    break
                rows = self._claim(conn)
                for row in rows:
                    self._pool.submit(self._carry_out, *row)
                if len(rows) == CLAIM_BATCH:
                    continue  # more may wait
                if time.monotonic() - last_forget > 60.0:
                    last_forget = time.monotonic()
                    conn.execute(_FORGET, (self.window_s,))
                # Until a notification (any: a claim sorts them out) or the poll.
                for _ in conn.notifies(timeout=POLL_S, stop_after=1):
                    pass

    def _claim(self, conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
        stream, epoch = self.lease()
        args = {"engine": self.engine, "limit": CLAIM_BATCH, "stream": stream, "epoch": epoch}
        rows = conn.execute(_CLAIM, args).fetchall()
        self.claimed += len(rows)
        return rows

    def _carry_out(self, rid: int, op: str, run_id: str | None, key: str | None, body: Any) -> None:
        """Decode the row's command and hand it to the engine's handler.

        The row's ``op`` column routes it (``submit``: any engine may take
        it; otherwise the engine named in the row); its body is the command,
        with its own ``op`` (a re-run's row is routed as a ``submit``, its
        body is a ``rerun``).
        """
        fields = dict(body) if isinstance(body, Mapping) else {}
        fields.setdefault("op", op)
        fields["run_id"] = run_id
        if op == "submit":
            fields["key"] = key
        try:
            answer = self.handle(command_of(fields))
        except Exception as exc:  # noqa: BLE001 - settled below as the answer
            self._settle(rid, op, None, exc)
            return
        if isinstance(answer, Future):
            # A submission waits for its group commit holding no worker: the
            # answer is written from the pool once the future is done.
            answer.add_done_callback(lambda fut: self._finish_later(rid, op, fut))
            return
        self._settle(rid, op, answer, None)

    def _finish_later(self, rid: int, op: str, fut: Future[Any]) -> None:
        exc = fut.exception()
        try:
            self._pool.submit(self._settle, rid, op, None if exc else fut.result(), exc)
        except RuntimeError:  # shutting down: the row stays claimed, the next holder settles it
            return

    def _settle(self, rid: int, op: str, answer: Any, error: BaseException | None) -> None:
        """Write the answer (or the refusal) to the request's row; not ready puts it back."""
        result: dict[str, Any]
        if error is None:
            result = dict(answer_fields(answer or {}))
        elif isinstance(error, EngineNotReady):
            # Stopping, or busy: another engine (or a later try) takes it.
            self._requeue(rid)
            return
        else:
            result = {"error": refusal_fields(as_refusal(error, op))}
        try:
            self._answer(rid, result)
        except psycopg.Error as exc:
            # The row stays claimed: the next holder of the stream settles it.
            log.warning("engine.request_answer_lost", id=rid, error=str(exc))

    def _answer(self, rid: int, result: dict[str, Any]) -> None:
        text = json.dumps(result, default=str)
        payload = f"{rid} {text}"
        if len(payload.encode()) > MAX_PAYLOAD_BYTES:
            payload = str(rid)  # the API reads the row
        with self._out_lock:
            conn = self._connection()
            conn.execute(
                _ANSWER_NOTIFY,
                {"answer": text, "id": rid, "channel": self._answers, "payload": payload},
            )
        self.answered += 1

    def _requeue(self, rid: int) -> None:
        try:
            with self._out_lock:
                conn = self._connection()
                with conn.transaction():
                    conn.execute(_REQUEUE, (rid,))
                    conn.execute(_NOTIFY, (self._requests, str(rid)))
        except psycopg.Error as exc:
            log.warning("engine.request_requeue_lost", id=rid, error=str(exc))

    def _connection(self) -> psycopg.Connection[Any]:
        conn = self._out
        if conn is None or conn.closed:
            conn = self._out = psycopg.connect(conninfo(self.url), autocommit=True)
        return conn
