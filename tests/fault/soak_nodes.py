"""The soak's servers and the faults done to them: kill -9, SIGTERM restarts, SIGSTOP.

A :class:`Node` is one ``tiffany serve`` on a data dir of its own and a
fixed port on 127.0.0.1 (a restarted API comes back where clients look).
On the file WAL the soak runs one; on the PostgreSQL journal two on one
stream (one drives it, the other waits for its lease: a standby).

Each fault that stops an engine returns a :class:`~soak_account.Stop`
naming the engine's pid, when it was told to stop (``t_cut``) and the last
seq it wrote (on the file WAL read here; on PostgreSQL from the
:data:`EPOCHS` table, see :func:`pg_schema`).

* ``kill -9`` of one process of a node, drawn from :data:`TARGETS`: the
  whole group (then started again); the serve supervisor alone (its
  children are watched for :data:`ORPHAN_WAIT_S`, counted if still alive,
  then killed with the group, and the node started again); the engine (on
  the file WAL the supervisor is paused meanwhile, so that no new engine
  writes before the last seq is read; serve restarts it); the projector (the
  engine restarts it); the API (serve restarts it). Only the first three
  stop an engine.
* A SIGTERM restart: SIGTERM to serve, which stops its API and then its
  engine. ``t_cut`` is when the API exited (a pidfd: serve signals the
  engine right after) plus :data:`SIGTERM_GRACE_S`. This leans on that
  order: a serve that signalled its engine before its API was gone would
  have the effects started in between counted as in flight.
* A SIGSTOP (PostgreSQL): the driving engine is stopped until another takes
  its stream over (a new epoch whose old owner is its pid), then continued;
  it must start nothing more and exit.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from fault_support import Served, process_roles
from soak_account import Stop

#: What a kill -9 may hit.
TARGETS = ("group", "serve", "engine", "projector", "api")
#: How long the children of a killed supervisor are watched before they are killed too, in s.
ORPHAN_WAIT_S = 5.0
#: How long after serve signals its engine (the API's exit) an execution still counts as in
#: flight, in s: the engine's loop thread runs its signal handler when it next gets the CPU.
SIGTERM_GRACE_S = 0.05
#: How long serve gets to stop after SIGTERM before the soak kills it, in s.
SIGTERM_TIMEOUT_S = 90.0
#: The table the soak's trigger fills with every change of a stream's owner (PostgreSQL).
EPOCHS = "soak_epochs"


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound and let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait up to ``timeout`` s for ``pids`` to end; those still alive."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


def wal_last_seq(wal_dir: Path, after: int) -> int:
    """The last whole record's seq in a stopped WAL (``after``: a seq known to be there)."""
    from tiffany.wal import spans_of

    last = after
    for span in spans_of(wal_dir, max(after, 1)):
        last = span[0]
    return last


