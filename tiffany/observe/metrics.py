"""The engine's Prometheus metrics: one ``CollectorRegistry`` per engine process.

What is measured where:

* **Observed as it happens** (prometheus-client ``Counter``/``Histogram``,
  updated on the scheduler thread): WAL group commits, the records they made
  durable and each commit's fsync latency (one observation per group commit,
  not per record); the slow dispatches the watchdog reports (a histogram of
  their durations: its ``_count`` is the number of stalls).
* **Read at scrape time** (a collector of ours):
  counters other parts already keep for themselves (the activity log's
  dispatches, the hub's published events and subscribers, the projector's
  health), and runs active. Copying them into a second counter on every
  event would put a lock on the hot path for a value that exists already.

Exposition: the engine renders ``generate_latest(registry)`` when asked
(control op ``metrics``, answered on a control thread, never on the
scheduler thread) and the API's ``GET /metrics`` appends it to its own
registry's text. The two registries hold disjoint metric names, so the
concatenation is one valid exposition.

Rejected:

* prometheus-client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``): it
  is made for forked workers of one program sharing mmapped files; it
  cannot hold custom collectors nor callback gauges, needs the directory
  wiped at every start, and the engine and API are different programs
  that already share a control channel.
* An HTTP endpoint of the engine's own (``start_http_server``): one more
  listening port, and the API would have to proxy it anyway to keep one
  scrape target behind one token.
* A histogram of every dispatch's latency: ``Histogram.observe`` takes a
  lock and costs about a microsecond, as much as a dispatch itself. The
  watchdog already times each dispatch; the slow ones (over its threshold)
  are observed, and the longest one is a gauge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tiffany.kernel.watchdog import SlowDispatch

__all__ = [
    "FSYNC_BUCKETS_S",
    "SLOW_DISPATCH_BUCKETS_S",
    "EngineMetrics",
    "Sources",
    "project_health",
]

#: Upper bounds of the WAL fsync latency histogram, in seconds.
FSYNC_BUCKETS_S: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)
#: Upper bounds of the slow-dispatch histogram, in seconds (the threshold is 0.1 s by default).
SLOW_DISPATCH_BUCKETS_S: Final = (0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: Counters read at scrape time: (name without ``_total``, help, key in the sources' dict).
_PULLED_COUNTERS: Final = (
    ("tiffany_dispatches", "Task dispatches by the kernel loop.", "dispatches"),
    (
        "tiffany_loop_steps_handed_over",
        "Lone steps that blocked on the loop's thread past the bound: the loop went on elsewhere.",
        "steps_handed_over",
    ),
    ("tiffany_feed_published", "Activity events the engine's hub published.", "feed_published"),
    (
        "tiffany_feed_dropped_subscribers",
        "Engine feed subscribers cut off for falling behind.",
        "feed_dropped",
    ),
    ("tiffany_projector_errors", "Projector batches that failed.", "projector_errors"),
    ("tiffany_projector_restarts", "Times the projector process was started again.", "restarts"),
)
#: Gauges read at scrape time.
_PULLED_GAUGES: Final = (
    ("tiffany_runs_active", "Runs the engine is running.", "runs_active"),
    ("tiffany_feed_subscribers", "Subscribers of the engine's activity feed.", "subscribers"),
    ("tiffany_loop_max_dispatch_seconds", "The longest single dispatch seen.", "max_dispatch_s"),
    ("tiffany_projector_last_seq", "The last WAL seq projected into the store.", "last_seq"),
    ("tiffany_projector_lag_records", "Durable WAL records not projected yet.", "lag_records"),
    (
        "tiffany_projector_dead_letters",
        "Journal records quarantined because they could not be projected.",
        "dead_letters",
    ),
)

#: A callable returning the current values of the pulled metrics, by key.
Sources = Callable[[], dict[str, float]]


class _Pulled(Collector):
    """Counters and gauges whose values other objects keep (read at scrape time)."""

    def __init__(self, sources: Sources) -> None:
        self._sources = sources

    def collect(self) -> Iterator[Metric]:
        """Yield one family per pulled value the sources report."""
        values = self._sources()
        for name, doc, key in _PULLED_COUNTERS:
            if key in values:
                yield CounterMetricFamily(name, doc, value=values[key])
        for name, doc, key in _PULLED_GAUGES:
            if key in values:
                yield GaugeMetricFamily(name, doc, value=values[key])


class EngineMetrics:
    """The engine process's registry and the hooks that update it.

    Args:
        sources: Returns the pulled values (see ``_PULLED_COUNTERS`` and
            ``_PULLED_GAUGES``); called on a control thread at each scrape.
    """

    def __init__(self, sources: Sources) -> None:
        self.registry = CollectorRegistry()
        self.wal_commits = Counter(
            "tiffany_wal_commits", "WAL group commits.", registry=self.registry
        )
        self.wal_records = Counter(
            "tiffany_wal_records", "Records made durable in the WAL.", registry=self.registry
        )
        self.wal_fsync = Histogram(
            "tiffany_wal_fsync_seconds",
            "WAL fsync (fdatasync) latency per group commit.",
            buckets=FSYNC_BUCKETS_S,
            registry=self.registry,
        )
        self.slow_dispatch = Histogram(
            "tiffany_loop_slow_dispatch_seconds",
            "Dispatches slower than the watchdog threshold (loop stalls), by duration.",
            buckets=SLOW_DISPATCH_BUCKETS_S,
            registry=self.registry,
        )
        self.registry.register(_Pulled(sources))
        ProcessCollector(namespace="tiffany_engine", registry=self.registry)

    def committed(self, records: int, sync_s: float) -> None:
        """Count one group commit of ``records`` records whose fsync took ``sync_s``."""
        self.wal_commits.inc()
        self.wal_records.inc(records)
        self.wal_fsync.observe(sync_s)

    def slow(self, report: SlowDispatch) -> None:
        """Count one slow dispatch (the watchdog's ``on_report`` hook)."""
        self.slow_dispatch.observe(report.duration_s)

    def render(self) -> str:
        """Return the registry in the Prometheus text format."""
        return generate_latest(self.registry).decode()


def project_health(health: dict[str, Any]) -> dict[str, float]:
    """Return the pulled projector values from ``ProjectorLink.health()``'s dict."""
    out: dict[str, float] = {}
    for key, name in (
        ("last_seq", "last_seq"),
        ("lag_records", "lag_records"),
        ("dead_letters", "dead_letters"),
        ("errors", "projector_errors"),
        ("restarts", "restarts"),
    ):
        value = health.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = float(value)
    return out
