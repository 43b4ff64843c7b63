"""The asyncio client of the HTTP API: :class:`AsyncClient`, ``Client``'s methods, awaited.

See :mod:`tiffany.sdk.client` for what each method does and how ``wait``
and ``events`` follow the feed; what is not I/O is shared through
:mod:`tiffany.sdk.protocol`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final

import httpx
import tenacity
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from tiffany.sdk import protocol
from tiffany.sdk.client import FEED_OPEN_TIMEOUT_S, REMEMBERED_RUNS
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

__all__ = ["AsyncClient", "AsyncRunHandle"]

_FEED_ERRORS: Final = (OSError, ConnectionClosed, InvalidHandshake, InvalidURI, TimeoutError)


class AsyncRunHandle:
    """A run this client started (``run_id``, ``seq``); its methods are the client's, awaited."""

    __slots__ = ("_client", "created", "run_id", "seq")

    def __init__(self, client: AsyncClient, answer: SubmitAnswer) -> None:
        self._client = client
        self.run_id = answer.run_id
        self.seq = answer.seq
        self.created = answer.created

    def __repr__(self) -> str:
        return f"AsyncRunHandle(run_id={self.run_id!r}, seq={self.seq})"

    async def get(self) -> RunDetail:
        """The run as the store has it (at least as of its submission)."""
        return await self._client.get(self.run_id, min_seq=self.seq)

    async def wait(self, timeout: float | None = None) -> RunDetail:
        """Wait for the run to finish."""
        return await self._client.wait(self.run_id, timeout=timeout)

    async def cancel(self) -> CancelAnswer:
        """Cancel the run."""
        return await self._client.cancel(self.run_id)

    async def signal(
        self, name: str, payload: Any = None, signal_id: str | None = None
    ) -> SignalAnswer:
        """Send the run signal ``name``."""
        return await self._client.signal(self.run_id, name, payload, signal_id=signal_id)

    def events(self, since: int | None = None) -> AsyncIterator[Event | FeedGap]:
        """The run's activity events, until it finishes."""
        return self._client.events(self.run_id, since=since)


