"""Soak: minutes of mixed load on ``tiffany serve`` under kill -9, SIGTERM restarts and SIGSTOP.

    python bench/soak.py                                  # 10 minutes, file WAL
    python bench/soak.py --minutes 3 --journal postgres   # two servers, one stream

Not a test (nothing asserts; it prints, and exits 0). The harness is
``tests/fault/soak_harness.py`` (``test_soak_short.py`` runs it for a
minute and asserts): plans, signals, sub-plans, schedules and agent steps
calling a mock model on 127.0.0.1, with a kill -9 of a random process of
the serve group every ``--crash-every`` s, a SIGTERM restart every
``--sigterm-every`` s, and on PostgreSQL one SIGSTOP of the driving engine
past its lease. At the end every finished run is replay-verified, and one
table says what was lost, duplicated or does not verify (bench/README.md
explains each row).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "fault"))

from soak_harness import Soak, SoakConfig, nonzero, table
from soak_nodes import TARGETS, pg_schema


def _rss_table(samples: list[tuple[float, str, dict[str, int]]]) -> str:
    roles = ("engine", "api", "projector", "serve")
    lines = [f"{'t (s)':>7} {'node':>5} " + " ".join(f"{r + ' MB':>12}" for r in roles)]
    for t, node, kb in samples:
        cells = [f"{kb[r] / 1024:.0f}" if kb.get(r) else "-" for r in roles]  # "-": restarting
        lines.append(f"{t:7.0f} {node:>5} " + " ".join(f"{c:>12}" for c in cells))
    return "\n".join(lines)


def main() -> int:
    d = SoakConfig()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=d.minutes, help="the load phase")
    ap.add_argument("--journal", choices=("file", "postgres"), default=d.journal)
    ap.add_argument("--pg-url", default=d.pg_url, help="a private schema is made in it")
    ap.add_argument("--in-flight", type=int, default=d.in_flight)
    ap.add_argument("--crash-every", type=float, default=d.crash_every, help="s (0: none)")
    ap.add_argument("--sigterm-every", type=float, default=d.sigterm_every, help="s (0: none)")
    ap.add_argument("--sigstop-at", type=float, default=d.sigstop_at, help="fraction; <0: none")
    ap.add_argument("--lease", type=float, default=d.lease_s, help="PostgreSQL lease (s)")
    ap.add_argument("--targets", default=",".join(TARGETS), help="what a kill -9 may hit")
    ap.add_argument("--subscribers", type=int, default=d.subscribers)
    ap.add_argument("--no-schedules", action="store_true")
    ap.add_argument("--sample", type=float, default=d.sample_s, help="RSS sample period (s)")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--finish-timeout", type=float, default=d.finish_timeout_s)
    ap.add_argument("--verify-workers", type=int, default=d.verify_workers)
    ap.add_argument("--json", action="store_true", help="print the summary as JSON too")
    ap.add_argument("--keep", action="store_true", help="keep the soak's directory")
    args = ap.parse_args()
    config = SoakConfig(
        minutes=args.minutes,
        journal=args.journal,
        pg_url=args.pg_url,
        in_flight=args.in_flight,
        crash_every=args.crash_every,
        sigterm_every=args.sigterm_every,
        sigstop_at=args.sigstop_at,
        lease_s=args.lease,
        subscribers=args.subscribers,
        schedules=not args.no_schedules,
        sample_s=args.sample,
        seed=args.seed,
        finish_timeout_s=args.finish_timeout,
        verify_workers=args.verify_workers,
        targets=tuple(t for t in args.targets.split(",") if t),
    )
    base = Path(tempfile.mkdtemp(prefix="tiffany-soak-"))
    try:
        if config.journal == "postgres":
            with pg_schema(config.pg_url) as url:
                summary = Soak(config, base, url).run()
        else:
            summary = Soak(config, base).run()
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print("RSS over time (the processes restart at each fault)")
    print(_rss_table(summary.pop("rss_samples")))
    print()
    print(table(summary))
    print("\nengine stops (t: s into the load; seq: the last one it wrote; after: effects it")
    print("started after it was told to stop)")
    print(f"{'kind':>10} {'pid':>8} {'t':>8} {'seq':>8} {'effects':>8} {'after':>6}")
    for row in summary["stops"]:
        print(
            f"{row['kind']:>10} {row['pid']:>8} {row['t_cut']:>8.1f} {row['seq']!s:>8} "
            f"{row['effects']:>8} {row['after_cut']:>6}"
        )
    print(
        f"phases (s): {summary['phases_s']}; serve's API stopped in {summary['sigterm_api_stop_s']}"
    )
    bad = nonzero(summary)
    print(f"\nnon-zero counts that must be 0: {bad or 'none'}")
    if bad:
        print(json.dumps(summary["problems"], indent=1, default=str)[:6000])
    if args.json:
        print(json.dumps(summary, indent=1, default=str))
    if args.keep:
        print(f"soak directory kept: {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
