"""Synchronisation on the kernel: :class:`Event` and :class:`Queue`.

Modelled on curio's ``sync.py``/``queue.py``, built on the scheduler's own
park/wake machinery. Only the operations that may block are system calls
(``yield ev.wait()``, ``yield q.get()``); ``Event.set`` and ``Queue.put`` are
plain method calls that wake a parked task directly, which halves the trips
through the loop per message.

This module owns the primitives' state: their system calls' handlers
(:func:`queue_get`, :func:`event_wait`) and unparkers (what a kill does to a
task parked on them) live here, and the scheduler reaches them through its
handler and unparker tables.

Discussion: each primitive binds to the scheduler of the first task that
parks on it, and the call objects it hands out are created once and reused:
a ``yield q.get()`` allocates nothing. Waiter lists and the item buffer are
created lazily so an idle queue costs little memory.

Discussion: two paths stay inlined across this module's edge, because each
runs once per message: :meth:`Queue.put` hands an item to a parked getter
the way ``Scheduler.wake`` would (its ready queue and ``task_woken`` hook),
and the scheduler's loop completes ``yield q.get()`` itself, reading
``_items``, ``_getters`` and ``_sched`` (``Scheduler._loop``): a Python
call on either path is a large share of what a message costs (``bench/ring.py``
measures it). Anything else goes through the functions here.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from tiffany.errors import KernelError, QueueEmpty, QueueFull
from tiffany.kernel.calls import SystemCall
from tiffany.kernel.task import TaskState

if TYPE_CHECKING:
    from tiffany.kernel.scheduler import Scheduler
    from tiffany.kernel.task import Task

__all__ = [
    "Event",
    "EventWait",
    "Queue",
    "QueueGet",
    "event_wait",
    "queue_get",
    "unpark_event_wait",
    "unpark_queue_get",
]

T = TypeVar("T")

_READY = TaskState.READY


class QueueGet(SystemCall):
    """Block until the queue has an item; return it (``yield q.get()``)."""

    __slots__ = ("queue",)
    kind = "queue_get"

    def __init__(self, queue: Queue[Any]) -> None:
        self.queue = queue

    def fields(self) -> dict[str, Any]:
        """Return the queue's identity (stable within a run)."""
        return {"queue": self.queue.name}


class EventWait(SystemCall):
    """Block until the event is set (``yield ev.wait()``)."""

    __slots__ = ("event",)
    kind = "event_wait"

    def __init__(self, event: Event) -> None:
        self.event = event

    def fields(self) -> dict[str, Any]:
        """Return the event's identity."""
        return {"event": self.event.name}


def _bind(primitive: Queue[Any] | Event, sched: Scheduler) -> None:
    bound = primitive._sched
    if bound is None:
        primitive._sched = sched
    elif bound is not sched:
        raise KernelError(f"{primitive!r} is used by two schedulers", primitive=primitive.name)


class Queue(Generic[T]):
    """A FIFO queue for tasks: ``yield q.get()`` blocks, ``q.put(x)`` does not.

    Args:
        maxsize: When > 0, ``put`` raises :class:`~tiffany.errors.QueueFull`
            instead of buffering more than ``maxsize`` items.
        name: A label for the activity log and the dashboard.
    """

    __slots__ = ("_get_call", "_getters", "_items", "_sched", "maxsize", "name")

    def __init__(self, maxsize: int = 0, name: str | None = None) -> None:
        self.maxsize = maxsize
        self.name = name or f"queue@{id(self):x}"
        self._items: deque[T] | None = None
        self._getters: list[Task] | None = None
        self._sched: Scheduler | None = None
        self._get_call = QueueGet(self)

    def get(self) -> QueueGet:
        """Return the system call to yield: ``item = yield q.get()``."""
        return self._get_call

    def put(self, item: T) -> None:
        """Hand ``item`` to the first parked getter, or buffer it. Never blocks."""
        getters = self._getters
        if getters:
            # Inlined ``Scheduler.wake`` (the messaging hot path).
            task = getters.pop(0)
            sched = self._sched
            assert sched is not None
            task._send = item
            task.state = _READY
            sched._ready.append(task)
            on_wake = sched._on_wake
            if on_wake is not None:
                on_wake(task, item)
            # ``blocked_on`` stays set until the task runs: if it is killed
            # first, the scheduler gives the item back (nothing is lost).
            return
        items = self._items
        if items is None:
            items = self._items = deque()
        elif self.maxsize and len(items) >= self.maxsize:
            raise QueueFull(f"queue {self.name} is full", queue=self.name, maxsize=self.maxsize)
        items.append(item)

    put_nowait = put

    def get_nowait(self) -> T:
        """Return the next item without blocking, or raise QueueEmpty."""
        if not self._items:
            raise QueueEmpty(f"queue {self.name} is empty", queue=self.name)
        return self._items.popleft()

    def empty(self) -> bool:
        """True when no item is buffered."""
        return not self._items

    def __len__(self) -> int:
        return len(self._items) if self._items else 0

    @property
    def waiting(self) -> int:
        """How many tasks are parked in ``get``."""
        return len(self._getters) if self._getters else 0

    def __repr__(self) -> str:
        return f"<Queue {self.name} items={len(self)} getters={self.waiting}>"


