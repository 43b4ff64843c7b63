"""The full-text index of items: FTS5 on SQLite, ``tsvector`` on PostgreSQL; one behaviour.

Both are written in the transaction that writes the item (:class:`FullText`'s
``insert``/``update``/``delete``), and answer :meth:`FullText.ranks`: the
best ``n`` items of a namespace for a query's words, scored by ``bm25()``
(SQLite) or ``ts_rank_cd`` (PostgreSQL), higher better.

* SQLite: ``mem_fts(nsid, text)``, an FTS5 table whose rowid is the item's
  id; ``nsid`` is one token naming the namespace (``ns`` and 16 hex digits
  of its blake2b), so a query matches ``nsid`` AND its words and scores
  only the namespace's items (``bm25`` weighs ``nsid`` 0).
* PostgreSQL: ``mem_fts(item_id, namespace, tsv)`` with a GIN index on
  ``tsv`` (the ``simple`` configuration: no stemming, as FTS5's
  ``unicode61``).

Which words score (the cost of a ranked query is one score per matching
item, so a query with a word found in most of a large namespace's items
pays for all of them: bench/README.md, "Figures behind design choices in
the code"): each word's matches are counted up to
:data:`COMMON_MATCHES` (cheap: no score; in the whole index on SQLite, in
the namespace on PostgreSQL); the rarer words
are OR-ed, rarest first, while their matches together stay under
:data:`SCORED_MATCHES`, and all of their matches are scored. Words found in
more items than that act as stop words while rarer ones exist; a query of
common words only answers the newest items holding any of them, newest
first, unscored (score 0): scoring common words costs what it saves (bm25's
IDF walks each word's whole doclist). A rare word, a needle, is always
searched; a query's cost is bounded either way.
"""

from __future__ import annotations

import hashlib
from typing import Final

from sqlalchemy import Connection, bindparam, text

from tiffany.memory.search import fts_query_pg, fts_query_sqlite

__all__ = [
    "COMMON_MATCHES",
    "RANKED_FIRST_PER_RESULT",
    "SCORED_MATCHES",
    "FullText",
    "PostgresFullText",
    "SqliteFullText",
    "fulltext_for",
    "namespace_token",
]

#: A word with more matches than this in a namespace is common (a stop word, nearly).
COMMON_MATCHES: Final = 500
#: How much further a common-word walk goes each time expired items left it short.
NEWEST_GROWTH: Final = 4
#: Matches a ranked query scores at most (when its words are rare).
SCORED_MATCHES: Final = 1000
#: A rare-word query on SQLite looks up its best ``n`` times this many matches
#: first (its ``n`` results), and every match only when those do not settle it.
RANKED_FIRST_PER_RESULT: Final = 2


def namespace_token(namespace: str) -> str:
    """The one FTS5 token that names ``namespace`` in ``mem_fts.nsid``."""
    return "ns" + hashlib.blake2b(namespace.encode("utf-8"), digest_size=8).hexdigest()


