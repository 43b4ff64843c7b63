"""LISTEN/NOTIFY channels are the database's: each schema's Tiffany gets names of its own."""

from __future__ import annotations

import pytest

from tiffany.config import conninfo
from tiffany.store.models import FEED_CHANNEL, channel, url_schema

BASE = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@pytest.mark.parametrize(
    ("url", "schema"),
    [
        (BASE, None),
        (BASE + "?options=-csearch_path%3Dstaging", "staging"),
        (BASE + "?options=-c%20search_path%3D%22Prod%22%2Cpublic", "Prod"),
        (BASE + "?options=-csearch_path%3D%24user%2Cteam_a", "team_a"),
        (BASE + "?options=-cstatement_timeout%3D5000", None),
        (BASE + "?connect_timeout=3&options=-cstatement_timeout%3D5%20-csearch_path%3Db", "b"),
    ],
)
def test_the_schema_a_url_names(url: str, schema: str | None) -> None:
    assert url_schema(url) == schema
    assert url_schema(conninfo(url)) == schema  # the libpq form the listeners use


def test_each_schema_has_its_own_channel_and_the_default_keeps_the_bare_name() -> None:
    assert channel(FEED_CHANNEL, BASE) == "tiffany_feed"
    assert channel(FEED_CHANNEL, BASE + "?options=-csearch_path%3Dpublic") == "tiffany_feed"
    staging = channel(FEED_CHANNEL, BASE + "?options=-csearch_path%3Dstaging")
    assert staging == "tiffany_feed__staging"
    # Names that would meet once folded into an identifier stay apart (a digest).
    upper = channel(FEED_CHANNEL, BASE + "?options=-csearch_path%3D%22Staging%22")
    dash = channel(FEED_CHANNEL, BASE + "?options=-csearch_path%3D%22sta-ging%22")
    assert len({staging, upper, dash}) == 3
    long = channel(FEED_CHANNEL, BASE + "?options=-csearch_path%3D" + "s" * 60)
    assert len(long.encode()) <= 63
    assert long.replace("_", "").isalnum()
