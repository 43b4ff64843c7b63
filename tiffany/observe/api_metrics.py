"""``GET /metrics``: this process's registry, followed by the engine's.

Two processes, two prometheus-client registries with disjoint metric names:
the engine renders its own (``tiffany.observe.metrics``, control op
``metrics``) and this module renders the API's and appends the engine's
text, so one scrape target serves both behind one token. No metric is
re-mapped by hand: the engine's text is passed through as it came.

The API's registry (no global registry, so two apps in one test process
never share metrics) holds the store's runs by status (read before each
scrape), ``tiffany_engine_up``, the activity relay's counters (read from the
relay at scrape time) and this process's CPU and memory
(``tiffany_api_process_*``). When the engine does not answer, its part is
left out and ``tiffany_engine_up`` is 0; the scrape still succeeds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tiffany.feed.relay import FeedRelay

__all__ = ["ApiMetrics"]

#: The relay's counters (name without ``_total``, help, attribute).
_RELAY_COUNTERS: Final = (
    ("tiffany_api_feed_events", "Activity events the API received from the engine.", "received"),
    (
        "tiffany_api_feed_gaps",
        "Unknown gaps in the engine's feed (engine restarts).",
        "upstream_gone",
    ),
    (
        "tiffany_api_feed_catchups",
        "Websocket resumes served from the engine's ring (older than the API's).",
        "catchups",
    ),
    (
        "tiffany_api_feed_upstream_cutoffs",
        "Times the engine cut this API's feed off for falling behind.",
        "upstream_cutoffs",
    ),
    (
        "tiffany_api_feed_dropped_subscribers",
        "Websocket subscribers cut off for falling behind.",
        "dropped_subscribers",
    ),
)


class _ApiCollector(Collector):
    """Runs by status (as last read from the store), engine reachability, the relay."""

    def __init__(self, relay: FeedRelay | None) -> None:
        self.relay = relay
        self.run_counts: dict[str, int] | None = None
        self.engine_up = False

    def collect(self) -> Iterator[Metric]:
        """Yield the API's metric families."""
        if self.run_counts is not None:
            runs = GaugeMetricFamily(
                "tiffany_runs", "Runs in the store, by status.", labels=["status"]
            )
            for status, n in sorted(self.run_counts.items()):
                runs.add_metric([status], n)
            yield runs
        yield GaugeMetricFamily(
            "tiffany_engine_up", "1 when the engine answered this scrape.", value=self.engine_up
        )
        relay = self.relay
        if relay is None:
            return
        for name, doc, attr in _RELAY_COUNTERS:
            yield CounterMetricFamily(name, doc, value=getattr(relay, attr))
        yield GaugeMetricFamily(
            "tiffany_api_feed_subscribers",
            "Websocket subscribers of this API process.",
            value=len(relay.subscribers),
        )
        yield GaugeMetricFamily(
            "tiffany_api_feed_connected",
            "1 when the engine's feed has delivered since the API last failed to reach it.",
            value=1 if relay.connected else 0,
        )


class ApiMetrics:
    """The API process's registry; :meth:`render` answers one scrape.

    Args:
        relay: The app's activity relay (its counters are exported).
    """

    def __init__(self, relay: FeedRelay | None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._collector = _ApiCollector(relay)
        self.registry.register(self._collector)
        ProcessCollector(namespace="tiffany_api", registry=self.registry)

    def render(self, run_counts: dict[str, int] | None, engine_text: str | None) -> bytes:
        """Return the scrape's body: this registry, then the engine's text.

        Synchronous (no ``await`` between setting the values and rendering
        them), so concurrent scrapes never see each other's values.

        Args:
            run_counts: Runs by status from the store (None: store unreadable).
            engine_text: The engine's exposition (None: engine unreachable).
        """
        self._collector.run_counts = run_counts
        self._collector.engine_up = engine_text is not None
        own = generate_latest(self.registry)
        return own + engine_text.encode() if engine_text else own