class FullText:
    """The index's writes and its ranked query (one subclass per dialect)."""

    def insert(self, conn: Connection, item_id: int, ns: str, body: str) -> None:
        """Index a new item's text."""
        raise NotImplementedError

    def update(self, conn: Connection, item_id: int, ns: str, body: str) -> None:
        """Index an item's new text in place of its old."""
        raise NotImplementedError

    def delete(self, conn: Connection, ids: list[int]) -> None:
        """Take items out of the index."""
        raise NotImplementedError

    def matches(self, conn: Connection, ns: str, words: list[str], cap: int) -> list[int]:
        """How many of the namespace's items hold each word, counted up to ``cap``.

        One statement: a capped count per word, ``UNION ALL``-ed.
        """
        parts = []
        params: dict[str, object] = {"cap": cap, "ns": ns}
        for i, word in enumerate(words):
            parts.append(f"SELECT {i} AS i, count(*) AS n FROM ({self._one_word(i)}) AS m{i}")
            params[f"q{i}"] = self._word_query(ns, word)
        rows = conn.execute(text(" UNION ALL ".join(parts)), params).all()
        counts: dict[int, int] = {int(i): int(n) for i, n in rows}
        return [int(counts.get(i, 0)) for i in range(len(words))]

    def _one_word(self, i: int) -> str:
        """A capped select of the matches of the word bound as ``:q{i}``."""
        raise NotImplementedError

    def _word_query(self, ns: str, word: str) -> str:
        """What ``:q{i}`` binds for ``word``."""
        raise NotImplementedError

    def ranked(
        self, conn: Connection, ns: str, words: list[str], rare: bool, n: int, at: float
    ) -> list[tuple[str, float]]:
        """The ``n`` best live items holding any of ``words``: ``(key, score)``.

        ``rare``: the words' matches are few, and all are scored; else the
        newest items that hold one, newest first, unscored (score 0).
        """
        raise NotImplementedError

    def ranks(
        self, conn: Connection, ns: str, words: list[str], n: int, at: float
    ) -> list[tuple[str, float]]:
        """The ``n`` best items of ``ns`` for ``words``, best first (see the module's rule)."""
        if not words:
            return []
        counted = list(zip(self.matches(conn, ns, words, COMMON_MATCHES + 1), words, strict=True))
        rare = sorted((c, w) for c, w in counted if 0 < c <= COMMON_MATCHES)
        chosen: list[str] = []
        total = 0
        for count, word in rare:
            if chosen and total + count > SCORED_MATCHES:
                break
            chosen.append(word)
            total += count
        if chosen:
            return self.ranked(conn, ns, chosen, True, n, at)
        common = [w for c, w in counted if c > COMMON_MATCHES]
        if common:
            return self.ranked(conn, ns, common, False, n, at)
        return []


