"""``FeedSource``: where the API's activity relay gets the engines' events.

The relay (:class:`tiffany.feed.relay.FeedRelay`) keeps one ring and fans it
out to websockets; what fills the ring is a source, chosen once from the
settings by :func:`feed_source`:

- :class:`tiffany.feed.upstream.SocketFeed`: each engine's feed socket in
  its home (``serve --engines N``: one connection an engine), with resumes
  and catch-ups served by the engine;
- :class:`tiffany.feed.pg.PgFeed` (``TIFFANY_JOURNAL=postgres``): one
  ``LISTEN tiffany_feed`` carries every engine's batches, from any host;
  there is no engine socket to replay from, so the relay merges and keys
  the events itself.

Discussion: the relay's side of the contract is stated in the feed room
(:class:`tiffany.feed.upstream.Source`, beside the ``Sink`` a source writes
to), because the relay sits below the ports and cannot name this module;
:class:`FeedSource` is that contract as the API knows it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from tiffany.config import Settings, conninfo
from tiffany.feed.relay import feed_path
from tiffany.feed.upstream import SocketFeed, Source
from tiffany.wire.shards import homes

__all__ = ["FeedSource", "feed_source"]


@runtime_checkable
class FeedSource(Source, Protocol):
    """Where the relay's events come from (module docstring; members on :class:`Source`)."""


def feed_source(settings: Settings) -> FeedSource:
    """The engines' feeds as ``settings`` place them: the database's, or their sockets."""
    if settings.journal == "postgres":
        from tiffany.feed.pg import PgFeed  # the postgres extra: imported only here

        return PgFeed(conninfo(settings.database_url))
    return SocketFeed([feed_path(home) for home in homes(settings.data_dir, settings.engines)])
