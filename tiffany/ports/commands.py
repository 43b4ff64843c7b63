"""The ``Commands`` port: the engine commands the API and the CLI send, and where each goes.

One interface (:class:`Commands`) with two implementations, picked once
from the settings when a process starts (:func:`commands_for`):

- :class:`SocketCommands` (the file WAL): each engine of the data dir
  listens on the control socket in its home (``tiffany/wire/shards.py``).
- :class:`~tiffany.ports.commands_pg.PgCommands` (``TIFFANY_JOURNAL=postgres``):
  submissions and a run's commands are rows of ``engine_requests`` that any
  engine, on any host, claims (``tiffany/engine/db_requests.py``).

Which engine gets a command is decided here, once, for the API and the CLI:

- **submit**: with an idempotency key, to the engine the key hashes to
  (:func:`~tiffany.wire.shards.engine_for_key`), so that a repeated key meets
  the engine that remembers it; without one, round robin over the engines,
  passing over one that does not answer or is not ready.
- **a run's commands** (cancel, signal, verify): to the engine whose seqs
  hold the run's RUN_START (``owner``: the store's ``start_seq``); a run the
  store does not show yet is asked of every engine, each answering only for
  runs it holds.
- **a re-run** (a submission that reads its source run from the store): an
  engine waits only for its own projection before it reads, so the store
  must first hold the source run's end, which its own engine wrote. Without
  a key, to that engine; with one, to the key's engine, once the source's
  engine's projection holds what it has written. A run the store does not
  show yet: every engine's projection first, then as above.

With one engine every command goes to it. ``status``, ``metrics``, ``tools``
and ``check_plan`` ask the engines of this host, over their sockets, on
either transport (an API replica without an engine here has none to ask).

Refusals come back as the engine raised them (:class:`~tiffany.errors.Refusal`
subclasses); no engine to ask is :class:`~tiffany.errors.EngineUnavailable`.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from tiffany.errors import EngineNotReady, EngineUnavailable, RunNotFound
from tiffany.wire import shards
from tiffany.wire.control import (
    AsyncControlClient,
    Cancel,
    Cancelling,
    CheckPlan,
    Command,
    Export,
    Metrics,
    MetricsText,
    Rerun,
    Signal,
    Signalled,
    Status,
    Submit,
    Submitted,
    Tools,
    Verify,
    WaitProjected,
    Waits,
)

if TYPE_CHECKING:
    from tiffany.config import Settings

__all__ = [
    "RERUN_SOURCE_WAIT_S",
    "Commands",
    "Owner",
    "SocketCommands",
    "commands_for",
]

#: How long a re-run waits for the store to hold its source run's engine's writes, in seconds.
RERUN_SOURCE_WAIT_S: Final = 5.0

#: ``owner(run_id)``: the engine whose journal started the run, as the store says
#: (None: the store does not show it yet).
Owner = Callable[[str], Awaitable[int | None]]


class Commands(Protocol):
    """The engine commands of a process (the API, the CLI), whatever carries them."""

    #: The engines' control clients on this host (engine 0 first): what
    #: asks them for their status, metrics and tools, and for their
    #: projection's progress (the watermark).
    controls: list[AsyncControlClient]
    #: Engines elsewhere take commands (any number of them, on other hosts).
    remote: bool

    def start(self) -> None:
        """Start what the transport needs in the running event loop (listeners)."""

    async def close(self) -> None:
        """Close every connection."""

    async def connected(self, wait_s: float) -> None:
        """Until the answers can come as they are given (a listener up), ``wait_s`` at most.

        A one-shot client (the CLI) waits so; an answer that comes before
        is still had, a little later, from where it is kept.
        """

    async def submit(
        self, plan: Any, inputs: Any, key: str | None, *, workflow: str | None = None
    ) -> Submitted:
        """Start a run of ``plan`` (or of ``workflow``); its answer once the run is durable."""

    async def rerun(
        self, run_id: str, *, inputs: dict[str, Any], from_step: str | None, key: str | None
    ) -> Submitted:
        """Run the finished run ``run_id`` again from ``from_step`` (default: its failed steps)."""

    async def cancel(self, run_id: str, reason: str) -> Cancelling:
        """Cancel a running run."""

    async def signal(self, run_id: str, name: str, payload: Any, signal_id: str) -> Signalled:
        """Journal signal ``name`` for a run; its answer once the record is durable."""

    async def verify(self, run_id: str, timeout: float) -> dict[str, Any]:
        """Replay a finished run against its journal; the report."""

    async def export(self, run_id: str, timeout: float) -> dict[str, Any]:
        """A run's export file (base64, ``export``), from the engine that journaled it."""

    async def waits(self, run_id: str) -> dict[str, Any]:
        """The signals a running run waits for now, with their schemas (``Waits``)."""

    async def status(self, timeout: float) -> list[dict[str, Any] | BaseException]:
        """Each engine's status on this host, or why it did not answer (engine by engine)."""

    async def metrics(self, timeout: float) -> list[str | None]:
        """Each engine's metrics text on this host (None: it did not answer)."""

    async def tools(self, timeout: float) -> dict[str, Any]:
        """The tools of the first engine of this host that answers."""

    async def check_plan(self, plan: Any, inputs: Any, *, workflow: str | None = None) -> None:
        """Have an engine of this host check a plan or a workflow (refused: invalid); none: none."""

    async def engines_elsewhere(self, besides: Sequence[str]) -> int:
        """How many engines on other hosts hold their journal (lease owners not in ``besides``)."""