class SqliteFullText(FullText):
    """FTS5: ``mem_fts(nsid, text)``, rowid = the item's id."""

    def insert(self, conn: Connection, item_id: int, ns: str, body: str) -> None:
        """Index a new item's text."""
        conn.execute(
            text("INSERT INTO mem_fts (rowid, nsid, text) VALUES (:id, :nsid, :text)"),
            {"id": item_id, "nsid": namespace_token(ns), "text": body},
        )

    def update(self, conn: Connection, item_id: int, ns: str, body: str) -> None:
        """Index an item's new text in place of its old."""
        conn.execute(text("DELETE FROM mem_fts WHERE rowid = :id"), {"id": item_id})
        self.insert(conn, item_id, ns, body)

    def delete(self, conn: Connection, ids: list[int]) -> None:
        """Take items out of the index."""
        statement = text("DELETE FROM mem_fts WHERE rowid IN :ids").bindparams(
            bindparam("ids", expanding=True)
        )
        for start in range(0, len(ids), 500):
            conn.execute(statement, {"ids": ids[start : start + 500]})

    @staticmethod
    def _match(ns: str | None, words: list[str]) -> str:
        joined = f"text : ({fts_query_sqlite(words)})"
        return joined if ns is None else f'nsid : "{namespace_token(ns)}" AND {joined}'

    def _one_word(self, i: int) -> str:
        return f"SELECT rowid FROM mem_fts WHERE mem_fts MATCH :q{i} LIMIT :cap"

    def _word_query(self, ns: str, word: str) -> str:
        # Counted over the whole index: with the nsid token in the query the
        # count walks the namespace's doclist (a millisecond at 100,000).
        return self._match(None, [word])

    def ranked(
        self, conn: Connection, ns: str, words: list[str], rare: bool, n: int, at: float
    ) -> list[tuple[str, float]]:
        """The ``n`` best live items holding any of ``words`` (``rare``: all scored)."""
        # bm25() counts, once per query, the rows that hold each phrase (its
        # IDF): a common word's rows are many, and the nsid phrase's are the
        # whole namespace (bench/README.md, "Figures behind design choices
        # in the code"). Rare words' matches are few:
        # they are scored without nsid, and the join keeps the namespace's.
        # Common words only: the namespace's newest items holding one,
        # unscored (FTS5 walks its doclists from the newest rowid and stops).
        if not rare:
            return self._newest(conn, ns, words, n, at)
        bounded = self._ranked_bounded(conn, ns, words, n, at)
        if bounded is not None:
            return bounded
        inner = "SELECT rowid, bm25(mem_fts, 0.0, 1.0) AS r FROM mem_fts WHERE mem_fts MATCH :q"
        match, order = self._match(None, words), "f.r, i.key"
        rows = conn.execute(
            text(
                f"SELECT i.key, f.r FROM ({inner}) AS f"
                " JOIN mem_items i ON i.id = f.rowid"
                " WHERE i.namespace = :ns AND (i.expires_at IS NULL OR i.expires_at > :now)"
                f" ORDER BY {order} LIMIT :n"
            ),
            {"q": match, "ns": ns, "now": at, "n": n},
        ).all()
        # bm25() is lower-better and negative: its negation is the score.
        return [(key, 0.0 - float(rank)) for key, rank in rows]

    def _newest(
        self, conn: Connection, ns: str, words: list[str], n: int, at: float
    ) -> list[tuple[str, float]]:
        """Common words only: the namespace's ``n`` newest live items holding one, score 0.

        FTS5 walks the words' doclists from the newest rowid and stops at
        ``:cap`` matches; expired items among them (not swept yet: a sweep
        runs on writes) would leave fewer than ``n``, so a short answer from
        a walk that hit its cap walks again, ``NEWEST_GROWTH`` times further
        (PostgreSQL filters before its limit: both dialects answer alike).
        """
        cap = n
        while True:
            rows = conn.execute(
                _NEWEST, {"q": self._match(ns, words), "ns": ns, "now": at, "n": n, "cap": cap}
            ).all()
            if len(rows) >= n:
                break
            walked = int(rows[0].seen) if rows else self._walked(conn, ns, words, cap)
            if walked < cap:  # every match was walked: the answer is short
                break
            cap *= NEWEST_GROWTH
        return [(key, 0.0) for key, _ in rows]

    def _walked(self, conn: Connection, ns: str, words: list[str], cap: int) -> int:
        """How many of ``ns``'s matches of ``words`` a walk capped at ``cap`` sees."""
        seen = conn.execute(
            text(
                "SELECT count(*) FROM (SELECT rowid FROM mem_fts WHERE mem_fts MATCH :q LIMIT :cap)"
            ),
            {"q": self._match(ns, words), "cap": cap},
        ).scalar()
        return int(seen or 0)

    def _ranked_bounded(
        self, conn: Connection, ns: str, words: list[str], n: int, at: float
    ) -> list[tuple[str, float]] | None:
        """The rare words' ``n`` best live items of ``ns``, from their best matches only.

        Only the best ``RANKED_FIRST_PER_RESULT * n`` matches by bm25 are
        looked up in ``mem_items`` (the namespace and expiry filter). None
        when they do not settle the answer (fewer than ``n`` of them are the
        namespace's live items, or the ``n``-th ties with the worst of
        them): the caller then ranks every match, and the answer is the same
        either way.
        """
        rows = conn.execute(
            _RANKED_BOUNDED,
            {
                "q": self._match(None, words),
                "ns": ns,
                "now": at,
                "n": n,
                "m": n * RANKED_FIRST_PER_RESULT,
            },
        ).all()
        if not rows:
            return None  # (no match at all is rare: the words were counted)
        seen, worst = int(rows[0].seen), float(rows[0].worst)
        if seen == n * RANKED_FIRST_PER_RESULT and (len(rows) < n or rows[-1].r >= worst):
            return None
        return [(key, 0.0 - float(rank)) for key, rank, _, _ in rows]


#: Common words only: the namespace's newest ``:cap`` matches, then its live
#: ones among them, newest first, at most ``:n``; each row also says how many
#: matches were walked (``seen``).
_NEWEST: Final = text(
    "WITH f AS MATERIALIZED ("
    "SELECT rowid FROM mem_fts WHERE mem_fts MATCH :q ORDER BY rowid DESC LIMIT :cap)"
    " SELECT i.key, (SELECT count(*) FROM f) AS seen"
    " FROM f JOIN mem_items i ON i.id = f.rowid"
    " WHERE i.namespace = :ns AND (i.expires_at IS NULL OR i.expires_at > :now)"
    " ORDER BY i.id DESC LIMIT :n"
)

