"""A projector batch's row changes, and how they are written.

The projector (``projector.py``) decides what the records change; a
:class:`Batch` holds those changes merged per row (each table's new rows,
and its changed rows' new column values by key) and writes them:

* SQLite: each table's new rows as one ``executemany`` INSERT, its changed
  rows as one ``executemany`` UPDATE per set of changed columns, on the
  driver's cursor (:func:`driver`), inside the projector's transaction.
* PostgreSQL: the whole batch, the mark's move and its notification as one
  statement (:mod:`tiffany.projector.pgflush`).

Statements are the driver's SQL, made once per table and column set;
parameters are the driver's values (JSON columns as their text,
``session.json_text``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, Final

from sqlalchemy import Connection, Table, and_, bindparam, insert
from sqlalchemy import update as sql_update
from sqlalchemy.sql.dml import Insert, Update

from tiffany.projector import pgflush
from tiffany.store.models import JournalRecord, ProjectorState, Run, Step, Task
from tiffany.store.session import driver_errors, json_text

__all__ = ["Batch", "Rows", "driver", "mark_sql", "shape"]


class Rows:
    """One table's changes in a batch: new rows, and column updates by primary key.

    A table with a ``last_seq`` column gets the seq of the record being
    applied (:attr:`seq`) in every row it inserts or changes: each row names
    the point of the journal it reflects (docs/clock.md).
    """

    def __init__(self, table: Table) -> None:
        self.table = table
        self.keys, self.stamped, self._blank, self.names = shape(table)
        self.new: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.changed: dict[tuple[Any, ...], dict[str, Any]] = {}
        #: The seq of the record being applied.
        self.seq = 0

    def insert(self, key: tuple[Any, ...], row: dict[str, Any]) -> None:
        """A new row at ``key`` (columns ``row`` does not name are NULL)."""
        full = self._blank.copy()
        full.update(row)
        full.update(zip(self.keys, key, strict=True))
        if self.stamped:
            full["last_seq"] = self.seq
        self.new[key] = full

    def update(self, key: tuple[Any, ...], **values: Any) -> None:
        """Set ``values`` in the row at ``key`` (a new row of the batch takes them at once)."""
        if self.stamped:
            values["last_seq"] = self.seq
        row = self.new.get(key)
        if row is not None:
            row.update(values)
        else:
            self.changed.setdefault(key, {}).update(values)

    def groups(self) -> dict[tuple[str, ...], list[dict[str, Any]]]:
        """The changed rows by their set of changed columns (each row with its key)."""
        groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for key, values in self.changed.items():
            columns = tuple(sorted(values))
            values.update(zip(self.keys, key, strict=True))
            groups.setdefault(columns, []).append(values)
        return groups

    def flush(self, conn: Connection) -> int:
        """Write the new rows (one INSERT) and the changed ones (one UPDATE per column set)."""
        statements = 0
        if self.new:
            _insert_many(conn, self.table, self.new.values())
            statements += 1
        keys = tuple(self.keys)
        marker = _MARKERS.get(conn.dialect.paramstyle)
        for columns, rows in self.groups().items():
            if marker is not None:  # the driver's executemany, rows as tuples
                sql = _update_sql(conn.dialect, self.table, keys, columns, marker)
                driver(conn, sql, _driver_rows(self.table, columns + keys, rows), many=True)
            else:  # a driver the fast path does not know: SQLAlchemy binds
                params = [
                    {**{f"k_{k}": row[k] for k in keys}, **{f"v_{c}": row[c] for c in columns}}
                    for row in rows
                ]
                conn.execute(_update_of(self.table, keys, columns), params)
            statements += 1
        return statements


def mark_sql(dialect: Any, notify: bool) -> tuple[str, str] | None:
    """The SQL that reads and locks the mark, and the SQL that moves it (and notifies).

    Both take the driver's positional markers: the lock ``(id,)``; the move
    ``(last_seq, id)``, then on PostgreSQL ``(channel, payload)`` for the
    ``pg_notify`` that rides in the same statement (a CTE), so moving the
    mark is one round trip.
    """
    m = _MARKERS.get(dialect.paramstyle)
    if m is None:
        return None
    quote = dialect.identifier_preparer.quote
    table, last, key = quote(ProjectorState.__tablename__), quote("last_seq"), quote("id")
    lock = f"SELECT {last} FROM {table} WHERE {key} = {m}"
    move = f"UPDATE {table} SET {last} = {m} WHERE {key} = {m}"
    if dialect.name == "postgresql":
        lock += " FOR UPDATE"
    if notify:
        move = f"WITH moved AS ({move} RETURNING {last}) SELECT pg_notify({m}, {m}) FROM moved"
    return lock, move


@functools.cache
def shape(table: Table) -> tuple[list[str], bool, dict[str, Any], tuple[str, ...]]:
    """``table``'s primary key, whether it has ``last_seq``, a row of its columns, their names."""
    keys = [c.name for c in table.primary_key.columns]
    names = tuple(c.name for c in table.columns)
    blank: dict[str, Any] = dict.fromkeys(names)
    return keys, "last_seq" in table.c, blank, names


#: Positional parameter markers by DB-API ``paramstyle`` (sqlite3: qmark; psycopg: pyformat).
_MARKERS: Final = {"qmark": "?", "format": "%s", "pyformat": "%s"}


def _insert_many(conn: Connection, table: Table, rows: Iterable[dict[str, Any]]) -> None:
    """INSERT ``rows`` (dicts of every column of ``table``) in one executemany."""
    marker = _MARKERS.get(conn.dialect.paramstyle)
    if marker is None:  # a driver the fast path does not know: SQLAlchemy binds
        conn.execute(_insert_of(table), list(rows))
        return
    names = tuple(c.name for c in table.columns)
    sql = _insert_sql(conn.dialect, table, names, marker)
    driver(conn, sql, _driver_rows(table, names, rows), many=True)


