"""The Process Activity Log: versioned activity events and their hub."""

from tiffany.pal.events import EVENT_KINDS, SCHEMA_VERSION, Event, encode_event
from tiffany.pal.hub import Hub, Subscription

__all__ = [
    "EVENT_KINDS",
    "SCHEMA_VERSION",
    "Event",
    "Hub",
    "Subscription",
    "encode_event",
]