#: A rare-word query's best ``:m`` matches by bm25, then the namespace's live
#: ones among them (``:ns``, ``:now``), best first, ties by key, at most ``:n``;
#: each row also says how many matches were looked at and the worst bm25 of them.
_RANKED_BOUNDED: Final = text(
    "WITH f AS MATERIALIZED ("
    "SELECT rowid, bm25(mem_fts, 0.0, 1.0) AS r FROM mem_fts"
    " WHERE mem_fts MATCH :q ORDER BY r LIMIT :m)"
    " SELECT i.key, f.r, (SELECT count(*) FROM f) AS seen, (SELECT max(r) FROM f) AS worst"
    " FROM f JOIN mem_items i ON i.id = f.rowid"
    " WHERE i.namespace = :ns AND (i.expires_at IS NULL OR i.expires_at > :now)"
    " ORDER BY f.r, i.key LIMIT :n"
)


class PostgresFullText(FullText):
    """``mem_fts(item_id, namespace, tsv)``, GIN on ``tsv``.

    ``tsv`` holds the namespace's token (:func:`namespace_token`) beside the
    text's words, and every query matches it: the GIN index then finds the
    namespace's matches alone. (With the namespace as a column filter the
    planner walked the namespace's rows by its index and tested each
    ``tsvector``, a cost that grows with the namespace: bench/README.md,
    "Figures behind design choices in the code".) Ranks use the words only.
    """

    _TSV = "to_tsvector('simple', :text) || to_tsvector('simple', :nsid)"

    def insert(self, conn: Connection, item_id: int, ns: str, body: str) -> None:
        """Index a new item's text."""
        conn.execute(
            text(f"INSERT INTO mem_fts (item_id, namespace, tsv) VALUES (:id, :ns, {self._TSV})"),
            {"id": item_id, "ns": ns, "text": body, "nsid": namespace_token(ns)},
        )

    def update(self, conn: Connection, item_id: int, ns: str, body: str) -> None:
        """Index an item's new text in place of its old."""
        conn.execute(
            text(f"UPDATE mem_fts SET tsv = {self._TSV} WHERE item_id = :id"),
            {"id": item_id, "text": body, "nsid": namespace_token(ns)},
        )

    def delete(self, conn: Connection, ids: list[int]) -> None:
        """Take items out of the index."""
        statement = text("DELETE FROM mem_fts WHERE item_id IN :ids").bindparams(
            bindparam("ids", expanding=True)
        )
        for start in range(0, len(ids), 500):
            conn.execute(statement, {"ids": ids[start : start + 500]})

    def matches(self, conn: Connection, ns: str, words: list[str], cap: int) -> list[int]:
        """How many of the namespace's items hold each word, counted up to ``cap``."""
        return super().matches(conn, namespace_token(ns), words, cap)

    def _one_word(self, i: int) -> str:
        return (
            "SELECT 1 FROM mem_fts WHERE tsv @@"
            f" (to_tsquery('simple', :ns) && to_tsquery('simple', :q{i})) LIMIT :cap"
        )

    def _word_query(self, ns: str, word: str) -> str:
        return fts_query_pg([word])

    def ranked(
        self, conn: Connection, ns: str, words: list[str], rare: bool, n: int, at: float
    ) -> list[tuple[str, float]]:
        """The ``n`` best live items holding any of ``words`` (``rare``: all scored)."""
        if rare:
            statement = (
                "SELECT i.key, ts_rank_cd(f.tsv, q) AS r"
                " FROM mem_fts f JOIN mem_items i ON i.id = f.item_id,"
                " to_tsquery('simple', :q) q"
                " WHERE f.tsv @@ (to_tsquery('simple', :nsid) && q)"
                " AND (i.expires_at IS NULL OR i.expires_at > :now)"
                " ORDER BY r DESC, i.key LIMIT :n"
            )
        else:
            # Common words only: the newest items holding one, unscored (as on SQLite).
            statement = (
                "SELECT i.key, 0.0 AS r FROM mem_fts f JOIN mem_items i ON i.id = f.item_id"
                " WHERE f.tsv @@ (to_tsquery('simple', :nsid) && to_tsquery('simple', :q))"
                " AND (i.expires_at IS NULL OR i.expires_at > :now)"
                " ORDER BY i.id DESC LIMIT :n"
            )
        params = {"q": fts_query_pg(words), "nsid": namespace_token(ns), "now": at, "n": n}
        rows = conn.execute(text(statement), params).all()
        return [(key, float(rank)) for key, rank in rows]


def fulltext_for(dialect: str) -> FullText:
    """The full-text index of a dialect (``sqlite`` or ``postgresql``)."""
    return SqliteFullText() if dialect == "sqlite" else PostgresFullText()
