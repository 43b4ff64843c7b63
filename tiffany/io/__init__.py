"""Non-blocking I/O for kernel tasks: sockets, pipes and subprocesses.

Every helper here is a coroutine to call with ``yield`` (trampolining)::

    client, addr = yield accept(listener)
    data = yield recv(client, 65536)
    yield send_all(client, data)

They try the operation first and park on ``ReadWait``/``WriteWait`` only
when it would block, so a ready socket costs no trip through the loop.
"""

from tiffany.io.process import Process, spawn_process
from tiffany.io.sockets import accept, connect, listen, recv, send_all

__all__ = [
    "Process",
    "accept",
    "connect",
    "listen",
    "recv",
    "send_all",
    "spawn_process",
]
