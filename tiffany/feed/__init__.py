"""The Process Activity Log: versioned activity events and their hub."""

from tiffany.feed.events import EVENT_KINDS, SCHEMA_VERSION, SEQS_PER_RECORD, Event, encode_event
from tiffany.feed.hub import FEED_SEQ_FILE, Hub, Subscription, WalPosition

__all__ = [
    "EVENT_KINDS",
    "FEED_SEQ_FILE",
    "SCHEMA_VERSION",
    "SEQS_PER_RECORD",
    "Event",
    "Hub",
    "Subscription",
    "WalPosition",
    "encode_event",
]
