"""The SQL store: a projection of the journal that the API reads.

Public API::

    from tiffany.projector import Projector
    from tiffany.store import make_engine, queries, session_factory

    engine = make_engine(settings.database_url)
    projector = Projector(engine)              # the projector process
    projector.apply([(seq, rtype, run_no, fields), ...])
    with session_factory(engine)() as session:
        runs = queries.list_runs(session, status="running", limit=20)

The projector (``tiffany.projector``) writes it. The store imports nothing
above ``errors`` and ``config``: records arrive decoded from the engine.
"""

from tiffany.store import queries
from tiffany.store.models import (
    Base,
    DeadLetter,
    JournalRecord,
    ProjectorState,
    Run,
    RunStatus,
    Step,
    StepStatus,
    Task,
)
from tiffany.store.session import make_engine, make_reader_engine, session_factory
from tiffany.wire.records import RecordType

__all__ = [
    "Base",
    "DeadLetter",
    "JournalRecord",
    "ProjectorState",
    "RecordType",
    "Run",
    "RunStatus",
    "Step",
    "StepStatus",
    "Task",
    "make_engine",
    "make_reader_engine",
    "queries",
    "session_factory",
]