class LocalEngines:
    """The engines of this host, over their control sockets: the commands any transport asks them.

    Args:
        homes: Each engine's home (its control socket), engine 0 first.
    """

    remote = False

    def __init__(self, homes: Sequence[Path]) -> None:
        self.homes = list(homes)
        self.controls = [AsyncControlClient(home) for home in self.homes]

    def start(self) -> None:
        """Nothing to start: the sockets connect on first use."""

    async def connected(self, wait_s: float) -> None:
        """At once: a socket's answers come on the connection that asked."""

    async def close(self) -> None:
        """Close every control connection."""
        for control in self.controls:
            await control.close()

    async def status(self, timeout: float) -> list[dict[str, Any] | BaseException]:
        """Each engine's status, or the exception, engine by engine."""
        return await self._each(Status(), timeout)

    async def metrics(self, timeout: float) -> list[str | None]:
        """Each engine's metrics text (None: it did not answer)."""
        answers = await self._each(Metrics(), timeout)
        return [a.text if isinstance(a, MetricsText) else None for a in answers]

    async def tools(self, timeout: float) -> dict[str, Any]:
        """The tools of the first engine that answers."""
        refused: EngineUnavailable | None = None
        for control in self.controls:
            try:
                listing: dict[str, Any] = await control.send(Tools(), timeout=timeout)
                return listing
            except EngineUnavailable as exc:
                refused = exc
        raise refused or EngineUnavailable("no engine to ask")

    async def check_plan(self, plan: Any, inputs: Any, *, workflow: str | None = None) -> None:
        """Have an engine of this host check a plan (or a workflow); without one, no check.

        Without an engine socket (API replicas on the PostgreSQL journal) a
        schedule's plan is checked at its first tick instead.
        """
        for control in self.controls:
            try:
                await control.send(CheckPlan(plan=plan, inputs=inputs, workflow=workflow))
                return
            except EngineUnavailable:
                continue

    async def engines_elsewhere(self, besides: Sequence[str]) -> int:
        """None: the sockets reach this host's engines only."""
        return 0

    async def _each(self, command: Command, timeout: float) -> list[Any]:
        return list(
            await asyncio.gather(
                *(c.send(command, timeout=timeout) for c in self.controls),
                return_exceptions=True,
            )
        )

    # -- a run's commands: typed here, sent by each transport's _for_run -------------

    async def cancel(self, run_id: str, reason: str) -> Cancelling:
        """Cancel a run, on the engine that holds it."""
        answer: Cancelling = await self._for_run(Cancel(run_id=run_id, reason=reason))
        return answer

    async def signal(self, run_id: str, name: str, payload: Any, signal_id: str) -> Signalled:
        """Signal a run, on the engine that holds it."""
        command = Signal(run_id=run_id, name=name, payload=payload, signal_id=signal_id)
        answer: Signalled = await self._for_run(command)
        return answer

    async def verify(self, run_id: str, timeout: float) -> dict[str, Any]:
        """Verify a run, on the engine that journaled it."""
        report: dict[str, Any] = await self._for_run(Verify(run_id=run_id), timeout)
        return report

    async def export(self, run_id: str, timeout: float) -> dict[str, Any]:
        """A run's export file, from the engine that journaled it."""
        answer: dict[str, Any] = await self._for_run(Export(run_id=run_id), timeout)
        return answer

    async def waits(self, run_id: str) -> dict[str, Any]:
        """The signals a running run waits for now, with their schemas, from its engine."""
        answer: dict[str, Any] = await self._for_run(Waits(run_id=run_id))
        return answer

    async def _for_run(
        self, command: Cancel | Signal | Verify | Export | Waits, timeout: float | None = None
    ) -> Any:
        """Send a run's command to the engine that holds the run (each transport's way)."""
        raise NotImplementedError