class Event:
    """A flag tasks can wait on: ``yield ev.wait()`` blocks until ``ev.set()``.

    Args:
        name: A label for the activity log and the dashboard.
    """

    __slots__ = ("_sched", "_set", "_wait_call", "_waiters", "name")

    def __init__(self, name: str | None = None) -> None:
        self.name = name or f"event@{id(self):x}"
        self._set = False
        self._waiters: list[Task] | None = None
        self._sched: Scheduler | None = None
        self._wait_call = EventWait(self)

    def wait(self) -> EventWait:
        """Return the system call to yield: ``yield ev.wait()``."""
        return self._wait_call

    def set(self) -> None:
        """Set the flag and wake every waiter (in the order they parked)."""
        self._set = True
        waiters = self._waiters
        if waiters:
            self._waiters = None
            sched = self._sched
            assert sched is not None
            for task in waiters:
                sched.wake(task, True)

    def clear(self) -> None:
        """Reset the flag; later waiters block again."""
        self._set = False

    def is_set(self) -> bool:
        """True when the flag is set."""
        return self._set

    def __repr__(self) -> str:
        return f"<Event {self.name} set={self._set}>"


# -- the kernel's side: handlers and unparkers ----------------------------------


def queue_get(sched: Scheduler, task: Task, call: QueueGet) -> Any:
    """Handle ``yield q.get()``: the next item, or park ``task`` until a put."""
    q = call.queue
    items = q._items
    if items:
        return items.popleft()
    if q._sched is not sched:
        try:
            _bind(q, sched)
        except KernelError as exc:
            task._throw = exc
            return None
    if q._getters is None:
        q._getters = [task]
    else:
        q._getters.append(task)
    return sched.park(task, call, TaskState.BLOCKED_SYNC)


def unpark_queue_get(sched: Scheduler, task: Task, call: QueueGet) -> None:
    """Take a killed ``task`` off the queue, giving back an item it never received.

    Discussion: :meth:`Queue.put` hands an item straight to a parked getter
    and leaves ``blocked_on`` set until that getter runs; a kill in between
    (the task is READY) would otherwise lose the item. It goes to the next
    getter, or back to the front of the queue.
    """
    q = call.queue
    if task.state is _READY:
        item, task._send = task._send, None
        if q._getters:
            q.put(item)
        else:
            if q._items is None:
                q._items = deque()
            q._items.appendleft(item)
    elif q._getters and task in q._getters:
        q._getters.remove(task)


def event_wait(sched: Scheduler, task: Task, call: EventWait) -> Any:
    """Handle ``yield ev.wait()``: True at once if set, else park ``task``."""
    ev = call.event
    if ev._set:
        return True
    if ev._sched is not sched:
        try:
            _bind(ev, sched)
        except KernelError as exc:
            task._throw = exc
            return None
    if ev._waiters is None:
        ev._waiters = [task]
    else:
        ev._waiters.append(task)
    return sched.park(task, call, TaskState.BLOCKED_SYNC)


def unpark_event_wait(sched: Scheduler, task: Task, call: EventWait) -> None:
    """Take a killed ``task`` off the event's waiters."""
    waiters = call.event._waiters
    if waiters and task in waiters:
        waiters.remove(task)
