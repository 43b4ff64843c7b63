"""The engines the API reaches: their commands, through one port.

``tiffany serve --engines N`` runs N engine processes (docs/engines.md).
The commands (submit, cancel, signal, rerun, verify, status...) go through
the :class:`~tiffany.ports.commands.Commands` port, chosen once from the
settings: over the engines' control sockets (the file WAL), or as rows of
the database any engine, on any host, claims (``TIFFANY_JOURNAL=postgres``);
the port decides which engine gets each command. Where the store is (the
reads' ``min_seq``) is the watermark port's (:mod:`tiffany.ports.watermark`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from tiffany.wire.shards import engine_of

if TYPE_CHECKING:  # the postgres extra: imported where a PostgreSQL store is used
    from tiffany.ports.commands import Commands

__all__ = ["Engines", "merge_metrics"]


class Engines:
    """The commands of the engines the API serves.

    Args:
        commands: The commands port (:func:`tiffany.ports.commands.commands_for`).
    """

    def __init__(self, commands: Commands) -> None:
        self.commands = commands
        self.controls = commands.controls

    def start(self) -> None:
        """Start listening to the database's answers, if commands go through it."""
        self.commands.start()

    def __len__(self) -> int:
        return len(self.controls)

    def engine_of(self, seq: int) -> int:
        """The engine whose journal wrote ``seq`` (engine 0 for one out of range)."""
        engine = engine_of(seq)
        if self.commands.remote:
            return engine  # engines on other hosts: any number
        return engine if engine < len(self.controls) else 0

    async def close(self) -> None:
        """Close the commands' connections."""
        await self.commands.close()


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
