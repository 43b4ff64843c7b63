"""A projector batch on PostgreSQL as one statement: its rows, the mark and the notification.

The projector merges a batch's changes per row (``rows.Batch``): new
rows per table, and updates per table and set of columns. On SQLite those
are a few ``executemany`` calls on a local file. On PostgreSQL each
statement is a round trip to a server process that shares the machine, and
``executemany`` costs the driver's Python per row: a batch of 22 records
took twelve round trips (``BEGIN``, the mark's lock, eight statements, the
mark, ``COMMIT``) and the driver's Python for every row.

Here the whole batch is one statement in autocommit, so it is atomic on its
own and one round trip:

* each part's rows travel as one JSON document (msgspec encodes it in C)
  that ``json_to_recordset`` turns back into rows, with the table's column
  types; a JSON column's value is the text the other path binds
  (``session.json_text``), cast to ``json``, so both paths store the same text;
* every part is a data-modifying CTE that writes only if the first one,
  which moves the mark from the value the projector read to the batch's
  last seq (a compare-and-set on the mark's row), returned a row. A second
  projector that moved the mark first (it waits for the row lock, then
  finds another value) makes the statement write nothing and return no row:
  :class:`MarkMoved`, retried after the mark is read again;
* the statement's result is the ``pg_notify`` of the new mark (API replicas
  learn it at the commit: ``tiffany/ports/commands_pg.py``).

PostgreSQL runs a statement's CTEs on one snapshot, and checks foreign keys
at its end: a task and its run inserted by the same batch are one
statement's rows. No row is changed twice in one statement: a row inserted
in the batch takes its updates before the flush, and a row's updates are in
one part (its table's set of changed columns).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgspec
from sqlalchemy import JSON, Table

from tiffany.errors import TiffanyError
from tiffany.store.models import ProjectorState
from tiffany.store.session import json_text

__all__ = ["MarkMoved", "Part", "json_columns", "statement"]

#: One part of a batch: ``(table, key columns or None for an INSERT, columns, rows)``.
#: An INSERT's rows hold every column; an UPDATE's (``columns``: all of the
#: table's) hold their key and the columns they change, and only those change.
Part = tuple[Table, tuple[str, ...] | None, tuple[str, ...], Iterable[dict[str, Any]]]

_encoder: Final = msgspec.json.Encoder()


def _encode(value: Any) -> str:
    return _encoder.encode(value).decode()


class MarkMoved(TiffanyError):
    """The store's mark was not where this projector read it: another one wrote first.

    Transient: the batch is retried after the mark is read again (its
    records then at or below the mark are skipped).
    """

    code = "store.mark_moved"


def statement(
    dialect: Any, parts: Sequence[Part], mark: tuple[int, int, int], notify: tuple[str, str] | None
) -> tuple[str, list[Any]]:
    """Return the SQL and parameters of one batch: ``parts``, then the mark and notification.

    ``mark`` is ``(new last_seq, state id, expected last_seq)``; ``notify``
    the ``pg_notify`` channel and payload (None: the statement returns the
    new mark instead). The statement returns one row if it wrote, none if
    the mark had moved.
    """
    shape = tuple((table, keys, columns) for table, keys, columns, _ in parts)
    sql = _sql(dialect, shape, notify is not None)
    params: list[Any] = list(mark)
    for table, keys, columns, rows in parts:
        listed = list(rows)
        text = _document(table, columns, listed) if keys is None else _changes(table, listed)
        params += (text, len(listed))
    if notify is not None:
        params.extend(notify)
    return sql, params


def _document(table: Table, columns: tuple[str, ...], rows: Iterable[dict[str, Any]]) -> str:
    """The rows' ``columns`` as a JSON array of objects (JSON columns as their text)."""
    json = json_columns(table)
    if not json.intersection(columns):
        return _encode([{c: row[c] for c in columns} for row in rows])
    return _encode(
        [{c: json_text(row[c]) if c in json else row[c] for c in columns} for row in rows]
    )


