"""The engines the API reaches: their commands (one port) and one watermark each.

``tiffany serve --engines N`` runs N engine processes (docs/engines.md).
The commands (submit, cancel, signal, rerun, verify, status...) go through
the :class:`~tiffany.ports.commands.Commands` port, chosen once from the
settings: over the engines' control sockets (the file WAL), or as rows of
the database any engine, on any host, claims (``TIFFANY_JOURNAL=postgres``);
the port decides which engine gets each command.

- **min_seq**: the seq names its engine; the read waits for that engine's
  projection (its :class:`~tiffany.api.deps.Watermark`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from tiffany.api.deps import Watermark
from tiffany.store.models import PROJECTED_CHANNEL
from tiffany.wire.control import AsyncControlClient
from tiffany.wire.shards import engine_home, engine_of

if TYPE_CHECKING:  # the postgres extra: imported where a PostgreSQL store is used
    from tiffany.api.pg_async import Listener
    from tiffany.ports.commands import Commands
    from tiffany.ports.commands_pg import PgLinks

__all__ = ["Engines", "merge_metrics", "pg_links"]


class Engines:
    """The commands and the watermarks of the engines the API serves.

    Args:
        commands: The commands port (:func:`tiffany.ports.commands.commands_for`).
        read_mark: Reads an engine's watermark from the store (when it is away).
        marks_dsn: A PostgreSQL store's connection string (with the sockets): the
            projectors' notifications of their marks wake the reads waiting for
            them, besides the engines' answers (``pg_async.py``).
    """

    def __init__(
        self,
        commands: Commands,
        read_mark: Callable[[int], Awaitable[int]],
        marks_dsn: str | None = None,
    ) -> None:
        self.commands = commands
        self.controls = commands.controls
        self._homes = [control.path.parent for control in self.controls]
        self._read_mark = read_mark
        self.watermarks = [
            Watermark(control, _bind(read_mark, i)) for i, control in enumerate(self.controls)
        ]
        if commands.remote:  # the database notifies every move of the marks
            for mark in self.watermarks:
                mark.pushed = True
            # The database's answers and the marks' notifications share one listener.
            commands.on_projected = self._pushed  # type: ignore[attr-defined]
        self._marks: Listener | None = None
        if not commands.remote and marks_dsn is not None:
            from tiffany.api.pg_async import Listener

            channels = {PROJECTED_CHANNEL: self._projected}
            self._marks = Listener(marks_dsn, channels, "tiffany-api-store-marks")

    def start(self) -> None:
        """Start listening to the database (answers, the store's marks), if it is used."""
        self.commands.start()
        if self._marks is not None:
            self._marks.start()

    def _pushed(self, engine: int, seq: int) -> None:
        """The database notified engine ``engine``'s new mark: wake the reads it covers."""
        self.watermark(engine).push(seq)

    def _projected(self, payload: str) -> None:
        """A projector notified its new mark: wake the reads it covers."""
        from tiffany.api.pg_async import projected_mark

        mark = projected_mark(payload)
        if mark is not None and mark[0] < len(self.watermarks):
            self.watermarks[mark[0]].push(mark[1])

    def __len__(self) -> int:
        return len(self.controls)

    async def wait(self, seq: int, timeout: float) -> int:
        """Wait for the store to hold ``seq`` of its engine (:meth:`Watermark.wait`)."""
        return await self.watermark(self.engine_of(seq)).wait(seq, timeout)

    def watermark(self, engine: int) -> Watermark:
        """Engine ``engine``'s watermark (through the database: made for any engine that speaks)."""
        while self.commands.remote and len(self.watermarks) <= engine:
            i = len(self.watermarks)
            home = engine_home(self._homes[0], i)
            mark = Watermark(AsyncControlClient(home), _bind(self._read_mark, i))
            mark.pushed = True
            self.watermarks.append(mark)
        return self.watermarks[engine]

    def engine_of(self, seq: int) -> int:
        """The engine whose journal wrote ``seq`` (engine 0 for one out of range)."""
        engine = engine_of(seq)
        if self.commands.remote:
            return engine  # engines on other hosts: any number
        return engine if engine < len(self.controls) else 0

    async def close(self) -> None:
        """Close the commands' connections and the store's marks' listener."""
        await self.commands.close()
        if self._marks is not None:
            await self._marks.close()


def pg_links() -> PgLinks:
    """The API's asyncio connections to PostgreSQL, for the commands port (postgres extra)."""
    from tiffany.api.pg_async import AsyncPool, Listener, projected_mark
    from tiffany.ports.commands_pg import PgLinks

    return PgLinks(AsyncPool, Listener, projected_mark)


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