def driver(conn: Connection, sql: str, params: Any, *, many: bool = False) -> Any:
    """Run driver SQL on ``conn``'s DB-API connection, in its transaction; return the first row.

    The projector's own statements (already the driver's SQL, parameters
    already the driver's values) skip SQLAlchemy's execution context: its
    setup and result objects cost more than a small statement's work in
    SQLite (a tenth of a 22-record batch). A driver error is raised as
    SQLAlchemy would raise it (``session.driver_errors``), so
    :func:`is_transient` reads it the same.
    """
    with driver_errors(conn, sql, params, many=many) as raw:
        cursor = raw.cursor()
        try:
            if many:
                cursor.executemany(sql, params)
                return None
            cursor.execute(sql, params)
            return cursor.fetchone() if cursor.description is not None else None
        finally:
            cursor.close()


def _driver_rows(
    table: Table, names: tuple[str, ...], rows: Iterable[dict[str, Any]]
) -> list[tuple[Any, ...]]:
    """``rows`` as the driver's parameters: ``names``' values, JSON columns as their text.

    The text SQLAlchemy's JSON type would bind (``json_text``, the engine's
    serializer; None is JSON ``null``, as ``none_as_null=False`` stores
    it), made here in one pass: SQLAlchemy's per-row parameter processing
    was a third of the projector's time for a batch of 1,000 new steps.
    The other columns (text, integers, floats) bind as they are.
    """
    json = pgflush.json_columns(table)
    positions = [i for i, name in enumerate(names) if name in json]
    out = []
    for row in rows:
        values = [row[name] for name in names]
        for i in positions:
            values[i] = json_text(values[i])
        out.append(tuple(values))
    return out


@functools.cache
def _insert_sql(dialect: Any, table: Table, names: tuple[str, ...], marker: str) -> str:
    quote = dialect.identifier_preparer.quote
    columns = ", ".join(quote(n) for n in names)
    markers = ", ".join([marker] * len(names))
    return f"INSERT INTO {quote(table.name)} ({columns}) VALUES ({markers})"


@functools.cache
def _update_sql(
    dialect: Any, table: Table, keys: tuple[str, ...], columns: tuple[str, ...], marker: str
) -> str:
    quote = dialect.identifier_preparer.quote
    sets = ", ".join(f"{quote(c)} = {marker}" for c in columns)
    where = " AND ".join(f"{quote(k)} = {marker}" for k in keys)
    return f"UPDATE {quote(table.name)} SET {sets} WHERE {where}"


@functools.cache
def _insert_of(table: Table) -> Insert:
    """The INSERT of ``table``'s rows (built once: a statement's cache key is not free)."""
    return insert(table)


@functools.cache
def _update_of(table: Table, keys: tuple[str, ...], columns: tuple[str, ...]) -> Update:
    """The UPDATE of ``columns`` by primary key ``keys`` (``k_*`` and ``v_*`` parameters)."""
    where = and_(*(table.c[k] == bindparam(f"k_{k}") for k in keys))
    return sql_update(table).where(where).values({c: bindparam(f"v_{c}") for c in columns})


class Batch:
    """A batch's row changes: runs, tasks and steps by key, and the journal records' rows."""

    def __init__(self) -> None:
        self.runs = Rows(Run.__table__)  # type: ignore[arg-type]
        self.tasks = Rows(Task.__table__)  # type: ignore[arg-type]
        self.steps = Rows(Step.__table__)  # type: ignore[arg-type]
        self.records: list[dict[str, Any]] = []  # journal_records rows

    def at(self, seq: int) -> None:
        """The records that follow are ``seq``'s (rows they touch carry it)."""
        self.runs.seq = self.tasks.seq = self.steps.seq = seq

    def parts(self) -> list[pgflush.Part]:
        """The batch as :func:`pgflush.statement`'s parts: new rows, then updates."""
        out: list[pgflush.Part] = []
        for rows in (self.runs, self.tasks, self.steps):
            if rows.new:
                out.append((rows.table, None, rows.names, rows.new.values()))
        if self.records:
            table: Table = JournalRecord.__table__  # type: ignore[assignment]
            out.append((table, None, shape(table)[3], self.records))
        for rows in (self.runs, self.tasks, self.steps):
            if rows.changed:  # one part a table, whatever columns each row changes
                keys = tuple(rows.keys)
                changed = [
                    {**values, **dict(zip(keys, key, strict=True))}
                    for key, values in rows.changed.items()
                ]
                out.append((rows.table, keys, rows.names, changed))
        return out

    def flush(
        self,
        conn: Connection,
        moved: tuple[int, int, int] | None = None,
        notify: tuple[str, str] | None = None,
    ) -> int:
        """Write the batch; return the statements it took.

        With ``moved`` (``(last_seq, state id, expected mark)``), the batch,
        the mark's move and ``notify`` are one statement (:mod:`pgflush`,
        PostgreSQL in autocommit).

        Raises:
            pgflush.MarkMoved: The mark was not at the expected seq; nothing was written.
        """
        if moved is not None:
            sql, params = pgflush.statement(conn.dialect, self.parts(), moved, notify)
            if driver(conn, sql, params) is None:
                raise pgflush.MarkMoved(
                    f"the store's mark moved from seq {moved[2]} under this projector",
                    mark=moved[2],
                )
            return 1
        # Parents first: tasks and steps reference runs.
        n = self.runs.flush(conn) + self.tasks.flush(conn) + self.steps.flush(conn)
        if self.records:
            _insert_many(conn, JournalRecord.__table__, self.records)  # type: ignore[arg-type]
            n += 1
        return n