class SocketCommands(LocalEngines):
    """Commands over the engines' control sockets (the file WAL; module docstring).

    Args:
        homes: Each engine's home (its control socket), engine 0 first.
        owner: The engine that started a run, as the store says.
    """

    def __init__(self, homes: Sequence[Path], owner: Owner) -> None:
        super().__init__(homes)
        self._owner = owner
        # Round robin from a random engine: one-shot clients (the CLI) spread too.
        self._turn = itertools.count(secrets.randbelow(len(self.controls)))

    async def submit(
        self, plan: Any, inputs: Any, key: str | None, *, workflow: str | None = None
    ) -> Submitted:
        """Submit to the key's engine, or round robin (module docstring)."""
        command = Submit(plan=plan, workflow=workflow, inputs=inputs, key=key)
        return await self._submit(command, key)

    async def rerun(
        self, run_id: str, *, inputs: dict[str, Any], from_step: str | None, key: str | None
    ) -> Submitted:
        """Submit a re-run where the store holds its source run (module docstring).

        Raises:
            EngineNotReady: An engine's projection did not catch up in
                :data:`RERUN_SOURCE_WAIT_S`.
            Refusal: The engine's refusals (not found, not finished, invalid).
        """
        command = Rerun(rerun_of=run_id, inputs=inputs, from_step=from_step, key=key)
        n = len(self.controls)
        if n == 1:
            return await self._submit(command, key)
        engine = await self._owner(run_id)
        if engine is None:  # started and ended within a projection's gathering, or unknown
            await self._caught_up(range(n))
            engine = await self._owner(run_id)
        if engine is None or engine >= n:  # the engines' not found (or a retired one's run)
            return await self._submit(command, key)
        if key is None:
            try:  # it waits for its own projection, which holds the source run's end
                answer: Submitted = await self.controls[engine].send(command)
                return answer
            except (EngineUnavailable, EngineNotReady):
                pass  # restarting, stopping: another engine reads what the store holds
            return await self._submit(command, None)
        if engine != shards.engine_for_key(key, n):
            await self._caught_up([engine])
        return await self._submit(command, key)

    async def _submit(self, command: Submit | Rerun, key: str | None) -> Submitted:
        n = len(self.controls)
        if n == 1:
            answer: Submitted = await self.controls[0].send(command)
            return answer
        if key is not None:
            answer = await self.controls[shards.engine_for_key(key, n)].send(command)
            return answer
        first = next(self._turn)
        refused: Exception | None = None
        for i in range(n):
            try:
                answer = await self.controls[(first + i) % n].send(command)
                return answer
            except (EngineUnavailable, EngineNotReady) as exc:  # a bad plan is bad everywhere
                refused = exc
        assert refused is not None
        raise refused

    async def _for_run(
        self, command: Cancel | Signal | Verify | Export | Waits, timeout: float | None = None
    ) -> Any:
        """Send a run's command to its engine; a run the store does not show: ask each, live.

        Raises:
            RunNotFound: No engine holds the run.
        """
        n = len(self.controls)
        owner = 0 if n == 1 else await self._owner(command.run_id)
        if owner is not None:
            engine = owner if owner < n else 0
            return await self.controls[engine].send(command, timeout=timeout)
        live = type(command)(**{**_fields(command), "live": True})
        answers = await asyncio.gather(
            *(c.send(live, timeout=timeout) for c in self.controls), return_exceptions=True
        )
        missing: BaseException | None = None
        for answer in answers:
            if not isinstance(answer, BaseException):
                return answer
            if isinstance(answer, RunNotFound):
                missing = answer
                continue
            raise answer
        assert missing is not None
        raise missing

    async def _caught_up(self, engines: Iterable[int]) -> None:
        """Wait until the store holds what each of ``engines`` has written (one away: not)."""

        async def one(engine: int) -> None:
            wait = WaitProjected(written=True, wait_s=RERUN_SOURCE_WAIT_S)
            try:
                now = await self.controls[engine].send(wait)
            except EngineUnavailable:
                return  # nothing is written meanwhile; what the store holds is the answer
            if not now.reached:
                written, reached = now.written_seq, now.last_seq
                raise EngineNotReady(
                    f"the store is at seq {reached} of engine {engine} and did not reach seq "
                    f"{written} within {RERUN_SOURCE_WAIT_S:g} s; retry",
                    detail={"min_seq": written, "store_seq": reached},
                )

        await asyncio.gather(*(one(engine) for engine in engines))


def _fields(command: Command) -> dict[str, Any]:
    return {f: getattr(command, f) for f in command.__struct_fields__}


def commands_for(settings: Settings, owner: Owner) -> Commands:
    """The process's :class:`Commands`, chosen once from ``settings``.

    Args:
        settings: The process's settings (its data dir, engines, journal).
        owner: The engine that started a run, as the store says.
    """
    homes = shards.homes(settings.data_dir, settings.engines)
    if settings.journal != "postgres":
        return SocketCommands(homes, owner)
    from tiffany.ports.commands_pg import PgCommands

    return PgCommands(settings.database_url, homes, owner, settings.engine_wait_s)
