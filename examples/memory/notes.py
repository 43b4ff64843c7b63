"""Memory from a workflow: learn a user's preference in one run, recall it in the next.

From this directory::

    tiffany run notes:notes --input user=alice --input likes="buckwheat crepes"
    tiffany run notes:notes --input user=alice          # recalls it
    tiffany replay RUN_ID --verify --import notes       # replays what it read

Each ``memory.*`` call is a journaled tool call: the first run's put is
applied once (a crash and a resume find it applied), and the second run's
get and search replay with the answers they had.
"""

from __future__ import annotations

from typing import Any

from tiffany.workflows import memory, workflow


@workflow("memory-notes")
def notes(user: str = "alice", likes: str = "") -> Any:
    """Remember what ``user`` likes (when given), then recall it."""
    ns = f"users.{user}"
    if likes:
        yield memory.put(ns, "likes", likes, text=f"{user} likes {likes}")
    item = yield memory.get(ns, "likes")
    found = yield memory.search(ns, f"what does {user} like", k=3)
    return {
        "likes": item["item"]["value"] if item["found"] else None,
        "found": [i["key"] for i in found["items"]],
        "as_of": item["as_of"],
    }
