"""``GET /metrics``: Prometheus text from the store, the engine and this process.

A custom collector on a registry of the app's own (no global registry, so
two apps in one test process never share metrics). A scrape first gathers a
:class:`Snapshot` (the store's run counts, the engine's ``metrics`` answer,
the relay's counters), then renders it; the collector itself does no I/O.

When the engine does not answer, its metrics are left out and
``tiffany_engine_up`` is 0; the scrape still succeeds.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from tiffany.api.feed import FeedRelay

__all__ = ["ApiCollector", "Snapshot", "make_registry", "render"]


@dataclass
class Snapshot:
    """What one scrape reports.

    Attributes:
        run_counts: Runs by status from the store (None: store unreadable).
        engine: The engine's ``metrics`` answer (None: engine unreachable).
        relay: This API process's activity relay.
    """

    run_counts: dict[str, int] | None
    engine: dict[str, Any] | None
    relay: FeedRelay | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _get(data: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


class ApiCollector(Collector):
    """Render the current :class:`Snapshot` as metric families."""

    def __init__(self) -> None:
        self.snapshot = Snapshot(run_counts=None, engine=None)

    def collect(self) -> Iterator[Metric]:
        """Yield the metric families of the current snapshot."""
        snap = self.snapshot
        if snap.run_counts is not None:
            runs = GaugeMetricFamily(
                "tiffany_runs", "Runs in the store, by status.", labels=["status"]
            )
            for status, n in sorted(snap.run_counts.items()):
                runs.add_metric([status], n)
            yield runs
        up = GaugeMetricFamily("tiffany_engine_up", "1 when the engine answered this scrape.")
        up.add_metric([], 1 if snap.engine is not None else 0)
        yield up
        if snap.engine is not None:
            yield from self._engine(snap.engine)
        yield from self._feed(snap)

    def _engine(self, m: dict[str, Any]) -> Iterator[Metric]:
        simple: list[tuple[type, str, str, tuple[str, ...]]] = [
            (
                CounterMetricFamily,
                "tiffany_dispatches",
                "Task dispatches by the kernel loop.",
                ("dispatches",),
            ),
            (
                GaugeMetricFamily,
                "tiffany_runs_active",
                "Runs the engine is running.",
                ("runs_active",),
            ),
            (CounterMetricFamily, "tiffany_wal_commits", "WAL group commits.", ("wal", "commits")),
            (
                CounterMetricFamily,
                "tiffany_wal_records",
                "Records made durable in the WAL.",
                ("wal", "records"),
            ),
            (
                CounterMetricFamily,
                "tiffany_loop_slow_dispatches",
                "Dispatches slower than the watchdog threshold (loop stalls).",
                ("loop", "slow_dispatches"),
            ),
            (
                GaugeMetricFamily,
                "tiffany_loop_max_dispatch_seconds",
                "The longest single dispatch seen.",
                ("loop", "max_dispatch_s"),
            ),
            (
                GaugeMetricFamily,
                "tiffany_projector_last_seq",
                "The last WAL seq projected into the store.",
                ("projector", "last_seq"),
            ),
            (
                GaugeMetricFamily,
                "tiffany_projector_lag_records",
                "Durable WAL records not projected yet.",
                ("projector", "lag_records"),
            ),
            (
                CounterMetricFamily,
                "tiffany_projector_errors",
                "Projector batches that failed.",
                ("projector", "errors"),
            ),
            (
                GaugeMetricFamily,
                "tiffany_projector_dead_letters",
                "Journal records quarantined because they could not be projected.",
                ("projector", "dead_letters"),
            ),
            (
                CounterMetricFamily,
                "tiffany_feed_published",
                "Activity events the engine's hub published.",
                ("feed", "published"),
            ),
        ]
        for family, name, doc, path in simple:
            value = _num(_get(m, *path))
            if value is not None:
                metric = family(name, doc)
                metric.add_metric([], value)
                yield metric
        hist = _get(m, "wal", "fsync_seconds")
        if isinstance(hist, dict) and isinstance(hist.get("buckets"), list):
            buckets: list[tuple[str, float]] = []
            for bound, count in hist["buckets"]:
                le = (
                    "+Inf"
                    if bound in ("+Inf", "inf") or _num(bound) == math.inf
                    else repr(float(bound))
                )
                buckets.append((le, float(count)))
            if not buckets or buckets[-1][0] != "+Inf":
                buckets.append(("+Inf", float(hist.get("count", buckets[-1][1] if buckets else 0))))
            fsync = HistogramMetricFamily(
                "tiffany_wal_fsync_seconds",
                "WAL fsync (fdatasync) latency per group commit.",
                buckets=buckets,
                sum_value=float(hist.get("sum", 0.0)),
            )
            yield fsync

    def _feed(self, snap: Snapshot) -> Iterator[Metric]:
        subs = GaugeMetricFamily(
            "tiffany_feed_subscribers", "Activity feed subscribers.", labels=["process"]
        )
        drops = CounterMetricFamily(
            "tiffany_feed_dropped_subscribers",
            "Activity feed subscribers cut off for falling behind.",
            labels=["process"],
        )
        for process, value, dropped in self._feed_rows(snap):
            subs.add_metric([process], value)
            drops.add_metric([process], dropped)
        yield subs
        yield drops
        relay = snap.relay
        if relay is not None:
            relayed = CounterMetricFamily(
                "tiffany_api_feed_events", "Activity events the API received from the engine."
            )
            relayed.add_metric([], relay.received)
            yield relayed
            gone = CounterMetricFamily(
                "tiffany_api_feed_gaps", "Unknown gaps in the engine's feed (engine restarts)."
            )
            gone.add_metric([], relay.upstream_gone)
            yield gone
            catchups = CounterMetricFamily(
                "tiffany_api_feed_catchups",
                "Websocket resumes served from the engine's ring (older than the API's).",
            )
            catchups.add_metric([], relay.catchups)
            yield catchups
            cutoffs = CounterMetricFamily(
                "tiffany_api_feed_upstream_cutoffs",
                "Times the engine cut this API's feed off for falling behind.",
            )
            cutoffs.add_metric([], relay.upstream_cutoffs)
            yield cutoffs
            connected = GaugeMetricFamily(
                "tiffany_api_feed_connected",
                "1 when the engine's feed has delivered since the API last failed to reach it.",
            )
            connected.add_metric([], 1 if relay.connected else 0)
            yield connected

    @staticmethod
    def _feed_rows(snap: Snapshot) -> Iterator[tuple[str, float, float]]:
        if snap.engine is not None:
            value = _num(_get(snap.engine, "feed", "subscribers"))
            dropped = _num(_get(snap.engine, "feed", "dropped_subscribers"))
            if value is not None:
                yield "engine", value, dropped or 0.0
        if snap.relay is not None:
            yield "api", float(len(snap.relay.subscribers)), float(snap.relay.dropped_subscribers)


def make_registry() -> tuple[CollectorRegistry, ApiCollector]:
    """Return a fresh registry with the API collector and this process's metrics."""
    registry = CollectorRegistry(auto_describe=False)
    collector = ApiCollector()
    registry.register(collector)
    ProcessCollector(namespace="tiffany_api", registry=registry)
    return registry, collector


def render(registry: CollectorRegistry, collector: ApiCollector, snapshot: Snapshot) -> bytes:
    """Render ``snapshot`` as Prometheus text (synchronously: no scrape sees another's)."""
    collector.snapshot = snapshot
    return generate_latest(registry)
