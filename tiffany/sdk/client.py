"""The blocking client of the HTTP API: :class:`Client` and the run handle it returns.

Reads pass the WAL seq a submission answered as ``min_seq``, so a run just
submitted reads back at once, never a 404 (docs/clock.md). ``wait`` follows
the run on the activity feed (``/ws/activity?run_id=``) and reads it over
HTTP when the feed says it finished; while the feed is quiet (or cannot be
had: a proxy without websockets) it reads the run at doubling intervals, so
a missed event costs a little time, never a hang.

:class:`~tiffany.sdk.aclient.AsyncClient` has the same methods, awaited.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any, Final

import httpx
import tenacity
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import ClientConnection, connect

from tiffany.sdk import protocol
from tiffany.sdk.errors import ConnectionFailed, Unavailable, WaitTimeout
from tiffany.sdk.models import (
    CancelAnswer,
    Event,
    FeedGap,
    MemoryDeleted,
    MemoryItemDetail,
    MemoryItems,
    MemoryNamespaces,
    MemorySearch,
    RunDetail,
    RunEvents,
    RunList,
    RunStatus,
    RunWaits,
    ScheduleList,
    ScheduleOut,
    SignalAnswer,
    SubmitAnswer,
)
from tiffany.wire.redaction import redact_url_credentials

__all__ = ["Client", "RunHandle"]

#: Run ids whose submission seq a client remembers (for its reads' ``min_seq``).
REMEMBERED_RUNS: Final = 1024
#: What the websocket connection may take to open, in seconds.
FEED_OPEN_TIMEOUT_S: Final = 10.0

_FEED_ERRORS: Final = (OSError, ConnectionClosed, InvalidHandshake, InvalidURI, TimeoutError)


class RunHandle:
    """A run this client started: its ``run_id`` and the WAL ``seq`` of its first record.

    Its methods are the client's, for this run (``handle.wait()`` is
    ``client.wait(handle.run_id)``).
    """

    __slots__ = ("_client", "created", "run_id", "seq")

    def __init__(self, client: Client, answer: SubmitAnswer) -> None:
        self._client = client
        self.run_id = answer.run_id
        self.seq = answer.seq
        #: False when the Idempotency-Key named an earlier submission.
        self.created = answer.created

    def __repr__(self) -> str:
        return f"RunHandle(run_id={self.run_id!r}, seq={self.seq})"

    def get(self) -> RunDetail:
        """The run as the store has it (at least as of its submission)."""
        return self._client.get(self.run_id, min_seq=self.seq)

    def wait(self, timeout: float | None = None) -> RunDetail:
        """Wait for the run to finish (see :meth:`Client.wait`)."""
        return self._client.wait(self.run_id, timeout=timeout)

    def cancel(self) -> CancelAnswer:
        """Cancel the run."""
        return self._client.cancel(self.run_id)

    def signal(self, name: str, payload: Any = None, signal_id: str | None = None) -> SignalAnswer:
        """Send the run signal ``name``."""
        return self._client.signal(self.run_id, name, payload, signal_id=signal_id)

    def events(self, since: int | None = None) -> Iterator[Event | FeedGap]:
        """The run's activity events, until it finishes (see :meth:`Client.events`)."""
        return self._client.events(self.run_id, since=since)