class Node:
    """One ``tiffany serve`` of the soak.

    Args:
        name: Its name (``a``, ``b``): its data dir and log under ``base``.
        base: The soak's directory.
        env: Its environment.
    """

    def __init__(self, name: str, base: Path, env: dict[str, str]) -> None:
        self.name = name
        self.data = base / name
        self.log_path = base / f"{name}-serve.log"
        self.env = env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.served: Served | None = None
        self.up = False
        self.starts = 0

    def start(self) -> None:
        """Start serve (its API answers once this returns)."""
        self.served = Served(self.data, self.env, log_path=self.log_path, port=self.port)
        self.starts += 1
        self.up = True

    def roles(self) -> dict[str, int]:
        """``{"serve", "engine", "api", "projector"}`` pids (those running)."""
        if self.served is None or self.served.proc.poll() is not None:
            return {}
        return {"serve": self.served.proc.pid, **process_roles(self.served.proc.pid)}

    def wait_ready(self, timeout: float = 120) -> bool:
        """Until ``/readyz`` answers 200 (a standby's says another engine drives)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/readyz", timeout=5).status_code == 200:
                    return True
            time.sleep(0.2)
        return False

    def kill_group(self) -> float:
        """SIGKILL the whole group (and any descendant that left it); when it was sent."""
        self.up = False
        if self.served is None:
            return time.monotonic()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.served.proc.pid, signal.SIGKILL)
        t = time.monotonic()  # after: an effect written before is in flight
        self.served.kill9()
        return t

    def sigterm(self) -> tuple[float, int | None]:
        """SIGTERM serve and wait: ``(t_cut, exit code)`` (None: killed after the timeout)."""
        assert self.served is not None
        self.up = False
        api = self.roles().get("api")
        fd = None
        if api is not None:
            with contextlib.suppress(OSError):
                fd = os.pidfd_open(api)
        t_cut = time.monotonic()
        self.served.proc.send_signal(signal.SIGTERM)
        if fd is not None:
            try:
                select.select([fd], [], [], SIGTERM_TIMEOUT_S)
                t_cut = time.monotonic()
            finally:
                os.close(fd)
        t_cut += SIGTERM_GRACE_S
        try:
            code: int | None = self.served.proc.wait(SIGTERM_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # a hung stop: counted by its code, None
            self.served.kill9()
            code = None
        return t_cut, code

    def close(self) -> None:
        """Leave nothing of it running (idempotent)."""
        self.up = False
        if self.served is not None:
            self.served.close()


# --- PostgreSQL ----------------------------------------------------------------------------


@contextlib.contextmanager
def pg_schema(url: str) -> Iterator[str]:
    """A migrated private schema on ``url`` that records its streams' changes of owner.

    A trigger on ``wal_streams`` writes a row of :data:`EPOCHS` whenever a
    stream's epoch changes (an engine took the lease): the previous owner
    (``host:pid:random``), its head then (the last seq it wrote: a fenced
    commit writes nothing) and the database's clock. Dropped at the end.
    """
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    from tiffany.store import make_engine
    from tiffany.store.migrate import upgrade

    schema = f"soak_{uuid.uuid4().hex[:10]}"
    admin = make_engine(url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    scoped = make_url(url).update_query_dict({"options": f"-csearch_path={schema}"})
    rendered = scoped.render_as_string(hide_password=False)
    try:
        engine = make_engine(rendered)
        upgrade(engine)
        with engine.begin() as conn:
            conn.execute(
                text(
                    f'CREATE TABLE "{schema}".{EPOCHS} (stream text, epoch bigint, '
                    "old_owner text, new_owner text, old_head bigint, at float8)"
                )
            )
            conn.execute(
                text(
                    f'CREATE FUNCTION "{schema}".soak_epoch() RETURNS trigger AS $$ BEGIN '
                    f'INSERT INTO "{schema}".{EPOCHS} VALUES (NEW.stream, NEW.epoch, '
                    "OLD.owner, NEW.owner, OLD.head, extract(epoch from clock_timestamp())); "
                    "RETURN NEW; END $$ LANGUAGE plpgsql"
                )
            )
            conn.execute(
                text(
                    f'CREATE TRIGGER soak_epoch AFTER UPDATE ON "{schema}".wal_streams '
                    "FOR EACH ROW WHEN (OLD.epoch IS DISTINCT FROM NEW.epoch) "
                    f'EXECUTE FUNCTION "{schema}".soak_epoch()'
                )
            )
        engine.dispose()
        yield rendered
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def owner_pid(owner: str | None) -> int | None:
    """The pid in a lease holder's name (``host:pid:random``)."""
    if not owner:
        return None
    with contextlib.suppress(ValueError, IndexError):
        return int(owner.rsplit(":", 2)[1])
    return None


def epochs(url: str) -> list[dict[str, Any]]:
    """The rows of :data:`EPOCHS`, oldest first."""
    import psycopg

    from tiffany.wal.pg import conninfo

    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT stream, epoch, old_owner, new_owner, old_head, at FROM {EPOCHS} ORDER BY epoch"
        ).fetchall()
    keys = ("stream", "epoch", "old_owner", "new_owner", "old_head", "at")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def driving_pid(url: str, stream: str = "main") -> int | None:
    """The pid of the engine that holds ``stream``'s lease now (None: nobody's is current)."""
    import psycopg

    from tiffany.wal.pg import conninfo

    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT owner FROM wal_streams WHERE stream = %s "
            "AND lease_until > extract(epoch from clock_timestamp())",
            (stream,),
        ).fetchone()
    return owner_pid(row[0]) if row else None


def pg_stops(
    url: str, planned: dict[int, Stop], mono_offset: float, end: float = float("inf")
) -> dict[int, Stop]:
    """The planned stops with their last seqs, and every other change of owner as ``unplanned``.

    Args:
        url: The soak's schema.
        planned: The soak's stops by engine pid (their ``seq`` unknown yet).
        mono_offset: ``time.time() - time.monotonic()``, to put the database's
            clock on the effects' one.
        end: When the soak began to stop its servers (``CLOCK_MONOTONIC``):
            later changes of owner are that stop's, not unplanned.
    """
    from soak_account import UNPLANNED

    out: dict[int, Stop] = {}
    for row in epochs(url):
        pid = owner_pid(row["old_owner"])
        at = float(row["at"]) - mono_offset
        if pid is None or pid in out or (pid not in planned and at > end):
            continue
        stop = planned.get(pid)
        if stop is None:
            out[pid] = Stop(UNPLANNED, pid, at, int(row["old_head"]))
        else:
            out[pid] = Stop(stop.kind, pid, stop.t_cut, int(row["old_head"]), stop.t_resume)
    for pid, stop in planned.items():
        out.setdefault(pid, stop)  # never held the lease: it wrote nothing
    return out
