"""The peers of ``bench/ring.py``: asyncio, uvloop, trio, curio and a bare loop.

Every implementation runs the same ring logic (the seed's ``gmain.go``)::

    for k in range(M):                 # rounds, in order, in every coroutine
        if k % period == i:            # the originator of round k (period = N)
            send(right, k)             #   starts the round
            msg = receive()            #   and waits for it to come back
        else:                          # everybody else relays
            msg = receive()
            send(right, msg)
        check msg == k                 # FIFO everywhere: the d-th message on
                                       # every edge is round d's token
    report M receives

A runner builds R rings of N coroutines (each with its own inbox), then
times the run until every coroutine has finished, and checks that
``N*R*M`` messages were received (:func:`check`). A wrong implementation
raises (a bad token, a short count, a task error); none returns a figure.

Garbage collection: collected before, disabled from the build to the end of
the timed part (:func:`gc_off`), for every implementation alike.
"""

from __future__ import annotations

import asyncio
import gc
import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class RingError(AssertionError):
    """A ring implementation lost, duplicated or reordered a message."""


@contextmanager
def gc_off() -> Iterator[None]:
    """Collect, then keep the cyclic collector off until the block ends."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def check(out: list[int], r: int, n: int, m: int, impl: str, extra: str = "") -> None:
    """Fail loudly unless all ``n*r`` coroutines finished ``m`` receives each."""
    total = sum(out)
    if len(out) != n * r or total != n * r * m:
        raise RingError(
            f"{impl}: ring delivered {total} messages from {len(out)} coroutines, "
            f"expected {n * r * m} from {n * r} (N={n} R={r} M={m}){extra}"
        )


def bad_token(impl: str, i: int, k: int, msg: Any) -> RingError:
    return RingError(f"{impl}: coroutine {i} got {msg!r} in round {k}, expected {k}")


# -- asyncio and uvloop --------------------------------------------------------------


async def _aio_node(
    i: int,
    m: int,
    period: int,
    inbox: asyncio.Queue[int],
    outbox: asyncio.Queue[int],
    out: list[int],
) -> None:
    get, put = inbox.get, outbox.put_nowait
    for k in range(m):
        if k % period == i:
            put(k)
            msg = await get()
        else:
            msg = await get()
            put(msg)
        if msg != k:
            raise bad_token("asyncio", i, k, msg)
    out.append(m)


def _arun(main: Callable[[], Any], use_uvloop: bool) -> Any:
    if use_uvloop:
        import uvloop

        return uvloop.run(main())
    return asyncio.run(main())


def ring_asyncio(r: int, n: int, m: int, period: int, use_uvloop: bool = False) -> float:
    async def main() -> float:
        out: list[int] = []
        tasks = []
        for _ in range(r):
            qs: list[asyncio.Queue[int]] = [asyncio.Queue() for _ in range(n)]
            for i in range(n):
                tasks.append(
                    asyncio.ensure_future(_aio_node(i, m, period, qs[i], qs[(i + 1) % n], out))
                )
        t0 = time.perf_counter()
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - t0
        check(out, r, n, m, "uvloop" if use_uvloop else "asyncio")
        return elapsed

    with gc_off():
        return _arun(main, use_uvloop)  # type: ignore[no-any-return]


def ring_uvloop(r: int, n: int, m: int, period: int) -> float:
    return ring_asyncio(r, n, m, period, use_uvloop=True)


# -- trio ------------------------------------------------------------------------------------


def ring_trio(r: int, n: int, m: int, period: int) -> float:
    import trio

    async def node(i: int, recv: Any, send: Any, out: list[int]) -> None:
        get, put = recv.receive, send.send_nowait
        for k in range(m):
            if k % period == i:
                put(k)
                msg = await get()
            else:
                msg = await get()
                put(msg)
            if msg != k:
                raise bad_token("trio", i, k, msg)
        out.append(m)

    async def main() -> float:
        out: list[int] = []
        async with trio.open_nursery() as nursery:
            for _ in range(r):
                # chans[i] = (send end, receive end) of coroutine i's inbox
                chans: list[Any] = [trio.open_memory_channel(math.inf) for _ in range(n)]
                for i in range(n):
                    nursery.start_soon(node, i, chans[i][1], chans[(i + 1) % n][0], out)
            # start_soon only schedules: nothing has run yet
            t0 = time.perf_counter()
        elapsed = time.perf_counter() - t0
        check(out, r, n, m, "trio")
        return elapsed

    with gc_off():
        return trio.run(main)


# -- curio ----------------------------------------------------------------------------------


def ring_curio(r: int, n: int, m: int, period: int) -> float:
    import curio

    async def node(i: int, inbox: Any, outbox: Any, out: list[int]) -> None:
        get, put = inbox.get, outbox.put
        for k in range(m):
            if k % period == i:
                await put(k)
                msg = await get()
            else:
                msg = await get()
                await put(msg)
            if msg != k:
                raise bad_token("curio", i, k, msg)
        out.append(m)

    async def main() -> float:
        out: list[int] = []
        tasks = []
        for _ in range(r):
            qs = [curio.Queue() for _ in range(n)]
            for i in range(n):
                tasks.append(await curio.spawn(node, i, qs[i], qs[(i + 1) % n], out))
        t0 = time.perf_counter()
        for t in tasks:
            await t.join()
        elapsed = time.perf_counter() - t0
        check(out, r, n, m, "curio")
        return elapsed

    with gc_off():
        return curio.run(main)  # type: ignore[no-any-return]


# -- the bare generator loop: the floor of pure Python ------------------------------------
#
# A coroutine is a generator; its mailbox is a two-slot list [items, parked]
# (items: a deque made on first use; parked: the generator waiting on the
# mailbox, or None). To receive, a coroutine yields its mailbox; the loop
# resumes it at once if an item is there, else parks it in the mailbox. To
# send, ``put`` hands the item to the parked generator (it goes to the back
# of the ready deque with the item, which the loop sends into it) or buffers
# it. Nothing else: no task objects, states, ids, errors or instruments.


def _bare_put(box: list[Any], ready_append: Callable[[Any], None], msg: Any) -> None:
    g = box[1]
    if g is not None:
        box[1] = None
        ready_append((g, msg))
    elif box[0] is None:
        box[0] = deque((msg,))
    else:
        box[0].append(msg)


def _bare_loop(ready: deque[tuple[Any, Any]]) -> None:
    popleft = ready.popleft
    while ready:
        g, v = popleft()
        try:
            while True:
                box = g.send(v)
                items = box[0]
                if items:
                    v = items.popleft()  # an item is there: resume at once
                else:
                    box[1] = g  # park
                    break
        except StopIteration:
            pass


def ring_bare(r: int, n: int, m: int, period: int) -> float:
    def node(i: int, inbox: list[Any], outbox: list[Any], out: list[int]) -> Any:
        for k in range(m):
            if k % period == i:
                put(outbox, append, k)
                msg = yield inbox
            else:
                msg = yield inbox
                put(outbox, append, msg)
            if msg != k:
                raise bad_token("bare", i, k, msg)
        out.append(m)

    put = _bare_put
    with gc_off():
        ready: deque[tuple[Any, Any]] = deque()
        append = ready.append
        out: list[int] = []
        for _ in range(r):
            boxes: list[list[Any]] = [[None, None] for _ in range(n)]
            for i in range(n):
                append((node(i, boxes[i], boxes[(i + 1) % n], out), None))
        t0 = time.perf_counter()
        _bare_loop(ready)
        elapsed = time.perf_counter() - t0
    check(out, r, n, m, "bare")
    return elapsed


# -- cooperative yields: T tasks x K yields -----------------------------------------------


def yields_asyncio(tasks: int, count: int, use_uvloop: bool = False) -> float:
    async def spin() -> None:
        for _ in range(count):
            await asyncio.sleep(0)

    async def main() -> float:
        ts = [asyncio.ensure_future(spin()) for _ in range(tasks)]
        t0 = time.perf_counter()
        await asyncio.gather(*ts)
        return time.perf_counter() - t0

    with gc_off():
        return _arun(main, use_uvloop)  # type: ignore[no-any-return]


def yields_uvloop(tasks: int, count: int) -> float:
    return yields_asyncio(tasks, count, use_uvloop=True)


def yields_trio(tasks: int, count: int) -> float:
    import trio

    async def spin() -> None:
        for _ in range(count):
            await trio.lowlevel.checkpoint()

    async def main() -> float:
        async with trio.open_nursery() as nursery:
            for _ in range(tasks):
                nursery.start_soon(spin)
            t0 = time.perf_counter()
        return time.perf_counter() - t0

    with gc_off():
        return trio.run(main)


def yields_curio(tasks: int, count: int) -> float:
    import curio

    async def spin() -> None:
        for _ in range(count):
            await curio.sleep(0)

    async def main() -> float:
        ts = [await curio.spawn(spin) for _ in range(tasks)]
        t0 = time.perf_counter()
        for t in ts:
            await t.join()
        return time.perf_counter() - t0

    with gc_off():
        return curio.run(main)  # type: ignore[no-any-return]


def yields_bare(tasks: int, count: int) -> float:
    def spin() -> Any:
        for _ in range(count):
            yield

    with gc_off():
        ready = deque(spin() for _ in range(tasks))
        popleft, append = ready.popleft, ready.append
        t0 = time.perf_counter()
        while ready:
            g = popleft()
            try:
                next(g)
            except StopIteration:
                continue
            append(g)
        return time.perf_counter() - t0


# -- memory of a parked task (each function runs in its own subprocess) --------------------
#
# ``measure()`` returns the bytes tracemalloc counts (after a gc.collect())
# at the moment it is called; ``base`` is the count before anything of the
# implementation's was built. Everything the tasks own is included: frame,
# task object, its queue, the scheduler's bookkeeping per task.


def memory_asyncio(n: int, measure: Callable[[], int]) -> int:
    async def waiter(q: asyncio.Queue[int]) -> None:
        await q.get()

    async def main() -> int:
        tasks = [asyncio.ensure_future(waiter(asyncio.Queue())) for _ in range(n)]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        if any(t.done() for t in tasks):
            raise RingError("asyncio: a waiter finished")
        return measure()

    return asyncio.run(main())


def memory_trio(n: int, measure: Callable[[], int]) -> int:
    import trio
    import trio.testing

    async def waiter(recv: Any) -> None:
        await recv.receive()

    async def main() -> int:
        keep = []
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                send, recv = trio.open_memory_channel(math.inf)
                keep.append(send)  # the task's queue: both ends alive
                nursery.start_soon(waiter, recv)
            await trio.testing.wait_all_tasks_blocked()
            used = measure()
            nursery.cancel_scope.cancel()
        return used

    return trio.run(main)


def memory_curio(n: int, measure: Callable[[], int]) -> int:
    import curio

    async def waiter(q: Any) -> None:
        await q.get()

    async def main() -> int:
        for _ in range(n):
            await curio.spawn(waiter, curio.Queue(), daemon=True)
        for _ in range(3):
            await curio.sleep(0)
        return measure()

    return curio.run(main)  # type: ignore[no-any-return]


def memory_bare(n: int, measure: Callable[[], int]) -> int:
    def waiter(box: list[Any]) -> Any:
        yield box

    parked: dict[int, list[Any]] = {}  # the loop's registry: id -> mailbox
    for i in range(n):
        box: list[Any] = [None, None]
        g = waiter(box)
        box[1] = g  # started and parked on its (empty) mailbox
        g.send(None)
        parked[i] = box
    return measure()


MEMORY: dict[str, Callable[[int, Callable[[], int]], int]] = {
    "asyncio": memory_asyncio,
    "trio": memory_trio,
    "curio": memory_curio,
    "bare": memory_bare,
}
