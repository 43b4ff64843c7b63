"""The kernel demo (``tiffany demo``): compute and I/O interleaved on one thread.

Three kinds of task share the scheduler, as in the seed documents:

* a compute task that works in chunks and yields between them,
* an echo server on 127.0.0.1 that spawns a handler task per connection,
* client tasks that talk to the server and sleep between messages,

while the slow-dispatch watchdog times every dispatch. The demo prints a
timeline of what ran, then a summary table.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any

from rich.console import Console
from rich.table import Table

from tiffany.io import accept, connect, listen, recv, send_all
from tiffany.kernel import (
    GetTid,
    Instrument,
    KillTask,
    NewTask,
    Now,
    Scheduler,
    Sleep,
    SlowDispatchWatchdog,
    Task,
    WaitTask,
)

__all__ = ["main"]

Co = Generator[Any, Any, Any]


class _Counter(Instrument):
    """Count dispatches and blocks per task name (what the summary shows)."""

    def __init__(self) -> None:
        self.dispatches: dict[str, int] = {}
        self.blocks: dict[str, dict[str, int]] = {}

    def before_dispatch(self, task: Task) -> None:
        key = task.name.split("#")[0]
        self.dispatches[key] = self.dispatches.get(key, 0) + 1

    def task_blocked(self, task: Task, call: Any) -> None:
        per = self.blocks.setdefault(task.name.split("#")[0], {})
        per[call.kind] = per.get(call.kind, 0) + 1


def _compute(console: Console, chunks: int) -> Co:
    """Sum squares in chunks, yielding between chunks so I/O keeps flowing."""
    total = 0
    for chunk in range(chunks):
        total += sum(i * i for i in range(chunk * 20_000, (chunk + 1) * 20_000))
        if chunk % 10 == 0:
            t = yield Now()
            console.print(f"[cyan]compute[/]  chunk {chunk:3d}/{chunks} at {t % 100:7.3f}")
        yield  # let the others run
    return total


def _handle(client: Any) -> Co:
    try:
        while True:
            data = yield recv(client, 4096)
            if not data:
                return
            yield send_all(client, data.upper())
    finally:
        client.close()


def _server(listener: Any) -> Co:
    while True:
        client, _addr = yield accept(listener)
        yield NewTask(_handle(client), name="handler", daemon=True)


def _client(console: Console, port: int, n: int) -> Co:
    me = yield GetTid()
    sock = yield connect(("127.0.0.1", port))
    try:
        for i in range(n):
            msg = f"hello {i} from client {me}".encode()
            yield send_all(sock, msg)
            reply = b""
            while len(reply) < len(msg):
                reply += yield recv(sock, 4096)
            if i == n - 1:
                console.print(f"[green]client {me}[/] got {reply.decode()!r}")
            yield Sleep(0.01)
    finally:
        sock.close()
    return n


def _main_task(console: Console, clients: int, messages: int) -> Co:
    listener = listen("127.0.0.1", 0)
    port = listener.getsockname()[1]
    console.print(f"echo server on 127.0.0.1:{port}; {clients} clients, compute in chunks")
    server = yield NewTask(_server(listener), name="server")
    compute = yield NewTask(_compute(console, 60), name="compute")
    tids = []
    for _ in range(clients):
        tids.append((yield NewTask(_client(console, port, messages), name="client")))
    echoed = 0
    for tid in tids:
        echoed += yield WaitTask(tid)
    total = yield WaitTask(compute)
    yield KillTask(server)
    listener.close()
    return echoed, total


def main(clients: int = 20, messages: int = 10) -> int:
    """Run the demo; return a process exit code."""
    console = Console()
    counter = _Counter()
    watchdog = SlowDispatchWatchdog()
    started = time.perf_counter()
    with Scheduler(instruments=[counter, watchdog]) as sched:
        tid = sched.spawn(_main_task(console, clients, messages), name="main")
        sched.run()
        echoed, total = sched.result(tid)
    elapsed = time.perf_counter() - started
    table = Table(title="What shared the one thread")
    table.add_column("task")
    table.add_column("dispatches", justify="right")
    table.add_column("blocked on", justify="left")
    for name, count in sorted(counter.dispatches.items()):
        blocks = ", ".join(f"{k} x{v}" for k, v in sorted(counter.blocks.get(name, {}).items()))
        table.add_row(name, str(count), blocks)
    console.print(table)
    console.print(
        f"{echoed} messages echoed, compute result {total}, {elapsed:.2f} s; "
        f"longest dispatch {watchdog.longest_s * 1000:.1f} ms, {watchdog.stalls} stalls over "
        f"{watchdog.threshold_s * 1000:.0f} ms"
    )
    return 0 if echoed == clients * messages else 1
