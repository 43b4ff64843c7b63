"""One interface per cross-process concept, its implementation chosen once at start.

Two transports carry Tiffany between its processes: the embedded one (the
WAL's files, Unix sockets, SQLite) and PostgreSQL (journal rows,
LISTEN/NOTIFY, a PostgreSQL store). Each concept that crosses them has a
port here, a :class:`typing.Protocol` with one implementation for each,
picked from the settings when a process starts; everything above uses the
port and never asks which transport it runs on. ``feed``: where the API's
relay gets activity events; ``watermark``: read-your-writes, waiting until
the store holds a seq; ``reads``: the store reads the API does;
``commands``: the engine commands the API and the CLI send; ``journals``:
the engines' journals (files or streams) as the CLI, ``serve`` and the
engine's status and verifier read them.
"""
