"""Instruments: read-only observer hooks on the scheduler (trio's design).

The journal, the activity log (PAL), metrics and the slow-dispatch watchdog
all attach here; the kernel imports none of them.

Cost: for each hook the scheduler keeps one callable, or ``None`` when no
attached instrument overrides that hook. The loop tests a local for ``None``
before calling, so with no instrument attached the hooks cost nothing, and
an instrument pays only for the hooks it defines.

Failure policy (trio's ``Instruments.call``, kept in one place: here): every
compiled hook is guarded, so a hook never raises into the scheduler. An
instrument whose hook raises is removed and the failure is logged. A
*critical* instrument (``critical = True``: the journal) stops the kernel
instead: the set hands the scheduler an
:class:`~tiffany.errors.InstrumentFailure`, which ``Scheduler.run`` raises once
the current dispatch ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import structlog

from tiffany.errors import InstrumentFailure

if TYPE_CHECKING:
    from tiffany.kernel.calls import SystemCall
    from tiffany.kernel.task import Task

__all__ = ["DISPATCH_HOOKS", "HOOKS", "Instrument", "InstrumentSet"]

log = structlog.get_logger("tiffany.kernel")

#: Every hook an instrument may define, in the order they occur for a task.
HOOKS = (
    "before_run",
    "task_spawned",
    "before_dispatch",
    "after_dispatch",
    "task_blocked",
    "task_woken",
    "task_exited",
    "task_crashed",
    "before_wait",
    "after_wait",
    "after_run",
)

#: How many arguments each hook takes (a guard is compiled per arity).
_ARITY = {
    "before_run": 0,
    "task_spawned": 1,
    "before_dispatch": 1,
    "after_dispatch": 2,
    "task_blocked": 2,
    "task_woken": 2,
    "task_exited": 1,
    "task_crashed": 2,
    "before_wait": 1,
    "after_wait": 1,
    "after_run": 0,
}


class Instrument:
    """Base class of scheduler observers; override only the hooks you need.

    Hooks run on the scheduler thread, inside the loop: they must be quick
    and must not block (hand heavy work to another thread).
    """

    #: A critical instrument's failure stops the kernel (fail-stop).
    critical: ClassVar[bool] = False

    def before_run(self) -> None:
        """Call when ``Scheduler.run`` starts its loop."""

    def after_run(self) -> None:
        """Call when ``Scheduler.run`` (or ``Scheduler.drain``) returns or raises."""

    def task_spawned(self, task: Task) -> None:
        """Call after ``task`` was created and put on the ready queue."""

    def before_dispatch(self, task: Task) -> None:
        """Call right before the scheduler resumes ``task``'s coroutine."""

    def after_dispatch(self, task: Task, yielded: Any) -> None:
        """Call when ``task`` yielded ``yielded``.

        ``yielded`` is :data:`~tiffany.kernel.scheduler.RETURNED` when the
        running coroutine returned or raised instead (a nested coroutine
        returning to its caller, or the task ending).
        """

    def task_blocked(self, task: Task, call: SystemCall) -> None:
        """Call when ``task`` parks on ``call`` (its state says what kind)."""

    def task_woken(self, task: Task, value: Any) -> None:
        """Call when a parked ``task`` is made ready; ``value`` is what it gets.

        ``task.blocked_on`` still names the call it was parked on, and
        ``task.pending_error`` holds the exception when it is woken with one.
        """

    def task_exited(self, task: Task) -> None:
        """Call when ``task`` ended as DONE or CANCELLED."""

    def task_crashed(self, task: Task, error: BaseException) -> None:
        """Call when ``task`` ended by raising ``error``."""

    def before_wait(self, timeout: float | None) -> None:
        """Call at the end of a pass, before the loop polls for events.

        This is the group-commit point: effects the pass requested (thread
        jobs) are released only after this hook returns, and not at all while
        the hook leaves them held (``Scheduler.hold_effects``: a commit
        deferred to a later pass). The stage's injectors have run already,
        and the hook is called once per stage: ``timeout`` is how long the
        loop will block (0: it polls; None: until an event).
        """

    def after_wait(self, events: int) -> None:
        """Call after the poll; ``events`` wake-ups came from outside."""


Hook = Callable[..., None]
#: The hooks the loop calls on every dispatch (see :class:`InstrumentSet`, ``bare``).
DISPATCH_HOOKS: tuple[str, ...] = ("before_dispatch", "after_dispatch")
#: Called as ``failed(instrument, hook, error)`` by a guard whose hook raised.
_Failed = Callable[["Instrument", str, Exception], None]