class Client:
    """A client of a Tiffany server's HTTP API (blocking; thread-safe like httpx.Client).

    Args:
        url: The server's base URL; default ``TIFFANY_URL``, else
            ``http://127.0.0.1:8000``.
        token: The API token (sent as ``Authorization: Bearer``); default
            ``TIFFANY_API_TOKEN``, else none.
        timeout: How long one HTTP request may take, in seconds.
        http: An ``httpx.Client`` to use instead of a new one (proxies, TLS
            settings); its base URL and headers are left as they are.
        retries: How many times a request whose connection failed is sent
            again, when that is safe: a read, a request with an
            ``Idempotency-Key``, or one that never reached the server
            (``protocol.retry_delay``). 0: never.

    Raises:
        ValueError: ``url`` is not an http(s) URL.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = protocol.DEFAULT_TIMEOUT_S,
        http: httpx.Client | None = None,
        retries: int = protocol.DEFAULT_RETRIES,
    ) -> None:
        self.url = protocol.resolve_url(url)
        self._token = protocol.resolve_token(token)
        self._headers = protocol.auth_headers(self._token)
        self.retries = retries
        self._own_http = http is None
        self._http = http or httpx.Client(timeout=timeout)
        self._seqs: OrderedDict[str, int] = OrderedDict()

    def __repr__(self) -> str:
        return f"Client({redact_url_credentials(self.url)!r})"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP connections (a client given ``http`` leaves it open)."""
        if self._own_http:
            self._http.close()

    # -- Requests ------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {**self._headers, **kwargs.pop("headers", {})}
        retrying = tenacity.Retrying(**protocol.resending(method, headers, self.retries))
        try:
            return retrying(self._http.request, method, self.url + path, headers=headers, **kwargs)
        except httpx.TransportError as exc:
            raise protocol.unreachable(self.url, exc) from exc

    def _remember(self, answer: SubmitAnswer) -> None:
        self._seqs[answer.run_id] = answer.seq
        self._seqs.move_to_end(answer.run_id)
        while len(self._seqs) > REMEMBERED_RUNS:
            self._seqs.popitem(last=False)

    # -- The server ----------------------------------------------------------------

    def readiness(self) -> dict[str, Any]:
        """The server's ``/readyz`` answer: ``{"ready": bool, ...}`` (ready or not).

        Raises:
            Unauthorized: The token is missing or wrong.
        """
        return protocol.readiness(self._request("GET", "/readyz"))

    # -- Runs ------------------------------------------------------------------

    def submit(
        self,
        plan: Any = None,
        inputs: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        *,
        workflow: str | None = None,
    ) -> RunHandle:
        """Submit a plan; return its run once the run is durable on the server.

        Args:
            plan: The plan: a dict, its JSON or YAML text, or a path to a
                plan file (a :class:`~pathlib.Path`, or a string naming an
                existing file).
            inputs: Inputs, merged over the plan's own (a workflow's: its
                keyword arguments).
            idempotency_key: Submitting again with it returns the first run
                (``created`` False) instead of starting another.
            workflow: Instead of a plan, the name of a ``@workflow`` the
                server imported (``--import MOD``): ``submit(workflow="triage",
                inputs={"repo": "x"})``.

        Raises:
            InvalidRequest: The plan or inputs are invalid (``errors`` name the fields).
            PayloadTooLarge: The plan is larger than the server accepts.
        """
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        body = protocol.submit_body(plan, inputs, workflow)
        got = protocol.answer(
            self._request("POST", "/api/runs", json=body, headers=headers), SubmitAnswer
        )
        self._remember(got)
        return RunHandle(self, got)

    def get(self, run_id: str, min_seq: int | None = None, *, outputs: bool = True) -> RunDetail:
        """The run with its steps, tasks, outputs and error.

        Args:
            run_id: The run.
            min_seq: Answer once the store holds this WAL seq; default: the
                seq of this client's submission of the run, if any.
            outputs: False: without what the run produced (its ``outputs``,
                the steps' ``output``, the tasks' ``result`` are None, their
                sizes in ``outputs_size``, ``output_size``, ``result_size``):
                a status read that stays small however large the results.

        Raises:
            NotFound: No such run.
        """
        if min_seq is None:
            min_seq = self._seqs.get(run_id)
        params = protocol.get_params(min_seq, outputs)
        return protocol.answer(
            self._request("GET", protocol.run_path(run_id), params=params), RunDetail
        )

    def list(
        self,
        status: RunStatus | None = None,
        limit: int = 50,
        before: int | None = None,
        *,
        name: str | None = None,
        q: str | None = None,
        since: float | str | None = None,
        until: float | str | None = None,
    ) -> RunList:
        """A page of runs, newest first (``before``: the previous page's ``next_before``)."""
        params = protocol.list_params(
            limit, status=status, before=before, name=name, q=q, since=since, until=until
        )
        return protocol.answer(self._request("GET", "/api/runs", params=params), RunList)

    def schedules(self, page_size: int = 100) -> Iterator[ScheduleOut]:
        """Every schedule, oldest first, read a page of ``page_size`` at a time.

        Follows ``GET /api/schedules``' pages (``after=next_after``) as it is
        iterated: a page is asked for when the previous one is used up.
        """
        after: str | None = None
        while True:
            params: dict[str, Any] = {"limit": page_size}
            if after is not None:
                params["after"] = after
            page = protocol.answer(
                self._request("GET", "/api/schedules", params=params), ScheduleList
            )
            yield from page.schedules
            after = page.next_after
            if after is None:
                return

    def schedule(self, schedule_id: str) -> ScheduleOut:
        """One schedule.

        Raises:
            NotFound: No such schedule.
        """
        return protocol.answer(
            self._request("GET", protocol.schedule_path(schedule_id)), ScheduleOut
        )

    def add_schedule(
        self,
        plan: Mapping[str, Any] | None,
        cron: str,
        *,
        timezone: str = "UTC",
        catchup: str = "skip",
        inputs: Mapping[str, Any] | None = None,
        workflow: str | None = None,
    ) -> ScheduleOut:
        """Add a cron schedule of ``plan`` (a mapping); its first tick is the first after now.

        ``workflow``: the name of a ``@workflow`` the server imported, run at
        each tick instead of a plan (``plan`` is None then).

        Raises:
            InvalidRequest: A bad cron expression, time zone, catch-up or plan
                (``errors`` name the field).
            ApiError: 429, the server holds its most schedules already.
        """
        body = protocol.schedule_body(plan, cron, timezone, catchup, inputs, workflow)
        return protocol.answer(self._request("POST", "/api/schedules", json=body), ScheduleOut)

    def pause_schedule(self, schedule_id: str) -> ScheduleOut:
        """Stop firing a schedule's ticks (those due meanwhile follow its catch-up policy)."""
        path = protocol.schedule_path(schedule_id, "pause")
        return protocol.answer(self._request("POST", path), ScheduleOut)

    def resume_schedule(self, schedule_id: str) -> ScheduleOut:
        """Fire a paused schedule's ticks again."""
        path = protocol.schedule_path(schedule_id, "resume")
        return protocol.answer(self._request("POST", path), ScheduleOut)

    def delete_schedule(self, schedule_id: str) -> None:
        """Delete a schedule (the runs it started stay).

        Raises:
            NotFound: No such schedule.
        """
        response = self._request("DELETE", protocol.schedule_path(schedule_id))
        if response.status_code >= 400:
            protocol.raise_for(response)

    # -- the agents' memory -------------------------------------------------------------

    def memory_namespaces(self) -> MemoryNamespaces:
        """The memory's namespaces that hold items (``.namespaces``: name, items, bytes)."""
        return protocol.answer(self._request("GET", "/api/memory"), MemoryNamespaces)

    def memory_items(
        self, namespace: str, *, after: str | None = None, limit: int = 50
    ) -> MemoryItems:
        """A page of ``namespace``'s items, by key; the next with ``after=page.next``.

        Raises:
            InvalidRequest: A bad namespace or limit (``errors`` name it).
        """
        params = protocol.memory_items_params(after, limit)
        path = protocol.memory_path(namespace)
        return protocol.answer(self._request("GET", path, params=params), MemoryItems)

    def memory_search(
        self, namespace: str, q: str, k: int = 10, *, mode: str = "hybrid"
    ) -> MemorySearch:
        """The ``k`` items of ``namespace`` that best match ``q``, best first, with their scores.

        ``mode``: ``hybrid`` (full-text and vectors), ``text`` or ``vector``.

        Raises:
            InvalidRequest: An empty or too long ``q``, ``k`` out of 1..100, a bad namespace.
        """
        params = protocol.memory_search_params(q, k, mode)
        path = protocol.memory_path(namespace, "search")
        return protocol.answer(self._request("GET", path, params=params), MemorySearch)

    def memory_get(self, namespace: str, key: str, *, depth: int = 1) -> MemoryItemDetail:
        """An item with its links, versions and neighbours (followed ``depth`` links away).

        Raises:
            NotFound: No such item.
        """
        path = protocol.memory_path(namespace, key)
        response = self._request("GET", path, params={"depth": depth})
        return protocol.answer(response, MemoryItemDetail)

    def memory_delete(
        self, namespace: str, key: str, *, idempotency_key: str | None = None
    ) -> MemoryDeleted:
        """Delete an item, exactly once: under ``idempotency_key`` (a new one if not given).

        The key makes the request safe to send again (the client does, when
        the connection broke): the server answers the first deletion's result.

        Raises:
            NotFound: No such item.
            Conflict: ``idempotency_key`` named another write already.
        """
        headers = {"Idempotency-Key": idempotency_key or f"sdk-{uuid.uuid4()}"}
        path = protocol.memory_path(namespace, key)
        return protocol.answer(self._request("DELETE", path, headers=headers), MemoryDeleted)

    def records(self, run_id: str, after: int = 0, limit: int = 200) -> RunEvents:
        """A page of the run's journal records, decoded (``after``: the previous ``next_after``)."""
        params = {"after": after, "limit": limit}
        return protocol.answer(
            self._request("GET", protocol.run_path(run_id, "events"), params=params), RunEvents
        )

    def export(self, run_id: str) -> bytes:
        """The run's export file (``tiffany export``'s, docs/replay.md), as bytes.

        Write it to a file and replay it against new code with ``tiffany
        replay FILE --verify`` or ``tiffany.testing.replay_file``. A run not
        finished yet is exported as far as its journal goes.

        Raises:
            NotFound: No such run.
            PayloadTooLarge: Too large for the server to send (export it on its host).
        """
        response = self._request("GET", protocol.run_path(run_id, "export"))
        if response.status_code >= 400:
            protocol.raise_for(response)
        return response.content

    def waits(self, run_id: str) -> RunWaits:
        """The signals a running run waits for now, each with its wait's payload schema.

        Asked of the engine that holds the run (a workflow's waits are told to
        it as its code reaches them: the store does not have their schemas).

        Raises:
            NotFound: No such run.
            Conflict: The run has finished.
        """
        response = self._request("GET", protocol.run_path(run_id, "waits"))
        return protocol.answer(response, RunWaits)

    def cancel(self, run_id: str) -> CancelAnswer:
        """Cancel a running run (it ends ``cancelled`` shortly).

        Raises:
            NotFound: No such run.
            Conflict: The run has already finished.
        """
        return protocol.answer(
            self._request("POST", protocol.run_path(run_id, "cancel")), CancelAnswer
        )

    def signal(
        self, run_id: str, name: str, payload: Any = None, signal_id: str | None = None
    ) -> SignalAnswer:
        """Send signal ``name`` with ``payload`` (any JSON) to a running run; once journaled.

        A ``signal.wait`` step of that name outputs the payload; a signal sent
        before the step waits is kept for it. Sending again with the same
        ``signal_id`` journals it once.

        Raises:
            NotFound: No such run.
            Conflict: The run has already finished.
        """
        headers = {"Idempotency-Key": signal_id} if signal_id else {}
        response = self._request(
            "POST", protocol.run_path(run_id, "signals", name), json=payload, headers=headers
        )
        return protocol.answer(response, SignalAnswer)

    def rerun(
        self,
        run_id: str,
        from_step: str | None = None,
        inputs: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> RunHandle:
        """Re-run a finished run from ``from_step`` (default: its failed steps) as a new run.

        Steps not downstream of the restart point reuse their recorded
        outputs; ``inputs`` replace the earlier run's (the others are kept).
        A workflow run is re-run from a call (``from_step="tool_2"``; default:
        the one it failed at): its journal is forked before that call, and
        the calls before it are replayed, not made again (its inputs cannot
        change).

        Raises:
            Conflict: The run has not finished.
            InvalidRequest: No such step, or no failed step to restart at.
        """
        body: dict[str, Any] = {}
        if from_step is not None:
            body["from_step"] = from_step
        if inputs is not None:
            body["inputs"] = dict(inputs)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        response = self._request(
            "POST", protocol.run_path(run_id, "rerun"), json=body, headers=headers
        )
        got = protocol.answer(response, SubmitAnswer)
        self._remember(got)
        return RunHandle(self, got)

    # -- Waiting and following ---------------------------------------------------

    def wait(self, run_id: str, timeout: float | None = None) -> RunDetail:
        """Wait until the run has finished; return it (``status``, ``outputs``, ``error``).

        A run that failed or was cancelled is returned too: look at ``status``.
        The run is read without its outputs while it runs (``get(...,
        outputs=False)``) and whole once it has finished: a large result
        crosses the network once.

        The server going away for a while (a restart) is waited out: the
        run is read again until it answers, for up to
        :data:`~tiffany.sdk.protocol.RECONNECT_FOR_S` seconds at a time.

        Raises:
            WaitTimeout: ``timeout`` seconds passed first (``.run``: the run as
                last read, without its outputs).
            NotFound: No such run.
            ConnectionFailed: The server could not be reached for
                :data:`~tiffany.sdk.protocol.RECONNECT_FOR_S` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        min_seq = self._seqs.get(run_id)
        backoff = protocol.Backoff()
        last: RunDetail | None = None
        with contextlib.ExitStack() as stack:
            feed: ClientConnection | None = None
            followed = False
            outage = protocol.Outage()
            while True:
                try:
                    # Polled without outputs; read whole once, when finished.
                    last = self.get(run_id, min_seq=min_seq, outputs=False)
                    outage.ended()
                    if last.finished:
                        return self.get(run_id, min_seq=last.last_seq)
                except Unavailable:  # the store is behind the seq: read again
                    outage.ended()
                except ConnectionFailed as exc:  # restarting: read again, for a while
                    outage.failed(exc)
                if not followed:  # unfinished: follow its feed (its tail holds an end since)
                    feed, followed = self._open_feed(stack, run_id, since=None), True
                interval = backoff.step()
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise WaitTimeout(
                            f"run {run_id} did not finish within {timeout:g}s",
                            run=last,
                            run_id=run_id,
                        )
                    interval = min(interval, left)
                if feed is None:
                    time.sleep(interval)
                    continue
                try:
                    seen = _finished_seq(feed, run_id, interval)
                except (*_FEED_ERRORS, protocol.Cutoff):
                    feed = None  # the feed is gone: read at intervals from here
                    continue
                if seen is not None:
                    min_seq = max(min_seq or 0, seen)

    def events(
        self,
        run_id: str | None = None,
        since: int | None = None,
        *,
        until_finished: bool = True,
    ) -> Iterator[Event | FeedGap]:
        """Iterate over the activity feed (of one run, or of every run), resuming across drops.

        Without ``since`` the iteration starts with the events the server
        still holds (of this run), then follows live; with ``since`` (an
        event's ``seq``), it starts right after that event. A dropped
        connection is resumed after the last event received. A
        :class:`~tiffany.sdk.models.FeedGap` says events were lost (the
        server no longer held them).

        With ``run_id`` and ``until_finished``, the iteration ends after the
        run's ``run.finished`` event (a run that had already finished ends
        once the events the server holds of it have come).

        Raises:
            ConnectionFailed: The feed could not be reached for
                :data:`~tiffany.sdk.protocol.RECONNECT_FOR_S` seconds (at once
                when the server cannot be reached before the first connection).
            Unauthorized: The server refused the token (any 4xx answer to
                the feed's handshake is raised at once, as over HTTP).
            InvalidRequest: ``since`` is beyond the feed's last seq (code
                ``feed.since_beyond``): a seq this server never sent.
        """
        last = since
        finished_at_start = followed = False
        failing_since: float | None = None
        backoff = protocol.Backoff()
        while True:
            with contextlib.ExitStack() as stack:
                feed = self._open_feed(stack, run_id, since=last, strict=True)
                if feed is None:
                    if failing_since is None and not followed:
                        # Never reached: a server that is down or a wrong URL fails now
                        # (ConnectionFailed), as every other call does; one that answers
                        # HTTP but not yet its feed (restarting) is waited for.
                        self._request("GET", "/healthz")
                    now = time.monotonic()
                    failing_since = failing_since or now
                    if now - failing_since > protocol.RECONNECT_FOR_S:
                        msg = f"cannot follow the feed at {self.url}"
                        raise ConnectionFailed(msg, url=self.url)
                    time.sleep(backoff.step())
                    continue
                failing_since, backoff, followed = None, protocol.Backoff(), True
                try:
                    if run_id is not None and until_finished and last is None:
                        finished_at_start = self.get(run_id).finished
                    while True:
                        quiet = protocol.FINISHED_DRAIN_S if finished_at_start else None
                        try:
                            message = feed.recv(timeout=quiet)
                        except TimeoutError:
                            return  # a finished run: what the server held has come
                        item = protocol.read_frame(message)
                        if item is None:
                            continue
                        if isinstance(item, FeedGap):
                            yield item
                            if run_id is not None and until_finished and self.get(run_id).finished:
                                return
                            continue
                        last = item.seq
                        yield item
                        if _ends(item, run_id, until_finished):
                            return
                except (*_FEED_ERRORS, protocol.Cutoff):
                    continue  # dropped or cut off: resume after the last event

    def _open_feed(
        self,
        stack: contextlib.ExitStack,
        run_id: str | None,
        since: int | None,
        *,
        strict: bool = False,
    ) -> ClientConnection | None:
        """A websocket on the feed (closed with ``stack``), or None if it cannot be had.

        Raises:
            ApiError: ``strict`` and the server refused it for good (a 4xx:
                a missing or wrong token...; see ``protocol.refusal``).
        """
        tail = protocol.FEED_TAIL if since is None else 0
        url = protocol.feed_url(self.url, run_id, since, tail=tail if run_id else 0)
        try:
            opened = connect(
                url,
                additional_headers=self._headers,
                open_timeout=FEED_OPEN_TIMEOUT_S,
                close_timeout=protocol.FEED_CLOSE_TIMEOUT_S,
                compression=None,
                max_size=None,
            )
        except _FEED_ERRORS as exc:
            refused = protocol.refusal(exc, url) if strict else None
            if refused is not None:
                raise refused from None
            return None
        conn: ClientConnection = stack.enter_context(opened)
        stack.callback(_drain_feed, conn)  # before the close (the stack unwinds LIFO)
        return conn


def _drain_feed(feed: ClientConnection) -> None:
    """Take what a feed still has unread, so its close completes at once (``FEED_SETTLE_S``)."""
    deadline = time.monotonic() + protocol.FEED_DRAIN_MAX_S
    with contextlib.suppress(*_FEED_ERRORS):
        while time.monotonic() < deadline:
            feed.recv(timeout=protocol.FEED_SETTLE_S)


def _ends(event: Event, run_id: str | None, until_finished: bool) -> bool:
    return until_finished and event.kind == "run.finished" and event.run_id == run_id


def _finished_seq(feed: ClientConnection, run_id: str, within: float) -> int | None:
    """Read ``feed`` for up to ``within`` seconds; the WAL seq of ``run_id``'s end, or None."""
    deadline = time.monotonic() + within
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            message = feed.recv(timeout=left)
        except TimeoutError:
            return None
        item = protocol.read_frame(message)  # a cutoff raises: the caller polls from then on
        if isinstance(item, FeedGap):
            return 0  # events lost: read the run now
        if isinstance(item, Event) and _ends(item, run_id, True):
            return item.wal_seq