class AsyncClient:
    """An asyncio client of a Tiffany server's HTTP API (arguments as :class:`~tiffany.sdk.Client`).

    Use it as ``async with AsyncClient(url) as client: ...`` or call
    :meth:`aclose` when done.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = protocol.DEFAULT_TIMEOUT_S,
        http: httpx.AsyncClient | None = None,
        retries: int = protocol.DEFAULT_RETRIES,
    ) -> None:
        self.url = protocol.resolve_url(url)
        self._token = protocol.resolve_token(token)
        self._headers = protocol.auth_headers(self._token)
        self.retries = retries
        self._own_http = http is None
        self._http = http or httpx.AsyncClient(timeout=timeout)
        self._seqs: OrderedDict[str, int] = OrderedDict()

    def __repr__(self) -> str:
        return f"AsyncClient({redact_url_credentials(self.url)!r})"

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP connections (a client given ``http`` leaves it open)."""
        if self._own_http:
            await self._http.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {**self._headers, **kwargs.pop("headers", {})}
        retrying = tenacity.AsyncRetrying(**protocol.resending(method, headers, self.retries))
        try:
            return await retrying(
                self._http.request, method, self.url + path, headers=headers, **kwargs
            )
        except httpx.TransportError as exc:
            raise protocol.unreachable(self.url, exc) from exc

    def _remember(self, answer: SubmitAnswer) -> None:
        self._seqs[answer.run_id] = answer.seq
        self._seqs.move_to_end(answer.run_id)
        while len(self._seqs) > REMEMBERED_RUNS:
            self._seqs.popitem(last=False)

    async def readiness(self) -> dict[str, Any]:
        """The server's ``/readyz`` answer: ``{"ready": bool, ...}`` (ready or not)."""
        return protocol.readiness(await self._request("GET", "/readyz"))

    async def submit(
        self,
        plan: Any = None,
        inputs: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        *,
        workflow: str | None = None,
    ) -> AsyncRunHandle:
        """Submit a plan (a dict, JSON or YAML text, or a path), or ``workflow=NAME``; its run."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        body = protocol.submit_body(plan, inputs, workflow)
        response = await self._request("POST", "/api/runs", json=body, headers=headers)
        got = protocol.answer(response, SubmitAnswer)
        self._remember(got)
        return AsyncRunHandle(self, got)

    async def get(
        self, run_id: str, min_seq: int | None = None, *, outputs: bool = True
    ) -> RunDetail:
        """The run (as of ``min_seq``, default this client's submission; see ``Client.get``)."""
        if min_seq is None:
            min_seq = self._seqs.get(run_id)
        params = protocol.get_params(min_seq, outputs)
        response = await self._request("GET", protocol.run_path(run_id), params=params)
        return protocol.answer(response, RunDetail)

    async def list(
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
        """A page of runs, newest first."""
        params = protocol.list_params(
            limit, status=status, before=before, name=name, q=q, since=since, until=until
        )
        return protocol.answer(await self._request("GET", "/api/runs", params=params), RunList)

    async def schedules(self, page_size: int = 100) -> AsyncIterator[ScheduleOut]:
        """Every schedule, oldest first, read a page of ``page_size`` at a time."""
        after: str | None = None
        while True:
            params: dict[str, Any] = {"limit": page_size}
            if after is not None:
                params["after"] = after
            response = await self._request("GET", "/api/schedules", params=params)
            page = protocol.answer(response, ScheduleList)
            for schedule in page.schedules:
                yield schedule
            after = page.next_after
            if after is None:
                return

    async def schedule(self, schedule_id: str) -> ScheduleOut:
        """One schedule.

        Raises:
            NotFound: No such schedule.
        """
        return protocol.answer(
            await self._request("GET", protocol.schedule_path(schedule_id)), ScheduleOut
        )

    async def add_schedule(
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
        return protocol.answer(
            await self._request("POST", "/api/schedules", json=body), ScheduleOut
        )

    async def pause_schedule(self, schedule_id: str) -> ScheduleOut:
        """Stop firing a schedule's ticks (those due meanwhile follow its catch-up policy)."""
        path = protocol.schedule_path(schedule_id, "pause")
        return protocol.answer(await self._request("POST", path), ScheduleOut)

    async def resume_schedule(self, schedule_id: str) -> ScheduleOut:
        """Fire a paused schedule's ticks again."""
        path = protocol.schedule_path(schedule_id, "resume")
        return protocol.answer(await self._request("POST", path), ScheduleOut)

    async def delete_schedule(self, schedule_id: str) -> None:
        """Delete a schedule (the runs it started stay).

        Raises:
            NotFound: No such schedule.
        """
        response = await self._request("DELETE", protocol.schedule_path(schedule_id))
        if response.status_code >= 400:
            protocol.raise_for(response)

    # -- the agents' memory -------------------------------------------------------------

    async def memory_namespaces(self) -> MemoryNamespaces:
        """The memory's namespaces that hold items (``.namespaces``: name, items, bytes)."""
        return protocol.answer(await self._request("GET", "/api/memory"), MemoryNamespaces)

    async def memory_items(
        self, namespace: str, *, after: str | None = None, limit: int = 50
    ) -> MemoryItems:
        """A page of ``namespace``'s items, by key; the next with ``after=page.next``.

        Raises:
            InvalidRequest: A bad namespace or limit (``errors`` name it).
        """
        params = protocol.memory_items_params(after, limit)
        path = protocol.memory_path(namespace)
        return protocol.answer(await self._request("GET", path, params=params), MemoryItems)

    async def memory_search(
        self, namespace: str, q: str, k: int = 10, *, mode: str = "hybrid"
    ) -> MemorySearch:
        """The ``k`` items of ``namespace`` that best match ``q``, best first, with their scores.

        ``mode``: ``hybrid`` (full-text and vectors), ``text`` or ``vector``.

        Raises:
            InvalidRequest: An empty or too long ``q``, ``k`` out of 1..100, a bad namespace.
        """
        params = protocol.memory_search_params(q, k, mode)
        path = protocol.memory_path(namespace, "search")
        return protocol.answer(await self._request("GET", path, params=params), MemorySearch)

    async def memory_get(self, namespace: str, key: str, *, depth: int = 1) -> MemoryItemDetail:
        """An item with its links, versions and neighbours (followed ``depth`` links away).

        Raises:
            NotFound: No such item.
        """
        path = protocol.memory_path(namespace, key)
        response = await self._request("GET", path, params={"depth": depth})
        return protocol.answer(response, MemoryItemDetail)

    async def memory_delete(
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
        return protocol.answer(await self._request("DELETE", path, headers=headers), MemoryDeleted)

    async def records(self, run_id: str, after: int = 0, limit: int = 200) -> RunEvents:
        """A page of the run's journal records, decoded."""
        params = {"after": after, "limit": limit}
        response = await self._request("GET", protocol.run_path(run_id, "events"), params=params)
        return protocol.answer(response, RunEvents)

    async def export(self, run_id: str) -> bytes:
        """The run's export file (``tiffany export``'s, docs/replay.md), as bytes."""
        response = await self._request("GET", protocol.run_path(run_id, "export"))
        if response.status_code >= 400:
            protocol.raise_for(response)
        return response.content

    async def waits(self, run_id: str) -> RunWaits:
        """The signals a running run waits for now, with their schemas (:meth:`Client.waits`)."""
        response = await self._request("GET", protocol.run_path(run_id, "waits"))
        return protocol.answer(response, RunWaits)

    async def cancel(self, run_id: str) -> CancelAnswer:
        """Cancel a running run."""
        response = await self._request("POST", protocol.run_path(run_id, "cancel"))
        return protocol.answer(response, CancelAnswer)

    async def signal(
        self, run_id: str, name: str, payload: Any = None, signal_id: str | None = None
    ) -> SignalAnswer:
        """Send signal ``name`` with ``payload`` to a running run; once journaled."""
        headers = {"Idempotency-Key": signal_id} if signal_id else {}
        response = await self._request(
            "POST", protocol.run_path(run_id, "signals", name), json=payload, headers=headers
        )
        return protocol.answer(response, SignalAnswer)

    async def rerun(
        self,
        run_id: str,
        from_step: str | None = None,
        inputs: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> AsyncRunHandle:
        """Re-run a finished run from ``from_step`` (default: its failed steps) as a new run.

        A workflow run is re-run from a call (``tool_2``): see :meth:`Client.rerun`.
        """
        body: dict[str, Any] = {}
        if from_step is not None:
            body["from_step"] = from_step
        if inputs is not None:
            body["inputs"] = dict(inputs)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        response = await self._request(
            "POST", protocol.run_path(run_id, "rerun"), json=body, headers=headers
        )
        got = protocol.answer(response, SubmitAnswer)
        self._remember(got)
        return AsyncRunHandle(self, got)

    async def wait(self, run_id: str, timeout: float | None = None) -> RunDetail:
        """Wait until the run has finished; return it (see ``Client.wait``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        min_seq = self._seqs.get(run_id)
        feed: ClientConnection | None = None
        followed = False
        backoff = protocol.Backoff()
        outage = protocol.Outage()
        last: RunDetail | None = None
        try:
            while True:
                try:
                    # Polled without outputs; read whole once, when finished.
                    last = await self.get(run_id, min_seq=min_seq, outputs=False)
                    outage.ended()
                    if last.finished:
                        return await self.get(run_id, min_seq=last.last_seq)
                except Unavailable:
                    outage.ended()
                except ConnectionFailed as exc:  # restarting: read again, for a while
                    outage.failed(exc)
                if not followed:  # unfinished: follow its feed (its tail holds an end since)
                    feed, followed = await self._open_feed(run_id, since=None), True
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
                    await asyncio.sleep(interval)
                    continue
                try:
                    seen = await _finished_seq(feed, run_id, interval)
                except (*_FEED_ERRORS, protocol.Cutoff):
                    await _close_feed(feed)
                    feed = None
                    continue
                if seen is not None:
                    min_seq = max(min_seq or 0, seen)
        finally:
            if feed is not None:
                await _close_feed(feed)

    async def events(
        self,
        run_id: str | None = None,
        since: int | None = None,
        *,
        until_finished: bool = True,
    ) -> AsyncIterator[Event | FeedGap]:
        """Iterate over the activity feed, resuming across drops (see ``Client.events``)."""
        last = since
        finished_at_start = followed = False
        failing_since: float | None = None
        backoff = protocol.Backoff()
        while True:
            feed = await self._open_feed(run_id, since=last, strict=True)
            if feed is None:
                if failing_since is None and not followed:  # never reached: fail now if down
                    await self._request("GET", "/healthz")
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > protocol.RECONNECT_FOR_S:
                    raise ConnectionFailed(f"cannot follow the feed at {self.url}", url=self.url)
                await asyncio.sleep(backoff.step())
                continue
            failing_since, backoff, followed = None, protocol.Backoff(), True
            try:
                if run_id is not None and until_finished and last is None:
                    finished_at_start = (await self.get(run_id)).finished
                while True:
                    quiet = protocol.FINISHED_DRAIN_S if finished_at_start else None
                    try:
                        message = await asyncio.wait_for(feed.recv(), quiet)
                    except TimeoutError:
                        return
                    item = protocol.read_frame(message)
                    if item is None:
                        continue
                    if isinstance(item, FeedGap):
                        yield item
                        if (
                            run_id is not None
                            and until_finished
                            and (await self.get(run_id)).finished
                        ):
                            return
                        continue
                    last = item.seq
                    yield item
                    if until_finished and item.kind == "run.finished" and item.run_id == run_id:
                        return
            except protocol.Cutoff:
                continue
            except _FEED_ERRORS:
                continue
            finally:
                await _close_feed(feed)

    async def _open_feed(
        self, run_id: str | None, since: int | None, *, strict: bool = False
    ) -> ClientConnection | None:
        """A websocket on the feed, or None if it cannot be had.

        Raises:
            ApiError: ``strict`` and the server refused it for good (see
                ``protocol.refusal``).
        """
        tail = protocol.FEED_TAIL if since is None and run_id else 0
        url = protocol.feed_url(self.url, run_id, since, tail=tail)
        try:
            return await connect(
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


async def _close_feed(feed: ClientConnection) -> None:
    """Close a feed at once, whatever it still has unread (see ``protocol.FEED_SETTLE_S``)."""
    deadline = time.monotonic() + protocol.FEED_DRAIN_MAX_S
    try:
        while time.monotonic() < deadline:
            await asyncio.wait_for(feed.recv(), protocol.FEED_SETTLE_S)
    except _FEED_ERRORS:
        pass
    await feed.close()


async def _finished_seq(feed: ClientConnection, run_id: str, within: float) -> int | None:
    """Read ``feed`` for up to ``within`` seconds; the WAL seq of ``run_id``'s end, or None."""
    deadline = time.monotonic() + within
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            message = await asyncio.wait_for(feed.recv(), left)
        except TimeoutError:
            return None
        item = protocol.read_frame(message)
        if isinstance(item, FeedGap):
            return 0
        if isinstance(item, Event) and item.kind == "run.finished" and item.run_id == run_id:
            return item.wal_seq
