"""The SQL store: a projection of the journal that the API reads.

Public API::

    from tiffany.store import Projector, make_engine, queries, session_factory

    engine = make_engine(settings.database_url)
    projector = Projector(engine)              # the projector process
    projector.apply([(seq, rtype, run_no, fields), ...])
    with session_factory(engine)() as session:
        runs = queries.list_runs(session, status="running", limit=20)

The store imports nothing above ``errors`` and ``config``: records arrive
decoded from the engine, and ``tiffany db rebuild`` reads the WAL for it.
"""

from tiffany.records import RecordType
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
from tiffany.store.projector import ApplyReport, Projector
from tiffany.store.session import make_engine, make_reader_engine, session_factory

__all__ = [
    "ApplyReport",
    "Base",
    "DeadLetter",
    "JournalRecord",
    "Projector",
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
