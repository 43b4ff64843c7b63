"""Agent memory: items in namespaces, links between them, full-text and vector search.

Writes are applied exactly once (keyed by an ``op``), reads answer what a
run journals; docs/memory.md is the model, its bounds and its storage. The
names are imported on first use, so that importing :mod:`tiffany.memory.tables`
(the migrations do) does not load numpy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tiffany.errors import MemoryFull, MemoryInvalid, MemoryNotFound, MemoryRefused
    from tiffany.memory.embed import (
        Embedder,
        HashingEmbedder,
        OpenAIEmbedder,
        decode_vector,
        embedder_from_settings,
        encode_vector,
    )
    from tiffany.memory.store import MemoryStore

__all__ = [
    "Embedder",
    "HashingEmbedder",
    "MemoryFull",
    "MemoryInvalid",
    "MemoryNotFound",
    "MemoryRefused",
    "MemoryStore",
    "OpenAIEmbedder",
    "decode_vector",
    "embedder_from_settings",
    "encode_vector",
]

_WHERE = {
    "Embedder": "tiffany.memory.embed",
    "HashingEmbedder": "tiffany.memory.embed",
    "OpenAIEmbedder": "tiffany.memory.embed",
    "decode_vector": "tiffany.memory.embed",
    "embedder_from_settings": "tiffany.memory.embed",
    "encode_vector": "tiffany.memory.embed",
    "MemoryStore": "tiffany.memory.store",
    "MemoryFull": "tiffany.errors",
    "MemoryInvalid": "tiffany.errors",
    "MemoryNotFound": "tiffany.errors",
    "MemoryRefused": "tiffany.errors",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tiffany.memory' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
