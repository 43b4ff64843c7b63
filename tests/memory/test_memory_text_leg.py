"""The text ranking's bound: a rare-word query looks up its best 2n matches first, same answer.

tiffany/memory/fulltext.py (``SqliteFullText._ranked_bounded``) reads only the
best ``RANKED_FIRST_PER_RESULT * n`` matches' items when they settle the top
``n``, and every match when they do not (another namespace's or expired items
among the best, a tie at the edge). Each case here is checked against the
unbounded ranking, and checks which path answered.
"""

from __future__ import annotations

import random  # noqa: TID251 - a seeded shuffle of test data

import pytest

from tiffany.kernel.clock import ManualClock
from tiffany.memory import MemoryStore
from tiffany.memory.fulltext import RANKED_FIRST_PER_RESULT, SqliteFullText
from tiffany.memory.search import candidates

K = 10


@pytest.fixture
def paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Which path each rare-word ranking took: ``bounded`` or ``all``."""
    taken: list[str] = []
    bounded = SqliteFullText._ranked_bounded

    def spy(self: SqliteFullText, *args: object) -> object:
        got = bounded(self, *args)  # type: ignore[arg-type]
        taken.append("all" if got is None else "bounded")
        return got

    monkeypatch.setattr(SqliteFullText, "_ranked_bounded", spy)
    return taken


def _unbounded(store: MemoryStore, ns: str, query: str, mode: str) -> list[tuple[str, float]]:
    """The answer with every match ranked (the bound switched off)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SqliteFullText, "_ranked_bounded", lambda *a: None)
        found = store.search(ns, query, k=K, mode=mode)["items"]
    return [(i["key"], i["score"]) for i in found]


def _search(store: MemoryStore, ns: str, query: str, mode: str) -> list[tuple[str, float]]:
    return [(i["key"], i["score"]) for i in store.search(ns, query, k=K, mode=mode)["items"]]


def _put_all(store: MemoryStore, ns: str, texts: dict[str, str], **kw: object) -> None:
    keys = list(texts)
    random.Random(5).shuffle(keys)  # rowids in no key order
    for key in keys:
        store.put(ns, key, texts[key], op=f"{ns}/{key}", **kw)  # type: ignore[arg-type]


def test_the_bound_is_the_documented_multiple_of_the_candidates() -> None:
    assert RANKED_FIRST_PER_RESULT == 2
    assert candidates(K) * RANKED_FIRST_PER_RESULT == 60


def test_one_namespace_is_answered_from_its_best_matches(
    store: MemoryStore, paths: list[str]
) -> None:
    # 120 holders of the rare word, each with a different bm25 (its count, its length).
    texts = {
        f"k{i:03d}": " ".join(["qzr"] * (1 + i % 7) + ["filler"] * (3 + i % 11)) for i in range(120)
    }
    _put_all(store, "solo", texts)
    for mode in ("text", "hybrid"):
        paths.clear()
        got = _search(store, "solo", "qzr", mode)
        assert paths == ["bounded"], mode
        assert got == _unbounded(store, "solo", "qzr", mode), mode
        assert len(got) == K


def test_another_namespaces_better_matches_make_it_rank_every_match(
    store: MemoryStore, paths: list[str]
) -> None:
    # The rare word is scored over the whole index: "loud" holds its 55 best
    # matches, so the best 60 hold 5 of "quiet"'s items, fewer than the 30 wanted.
    _put_all(store, "loud", {f"l{i:03d}": "qzr qzr qzr qzr" for i in range(55)})
    _put_all(store, "quiet", {f"q{i:03d}": f"qzr {'word ' * (2 + i)}" for i in range(15)})
    got = _search(store, "quiet", "qzr", "text")
    assert paths == ["all"]
    assert got == _unbounded(store, "quiet", "qzr", "text")
    assert [k for k, _ in got] == [f"q{i:03d}" for i in range(K)]  # shortest text first


def test_expired_items_among_the_best_make_it_rank_every_match(
    store: MemoryStore, paths: list[str]
) -> None:
    clock = store._clock
    assert isinstance(clock, ManualClock)
    # 70 expired items hold the best 60 matches: none of them is live.
    _put_all(store, "ttl", {f"e{i:03d}": "qzr qzr qzr" for i in range(70)}, ttl_s=10.0)
    _put_all(store, "ttl", {f"s{i:03d}": f"qzr {'word ' * (2 + i)}" for i in range(15)})
    clock.advance(60.0)
    got = _search(store, "ttl", "qzr", "text")
    assert paths == ["all"]
    assert got == _unbounded(store, "ttl", "qzr", "text")
    assert [k for k, _ in got] == [f"s{i:03d}" for i in range(K)]


def test_a_tie_at_the_edge_makes_it_rank_every_match_and_the_key_decides(
    store: MemoryStore, paths: list[str]
) -> None:
    # 80 equal texts: equal bm25, more than the 60 looked at first; the keys decide.
    _put_all(store, "ties", {f"t{i:03d}": "qzr same words" for i in range(80)})
    got = _search(store, "ties", "qzr", "text")
    assert paths == ["all"]
    assert got == _unbounded(store, "ties", "qzr", "text")
    assert [k for k, _ in got] == [f"t{i:03d}" for i in range(K)]


def test_common_words_answer_the_newest_live_items_with_expired_ones_newer(
    store: MemoryStore,
) -> None:
    """A common-word query walks further when expired items hold its newest matches.

    The walk stops at ``n`` matches, newest first; expired items (not swept:
    the sweep runs on writes) among them used to leave the answer short on
    SQLite, where PostgreSQL filters before its limit.
    """
    from tiffany.memory.fulltext import COMMON_MATCHES

    clock = store._clock
    assert isinstance(clock, ManualClock)
    live = [f"a{i:03d}" for i in range(COMMON_MATCHES + 5)]
    for i, key in enumerate(live):  # in order: a later key is a newer item
        store.put("newest", key, f"common words {i}", op=f"newest/{key}")
    # The newest items expire, more than a search's candidates (so more than
    # its first walk, and more than one walk further would hold).
    for i in range(5 * candidates(K)):
        store.put("newest", f"z{i:03d}", "common words", op=f"newest/z{i}", ttl_s=10.0)
    clock.advance(60.0)
    got = [k for k, _ in _search(store, "newest", "common", "text")]
    assert got == live[::-1][:K]
