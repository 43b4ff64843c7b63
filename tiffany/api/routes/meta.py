"""``/api/meta``: the status vocabulary, as ``tiffany/wire/status.py`` defines it.

The dashboard reads it at start instead of keeping its own list of
statuses, which of them are final, and how a task's state is said. It holds
no data, so it needs no token (as the dashboard's files do): the page reads
it before it can ask the user for one.
"""

from __future__ import annotations

from typing import Any, Final

from fastapi import APIRouter

from tiffany.api.schemas import Vocabulary
from tiffany.wire.status import vocabulary

__all__ = ["META_PATH", "router"]

#: The route's path (public: ``tiffany/api/middleware.py``).
META_PATH: Final = "/api/meta"

router = APIRouter(tags=["system"])

#: The one answer, built once: the vocabulary is the code's, not the data's.
_VOCABULARY: Final = vocabulary()


@router.get(META_PATH, response_model=Vocabulary)
async def meta() -> Any:
    """The run, step and task status vocabulary (no token needed)."""
    return _VOCABULARY