def _changes(table: Table, rows: Iterable[dict[str, Any]]) -> str:
    """Changed rows as a JSON array: each its key, its changed columns and their mask ``_m``.

    The mask's bit ``i`` says the row sets the ``i``-th of :func:`_changeable`;
    the UPDATE keeps every other column as it is. So a table's changes are
    one part whatever columns each row changes, and the statement's text
    depends only on which tables a batch touches (a few dozen texts, which
    the driver prepares once, instead of 287 planned afresh each time).
    """
    json, bits = json_columns(table), _bits(table)
    out = []
    for row in rows:
        mask = 0
        doc: dict[str, Any] = {}
        for name, value in row.items():
            mask |= bits.get(name, 0)
            doc[name] = json_text(value) if name in json else value
        doc["_m"] = mask
        out.append(doc)
    return _encode(out)


@functools.cache
def _changeable(table: Table) -> tuple[str, ...]:
    """The columns an UPDATE may change: all but the primary key's."""
    keys = {c.name for c in table.primary_key.columns}
    return tuple(c.name for c in table.columns if c.name not in keys)


@functools.cache
def _bits(table: Table) -> dict[str, int]:
    return {name: 1 << i for i, name in enumerate(_changeable(table))}


@functools.cache
def json_columns(table: Table) -> frozenset[str]:
    """The names of ``table``'s JSON columns (bound as their text, ``session.json_text``)."""
    return frozenset(c.name for c in table.columns if isinstance(c.type, JSON))


@functools.cache
def _sql(
    dialect: Any,
    shape: tuple[tuple[Table, tuple[str, ...] | None, tuple[str, ...]], ...],
    notify: bool,
) -> str:
    quote = dialect.identifier_preparer.quote
    state, last, key = quote(ProjectorState.__tablename__), quote("last_seq"), quote("id")
    ctes = [
        f"moved AS (UPDATE {state} SET {last} = %s WHERE {key} = %s AND {last} = %s"
        f" RETURNING {last})"
    ]
    for i, (table, keys, columns) in enumerate(shape):
        json = json_columns(table)
        names = {c: quote(c) for c in columns}
        typed = ", ".join(
            f"{names[c]} {'text' if c in json else table.c[c].type.compile(dialect=dialect)}"
            for c in columns
        )
        if keys is not None:
            typed += ", _m bigint"
        # The LIMIT (the rows' count: it drops none) is the planner's estimate:
        # it takes a set-returning function for 100 rows, and then hashes the
        # whole table to update five rows by their key.
        source = f"(SELECT * FROM json_to_recordset(%s::json) AS r({typed}) LIMIT %s) AS r"

        def value(c: str, json: frozenset[str] = json, names: dict[str, str] = names) -> str:
            return f"r.{names[c]}::json" if c in json else f"r.{names[c]}"

        if keys is None:
            listed = ", ".join(names[c] for c in columns)
            picked = ", ".join(value(c) for c in columns)
            body = (
                f"INSERT INTO {quote(table.name)} ({listed}) SELECT {picked} FROM {source}"
                " WHERE EXISTS (SELECT FROM moved)"
            )
        else:
            bits = _bits(table)
            sets = ", ".join(
                f"{names[c]} = CASE WHEN r._m & {bits[c]} <> 0"
                f" THEN {value(c)} ELSE t.{names[c]} END"
                for c in _changeable(table)
            )
            where = " AND ".join(f"t.{names[k]} = r.{names[k]}" for k in keys)
            body = (
                f"UPDATE {quote(table.name)} AS t SET {sets} FROM {source}"
                f" WHERE {where} AND EXISTS (SELECT FROM moved)"
            )
        ctes.append(f"p{i} AS ({body})")
    result = "pg_notify(%s, %s)" if notify else last
    return f"WITH {', '.join(ctes)} SELECT {result} FROM moved"
