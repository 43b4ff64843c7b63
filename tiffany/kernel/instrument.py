"""Instruments: read-only observer hooks on the scheduler (trio's design).

The journal, the activity log (PAL), metrics and the slow-dispatch watchdog
all attach here; the kernel imports none of them.

Cost: for each hook the scheduler keeps one callable, or ``None`` when no
attached instrument overrides that hook. The loop tests a local for ``None``
before calling, so with no instrument attached the hooks cost nothing, and
an instrument pays only for the hooks it defines.

Failure policy: an instrument whose hook raises is removed and the failure
is logged (trio). A *critical* instrument (``critical = True``: the journal)
stops the kernel instead: its failure is re-raised from ``Scheduler.run`` as
:class:`~tiffany.errors.InstrumentFailure` once the current dispatch ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from tiffany.kernel.calls import SystemCall
    from tiffany.kernel.task import Task

__all__ = ["HOOKS", "Instrument", "InstrumentSet"]

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
        """Call when ``Scheduler.run`` returns or raises."""

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


class InstrumentSet:
    """The attached instruments, compiled into one callable per hook.

    Args:
        on_failure: Called as ``on_failure(instrument, hook, error)`` when a
            hook raises inside a fan-out; the scheduler decides what to do.
    """

    def __init__(self, on_failure: Callable[[Instrument, str, BaseException], None]) -> None:
        self._on_failure = on_failure
        self.instruments: list[Instrument] = []
        self.hooks: dict[str, Hook | None] = dict.fromkeys(HOOKS)

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

    def owner(self, hook: Hook) -> Instrument | None:
        """Return the instrument a compiled single-instrument hook belongs to."""
        owner = getattr(hook, "__self__", None)
        return owner if isinstance(owner, Instrument) else None

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
                self.hooks[name] = fns[0][1]
            else:
                self.hooks[name] = self._fan_out(name, fns)

    def _fan_out(self, name: str, fns: list[tuple[Instrument, Hook]]) -> Hook:
        on_failure = self._on_failure
        if len(fns) == 2:
            # The usual engine (watchdog + journal): no loop, no tuple unpacking.
            (inst1, fn1), (inst2, fn2) = fns

            def call_two(*args: Any) -> None:
                try:
                    fn1(*args)
                except Exception as exc:  # noqa: BLE001 - reported, not swallowed
                    on_failure(inst1, name, exc)
                try:
                    fn2(*args)
                except Exception as exc:  # noqa: BLE001 - reported, not swallowed
                    on_failure(inst2, name, exc)

            return call_two

        def call_all(*args: Any) -> None:
            for inst, fn in fns:
                try:
                    fn(*args)
                except Exception as exc:  # noqa: BLE001 - reported, not swallowed
                    on_failure(inst, name, exc)

        return call_all
