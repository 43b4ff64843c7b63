"""The engines the API reaches: one control channel and one watermark each.

``tiffany serve --engines N`` runs N engine processes (docs/engines.md);
the API talks to each over its control socket in the engine's home
(``tiffany/wire/shards.py``). What goes where:

- **submit**: with an ``Idempotency-Key``, to the engine the key hashes to
  (``shards.engine_for_key``: CRC-32 modulo N, as the CLI does), so that
  a repeated key meets the engine that remembers it; without one, round
  robin over the engines, passing over one that does not answer
  (restarting, stopping).
- **a run's commands** (cancel, verify): to the engine whose seqs hold the
  run's RUN_START (the store's ``start_seq``); a run the store does not
  show yet is asked of every engine, each answering only for runs it holds.
- **a re-run** (a submission that reads its source run from the store):
  an engine waits only for its own projection before it reads, so the
  store must first hold the source run's end, which its own engine wrote
  (the store's ``start_seq`` names it). Without a key, to that engine;
  with one, to the key's engine (it remembers the key: a re-run sent again
  is the same run, a key used for another submission a conflict), once the
  source's engine's projection holds what it has written. A run the store
  does not show yet: every engine's projection first, then as above.
- **min_seq**: the seq names its engine; the read waits for that engine's
  projection.

With one engine every call goes to it, as before.

On the PostgreSQL journal (``TIFFANY_JOURNAL=postgres``) submissions and a
run's commands go through the database instead (``db_requests.py``): any
engine, on any host, takes them, and this process needs no engine socket
for them.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from tiffany.api.deps import Watermark
from tiffany.store.models import PROJECTED_CHANNEL
from tiffany.wire.control import AsyncControlClient, ControlError, ControlUnavailable
from tiffany.wire.shards import engine_for_key, engine_home, engine_of

if TYPE_CHECKING:  # the postgres extra: imported where a PostgreSQL store is used
    from tiffany.api.db_requests import DbRequests
    from tiffany.api.pg_async import Listener

__all__ = ["RERUN_SOURCE_WAIT_S", "Engines", "merge_metrics"]

#: How long a re-run waits for the store to hold its source run's engine's writes, in seconds.
RERUN_SOURCE_WAIT_S: Final = 5.0


class Engines:
    """The control channels and watermarks of the engines under a data dir.

    Args:
        homes: Each engine's home (its control socket), engine 0 first.
        read_mark: Reads an engine's watermark from the store (when it is away).
        db: Requests through the database (journal=postgres), or None: the sockets.
        marks_dsn: A PostgreSQL store's connection string (with the sockets): the
            projectors' notifications of their marks wake the reads waiting for
            them, besides the engines' answers (``pg_async.py``).
    """

    def __init__(
        self,
        homes: list[Path],
        read_mark: Callable[[int], Awaitable[int]],
        db: DbRequests | None = None,
        marks_dsn: str | None = None,
    ) -> None:
        self.db = db
        self.controls = [AsyncControlClient(home) for home in homes]
        self._homes = homes
        self._read_mark = read_mark
        self.watermarks = [
            Watermark(control, _bind(read_mark, i)) for i, control in enumerate(self.controls)
        ]
        self._turn = itertools.count()
        if db is not None:
            for mark in self.watermarks:
                mark.pushed = True
            db.on_projected = lambda engine, seq: self.watermark(engine).push(seq)
        self._marks: Listener | None = None
        if db is None and marks_dsn is not None:
            from tiffany.api.pg_async import Listener

            channels = {PROJECTED_CHANNEL: self._projected}
            self._marks = Listener(marks_dsn, channels, "tiffany-api-store-marks")

    def start(self) -> None:
        """Start listening to the database (answers, the store's marks), if it is used."""
        if self.db is not None:
            self.db.start()
        if self._marks is not None:
            self._marks.start()

    def _projected(self, payload: str) -> None:
        """A projector notified its new mark: wake the reads it covers."""
        from tiffany.api.pg_async import projected_mark

        mark = projected_mark(payload)
        if mark is not None and mark[0] < len(self.watermarks):
            self.watermarks[mark[0]].push(mark[1])

    def __len__(self) -> int:
        return len(self.controls)

    async def submit(self, key: str | None, **fields: Any) -> dict[str, Any]:
        """Submit to one engine (see the module docstring); return its answer."""
        if self.db is not None:
            plan, inputs = fields.pop("plan", None), fields.pop("inputs", None)
            return await self.db.submit(plan, inputs, key, extra=fields or None)
        n = len(self.controls)
        if n == 1:
            return await self.controls[0].request("submit", key=key, **fields)
        if key is not None:
            engine = engine_for_key(key, n)
            return await self.controls[engine].request("submit", key=key, **fields)
        first = next(self._turn)
        refused: Exception | None = None
        for i in range(n):
            control = self.controls[(first + i) % n]
            try:
                return await control.request("submit", key=None, **fields)
            except ControlUnavailable as exc:
                refused = exc
            except ControlError as exc:
                if exc.status != 503:  # a bad plan is bad on every engine
                    raise
                refused = exc
        assert refused is not None
        raise refused

    async def rerun(
        self, key: str | None, owner: Callable[[], Awaitable[int | None]], **fields: Any
    ) -> dict[str, Any]:
        """Submit a re-run (``rerun_of``) where the store holds its source run (module docstring).

        ``owner`` reads the store: the engine whose journal started the
        source run, or None if the store does not show it.

        Raises:
            ControlError: 503 when an engine's projection did not catch up in
                :data:`RERUN_SOURCE_WAIT_S`; the engine's refusals (404, 409, 422).
        """
        n = len(self.controls)
        if self.db is not None or n == 1:
            return await self.submit(key, plan=None, **fields)
        engine = await owner()
        if engine is None:  # started and ended within a projection's gathering, or unknown
            await self._caught_up(range(n))
            engine = await owner()
        if engine is None or engine >= n:
            return await self.submit(
                key, plan=None, **fields
            )  # the engines' 404 (or a retired one's run)
        if key is None:
            try:  # it waits for its own projection, which holds the source run's end
                return await self.controls[engine].request("submit", key=None, plan=None, **fields)
            except ControlUnavailable:
                pass  # restarting: another engine reads what the store holds
            except ControlError as exc:
                if exc.status != 503:
                    raise
            return await self.submit(None, plan=None, **fields)
        if engine != engine_for_key(key, n):
            await self._caught_up([engine])
        return await self.submit(key, plan=None, **fields)

    async def _caught_up(self, engines: Iterable[int]) -> None:
        """Wait until the store holds what each of ``engines`` has written (an engine away: not)."""

        async def one(engine: int) -> None:
            try:
                now = await self.controls[engine].request(
                    "wait_projected", written=True, wait_s=RERUN_SOURCE_WAIT_S
                )
            except ControlUnavailable:
                return  # nothing is written meanwhile; what the store holds is the answer
            if not now.get("reached"):
                written, reached = now.get("written_seq"), now.get("last_seq")
                raise ControlError(
                    503,
                    f"the store is at seq {reached} of engine {engine} and did not reach seq "
                    f"{written} within {RERUN_SOURCE_WAIT_S:g} s; retry",
                    {"min_seq": written, "store_seq": reached},
                )

        await asyncio.gather(*(one(engine) for engine in engines))

    async def check_plan(self, plan: Any, inputs: Any) -> None:
        """Have an engine of this host check a plan (422 if invalid); no engine here: no check.

        Without an engine socket (API replicas on the PostgreSQL journal) a
        schedule's plan is checked at its first tick instead.
        """
        for control in self.controls:
            try:
                await control.request("check_plan", plan=plan, inputs=inputs)
                return
            except ControlUnavailable:
                continue

    async def for_run(
        self, owner: int | None, op: str, run_id: str, **fields: Any
    ) -> dict[str, Any]:
        """Send a run's command to its engine (``owner``; None: ask each, live runs only).

        Raises:
            ControlError: 404 when no engine holds the run.
        """
        if self.db is not None:
            if owner is None:
                owner = await self.db.owner(run_id)
            if owner is None:
                raise ControlError(404, f"no run {run_id!r}")
            timeout = fields.pop("timeout", None)
            if timeout is None:
                return await self.db.request(op, owner, run_id, **fields)
            return await self.db.request(op, owner, run_id, timeout=float(timeout), **fields)
        if len(self.controls) == 1 or owner is not None:
            engine = owner if owner is not None and owner < len(self.controls) else 0
            return await self.controls[engine].request(op, run_id=run_id, **fields)
        answers = await asyncio.gather(
            *(c.request(op, run_id=run_id, live=True, **fields) for c in self.controls),
            return_exceptions=True,
        )
        missing: BaseException | None = None
        for answer in answers:
            if isinstance(answer, dict):
                return answer
            if isinstance(answer, ControlError) and answer.status == 404:
                missing = answer
                continue
            raise answer
        assert missing is not None
        raise missing

    async def wait(self, seq: int, timeout: float) -> int:
        """Wait for the store to hold ``seq`` of its engine (:meth:`Watermark.wait`)."""
        return await self.watermark(self.engine_of(seq)).wait(seq, timeout)

    def watermark(self, engine: int) -> Watermark:
        """Engine ``engine``'s watermark (through the database: made for any engine that speaks)."""
        while self.db is not None and len(self.watermarks) <= engine:
            i = len(self.watermarks)
            home = engine_home(self._homes[0], i)
            mark = Watermark(AsyncControlClient(home), _bind(self._read_mark, i))
            mark.pushed = True
            self.watermarks.append(mark)
        return self.watermarks[engine]

    def engine_of(self, seq: int) -> int:
        """The engine whose journal wrote ``seq`` (engine 0 for one out of range)."""
        engine = engine_of(seq)
        if self.db is not None:
            return engine  # engines on other hosts: any number
        return engine if engine < len(self.controls) else 0

    async def each(self, op: str, timeout: float) -> list[dict[str, Any] | BaseException]:
        """Ask every engine ``op``; an answer or the exception, engine by engine."""
        return list(
            await asyncio.gather(
                *(c.request(op, timeout=timeout) for c in self.controls),
                return_exceptions=True,
            )
        )

    async def close(self) -> None:
        """Close every control channel (and the database's requests)."""
        for control in self.controls:
            await control.close()
        if self.db is not None:
            await self.db.close()
        if self._marks is not None:
            await self._marks.close()


def _bind(read_mark: Callable[[int], Awaitable[int]], engine: int) -> Callable[[], Awaitable[int]]:
    return lambda: read_mark(engine)


def merge_metrics(texts: list[str | None]) -> str:
    """Merge the engines' Prometheus expositions, each sample labelled ``engine``.

    One engine's text is returned as it is; with several, every family
    appears once, its samples carrying ``engine="<i>"`` (None: unreachable).
    """
    if len(texts) == 1:
        return texts[0] or ""
    families: dict[str, Metric] = {}
    for engine, text in enumerate(texts):
        if not text:
            continue
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            for sample in family.samples:
                labels = {**sample.labels, "engine": str(engine)}
                merged.add_sample(sample.name, labels, sample.value, sample.timestamp)
    return "".join(_exposition(families.values()))


def _exposition(families: Any) -> Iterator[str]:
    from prometheus_client import CollectorRegistry, generate_latest

    class _Collector:
        def collect(self) -> Any:
            return list(families)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    yield generate_latest(registry).decode()
