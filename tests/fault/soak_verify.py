"""Replay-verify a list of runs of a stopped journal: ``python soak_verify.py DATA_DIR IDS_JSON``.

The soak's verifier process (``soak_harness.Soak._verify`` starts a few):
the journal is the one ``TIFFANY_*`` names for ``DATA_DIR`` (a WAL or a
PostgreSQL stream, ``journal_source``), the runs those listed in the JSON
file. Runs are read :data:`BATCH` at a time in one pass each
(``load_many``; reading one run is a pass over the log from its start) and
verified as ``tiffany replay RUN --verify`` does (``verify_loaded``).
Prints one JSON line: ``{run id: what is wrong}`` for the runs that do not
verify.
"""

from __future__ import annotations

import json
import sys
from typing import Any

#: Runs read in one pass over the journal.
BATCH = 500


def main(data_dir: str, ids_file: str) -> dict[str, Any]:
    from tiffany.config import Settings
    from tiffany.durable.history import load_many
    from tiffany.durable.runtime import verify_loaded
    from tiffany.engine import journal_source, replay_resolvers

    settings = Settings(data_dir=data_dir)
    log, resolvers = journal_source(settings), replay_resolvers(settings)
    with open(ids_file) as f:
        ids = json.load(f)
    bad: dict[str, Any] = {}
    for i in range(0, len(ids), BATCH):
        batch = ids[i : i + BATCH]
        index, cursors = load_many(log, set(batch))
        for run_id in batch:
            try:
                report = verify_loaded(index.get(run_id), cursors[run_id], resolvers)
            except Exception as exc:
                bad[run_id] = {"error": repr(exc)}
                continue
            if not report.ok:
                bad[run_id] = {"problems": report.problems, "divergence": report.divergence}
    return bad


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