class InstrumentSet:
    """The attached instruments, compiled into one guarded callable per hook.

    ``hooks[name]`` is None when no instrument defines ``name``; otherwise a
    callable that calls every instrument defining it, each guarded: a hook
    that raises is reported to :meth:`failed` and the others are still
    called. The scheduler calls ``hooks[name]`` bare.

    The two hooks called once per dispatch (:data:`DISPATCH_HOOKS`) are also
    in ``bare``: with one instrument defining it, its method itself, which
    the loop calls inside its own ``try`` and reports with :meth:`raised`;
    with several, the guarded fan-out (which never raises). A guard's frame
    on every dispatch was a measurable share of a replay (bench/README.md,
    "The house, before and after"); the policy is still the set's, in one place.

    Args:
        on_change: Called after ``hooks`` changed (an instrument attached,
            detached or removed for failing); the scheduler re-reads them.
        on_fatal: Called with the :class:`~tiffany.errors.InstrumentFailure`
            when a critical instrument fails, before it is logged and
            removed: the scheduler halts its effects there and stops.
    """

    def __init__(
        self,
        on_change: Callable[[], None],
        on_fatal: Callable[[InstrumentFailure], None],
    ) -> None:
        self._on_change = on_change
        self._on_fatal = on_fatal
        self.instruments: list[Instrument] = []
        self.hooks: dict[str, Hook | None] = dict.fromkeys(HOOKS)
        #: The dispatch hooks for the loop: unguarded when one instrument has it.
        self.bare: dict[str, Hook | None] = dict.fromkeys(DISPATCH_HOOKS)
        #: The one instrument behind each unguarded ``bare`` hook.
        self._bare_owner: dict[str, Instrument] = {}

    def add(self, instrument: Instrument) -> None:
        """Attach ``instrument`` (attaching twice is an error)."""
        if instrument in self.instruments:
            raise ValueError(f"instrument {instrument!r} is already attached")
        self.instruments.append(instrument)
        self._compile()

    def remove(self, instrument: Instrument) -> None:
        """Detach ``instrument`` if attached."""
        if instrument in self.instruments:
            self.instruments.remove(instrument)
            self._compile()

    def failed(self, inst: Instrument, hook: str, exc: Exception) -> None:
        """Apply the failure policy to ``inst``, whose ``hook`` raised ``exc``.

        A critical instrument's failure goes to ``on_fatal`` first, then is
        logged; any other is logged with its traceback. Either way the
        instrument is removed: it is never called again.
        """
        if inst.critical:
            fatal = InstrumentFailure(
                f"critical instrument {inst!r} failed in {hook}: {exc!r}", hook=hook
            )
            fatal.__cause__ = exc
            self._on_fatal(fatal)  # first: the scheduler stops starting effects
            log.error(
                "kernel.instrument_failed",
                instrument=repr(inst),
                hook=hook,
                error=repr(exc),
                fatal=True,
            )
        else:
            log.error(
                "kernel.instrument_disabled",
                instrument=repr(inst),
                hook=hook,
                error=repr(exc),
                exc_info=(type(exc), exc, exc.__traceback__),
            )
        self.remove(inst)

    def raised(self, hook: str, exc: Exception) -> None:
        """Apply :meth:`failed` to the instrument whose unguarded ``bare[hook]`` raised ``exc``.

        Raises:
            Exception: ``exc`` again when no single instrument owns ``hook``
                (a fan-out guards its hooks itself: it does not raise).
        """
        inst = self._bare_owner.get(hook)
        if inst is None:
            raise exc
        self.failed(inst, hook, exc)

    def _compile(self) -> None:
        for name in HOOKS:
            base = getattr(Instrument, name)
            fns = [
                (inst, getattr(inst, name))
                for inst in self.instruments
                if getattr(type(inst), name, base) is not base
            ]
            if not fns:
                self.hooks[name] = None
            elif len(fns) == 1:
                inst, fn = fns[0]
                self.hooks[name] = _GUARDS[_ARITY[name]](inst, name, fn, self.failed)
            else:
                self.hooks[name] = _fan_out(name, fns, self.failed)
            if name in self.bare:
                self._bare_owner.pop(name, None)
                if len(fns) == 1:
                    self._bare_owner[name], self.bare[name] = fns[0]
                else:
                    self.bare[name] = self.hooks[name]
        self._on_change()


# The guards: one per arity, so that the hot hooks (one or two arguments)
# pay one extra frame and no argument tuple.


def _guard0(inst: Instrument, name: str, fn: Hook, failed: _Failed) -> Hook:
    def guarded() -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - the failure policy decides
            failed(inst, name, exc)

    return guarded


def _guard1(inst: Instrument, name: str, fn: Hook, failed: _Failed) -> Hook:
    def guarded(a: Any) -> None:
        try:
            fn(a)
        except Exception as exc:  # noqa: BLE001 - the failure policy decides
            failed(inst, name, exc)

    return guarded


def _guard2(inst: Instrument, name: str, fn: Hook, failed: _Failed) -> Hook:
    def guarded(a: Any, b: Any) -> None:
        try:
            fn(a, b)
        except Exception as exc:  # noqa: BLE001 - the failure policy decides
            failed(inst, name, exc)

    return guarded


_GUARDS = (_guard0, _guard1, _guard2)


def _fan_out(name: str, fns: list[tuple[Instrument, Hook]], failed: _Failed) -> Hook:
    """One callable calling every hook in ``fns``, each guarded."""
    if len(fns) == 2:
        # The usual engine (watchdog + journal): no loop, no tuple unpacking.
        (inst1, fn1), (inst2, fn2) = fns

        def call_two(*args: Any) -> None:
            try:
                fn1(*args)
            except Exception as exc:  # noqa: BLE001 - the failure policy decides
                failed(inst1, name, exc)
            try:
                fn2(*args)
            except Exception as exc:  # noqa: BLE001 - the failure policy decides
                failed(inst2, name, exc)

        return call_two

    def call_all(*args: Any) -> None:
        for inst, fn in fns:
            try:
                fn(*args)
            except Exception as exc:  # noqa: BLE001 - the failure policy decides
                failed(inst, name, exc)

    return call_all
