"""A durable fan-out written as plain Python: one child task per word, joined in order.

Run it (from this directory)::

    tiffany run fanout:fanout --input 'words=["durable", "code"]'

Each child scores its word in a ``Step`` (a plain function, run in the
thread pool; its result journaled), sleeps on a durable timer, and the
parent writes a report with the ``file.write`` tool. Kill the run with
``kill -9`` at any point and ``tiffany replay RUN --import fanout`` goes on
from the journal: a score already journaled is not computed again.
"""

from __future__ import annotations

from tiffany import workflow
from tiffany.kernel import NewTask, Sleep, Step, WaitTask
from tiffany.workflows import tool


def score(word: str) -> int:
    """The work of one child (blocking code is fine: it never stalls the engine)."""
    return sum(ord(c) for c in word) % 97


def child(word: str, pause_s: float):
    points = yield Step(score, word)
    yield Sleep(pause_s)  # a durable timer: it counts across a restart
    return {"word": word, "score": points}


@workflow("code-fanout")
def fanout(words: list[str], pause_s: float = 0.1):
    tids = []
    for word in words:  # every child runs concurrently; their interleaving is journaled
        tids.append((yield NewTask(child(word, pause_s), name=f"score:{word}")))
    scores = []
    for tid in tids:
        scores.append((yield WaitTask(tid)))
    best = max(scores, key=lambda s: s["score"])["word"] if scores else None
    lines = "".join(f"{s['word']}: {s['score']}\n" for s in scores)
    yield tool("file.write", path="report.txt", content=lines)
    return {"scores": scores, "best": best}
