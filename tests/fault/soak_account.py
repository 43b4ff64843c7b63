"""The soak's books: what the journal holds, and which effects ran more often than they may.

Two readers and one rule, shared by ``bench/soak.py`` and
``tests/fault/test_soak_short.py`` (through ``soak_harness.py``):

* :func:`read_journal` reads a stopped journal (a WAL directory or a
  PostgreSQL stream) once, cold, and keeps what the books need: every run
  (id, name, tag, status, outputs, the schedule tick that started it), the
  seq at which each effect step's result became durable, and the signals
  journaled (name, payload, id).
* :func:`classify` decides, for every effect step, whether it ran more often
  than the stops of the engines that ran it allow.

The rule (:func:`classify`). An effect line says which step ran, in which
process (the engine's pid: ``python`` steps run in its thread pool) and when
(``CLOCK_MONOTONIC``). Each engine process stops at most once (a kill -9, a
SIGTERM, or a fence: its journal stream taken over while it was stopped),
and the harness notes for it a :class:`Stop`: the kind, the moment from
which the engine had been told to stop (``t_cut``), and the journal's last
seq that engine wrote (``seq``). An execution of a step is then:

* ``in flight``: it started before its engine's ``t_cut``, and the step's
  result was not durable by the stop's ``seq``. Its result was lost with
  the engine; the step may run once more (at-least-once).
* ``after``: it started after its engine's ``t_cut`` (a queued job run by a
  stopping engine, or by a fenced one). Never allowed: whatever it did is
  done again by the next engine.
* ``done``: it started before ``t_cut`` and its result was durable at the
  stop: nothing of it may run again.
* ``alive``: its engine never stopped under it.

A step that ran ``n`` times has ``n - 1`` re-runs; each ``in flight``
execution allows one. What is left is duplicated, charged to the kind of the
stop of an ``after`` execution first, then of a ``done`` one, else to
``none`` (a re-run that no stop explains). Counting, not ordering: with two
engines (the PostgreSQL journal) the executions of one step interleave
across processes, and the count does not depend on that order.

Discussion: the pid names the engine, not the serve instance, because a
serve restarts its engine alone after a kill -9 of it, and on the
PostgreSQL journal a step may run in either instance's engine.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The kinds of stop (and the causes duplicates are charged to).
KILL9, SIGTERM, FENCE, UNPLANNED, NONE = "kill -9", "SIGTERM", "fence", "unplanned", "none"
CAUSES = (KILL9, SIGTERM, FENCE, UNPLANNED, NONE)
#: After SIGCONT, how soon a worker caught between the lease gate and its
#: effect by the SIGSTOP starts the effect, at most (s; generous: a loaded host).
RESUME_S = 0.5
#: The engine's pool threads: workers that can be caught so at once.
POOL = 8


@dataclass(frozen=True)
class Execution:
    """One line of ``effects.log``: ``step`` of the run ``tag`` started in ``pid`` at ``t``."""

    tag: str
    step: str
    pid: int
    t: float


@dataclass(frozen=True)
class Stop:
    """How engine process ``pid`` stopped.

    Attributes:
        kind: :data:`KILL9`, :data:`SIGTERM`, :data:`FENCE` or :data:`UNPLANNED`.
        pid: The engine's pid.
        t_cut: ``CLOCK_MONOTONIC`` s from which the engine had been told to
            stop: an execution it started later is ``after``.
        seq: The last journal seq that engine wrote (None: unknown, every
            result counts as not durable).
        t_resume: For a SIGSTOP (:data:`FENCE`): when the harness was about
            to send SIGCONT. An execution the engine started within
            :data:`RESUME_S` of it, of a step it had not started before,
            counts as in flight at the stop (at most :data:`POOL` of them).
            A worker that asked the lease gate before the SIGSTOP landed
            goes on into the step once continued: a check-then-act window
            no check in the engine closes (only a fencing token at the
            effect's destination would). A gate that let a job start after
            the lease was lost would show as later executions, or more.
    """

    kind: str
    pid: int
    t_cut: float
    seq: int | None
    t_resume: float | None = None


def read_executions(eff: Path) -> list[Execution]:
    """Every line of ``<eff>/effects.log``, in order (``fault_tools.effect`` writes them)."""
    path = eff / "effects.log"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        tag, step, pid, t = line.split()
        out.append(Execution(tag, step, int(pid), float(t)))
    return out


@dataclass
class Verdict:
    """What :func:`classify` found.

    Attributes:
        executions: Effect lines of known runs.
        in_flight_reruns: Re-runs allowed by an execution in flight at a stop.
        duplicated: Re-runs beyond those, by cause (:data:`CAUSES`).
        after_cut: Executions that started after their engine's ``t_cut``, by kind.
        problems: The first few duplicated steps, described.
    """

    executions: int = 0
    in_flight_reruns: int = 0
    duplicated: Counter[str] = field(default_factory=Counter)
    after_cut: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)


def classify(
    executions: Iterable[Execution],
    tag_run: Mapping[str, str],
    durable_at: Mapping[tuple[str, str], int],
    stops: Mapping[int, Stop],
    max_problems: int = 20,
) -> Verdict:
    """Charge every re-run of an effect step to a stop, or count it duplicated (module doc).

    Args:
        executions: The effect lines.
        tag_run: Run id of each tag (lines of unknown tags are left out).
        durable_at: ``(run id, step) -> seq`` of the step's first durable ok result.
        stops: The stop of each engine pid that stopped.
        max_problems: How many duplicated steps to describe.
    """
    by_step: dict[tuple[str, str], list[Execution]] = defaultdict(list)
    verdict = Verdict()
    for e in executions:
        run = tag_run.get(e.tag)
        if run is not None:
            by_step[(run, e.step)].append(e)
            verdict.executions += 1
    resumed: Counter[int] = Counter()  # by pid: executions counted as caught by a SIGSTOP
    for key, runs in by_step.items():
        durable = durable_at.get(key, math.inf)
        in_flight, after, done = 0, [], []
        for e in runs:
            stop = stops.get(e.pid)
            if stop is None:
                continue
            if e.t >= stop.t_cut and _caught(e, stop, runs, resumed):
                in_flight += 1
            elif e.t >= stop.t_cut:
                after.append(stop.kind)
                verdict.after_cut[stop.kind] += 1
            elif stop.seq is not None and durable <= stop.seq:
                done.append(stop.kind)
            else:
                in_flight += 1
        extra = len(runs) - 1
        allowed = min(extra, in_flight)
        verdict.in_flight_reruns += allowed
        charged = (after + done + [NONE] * extra)[: extra - allowed]
        verdict.duplicated.update(charged)
        if charged and len(verdict.problems) < max_problems:
            where = ", ".join(f"pid {e.pid} at {e.t:.3f}" for e in runs)
            verdict.problems.append(
                f"{key[0]} step {key[1]}: ran {len(runs)} times ({where}); "
                f"{in_flight} in flight at a stop; charged to {', '.join(charged)}"
            )
    return verdict


def _caught(e: Execution, stop: Stop, runs: list[Execution], resumed: Counter[int]) -> bool:
    """Whether ``e``, started after its engine's SIGSTOP, was in flight at it (``t_resume``)."""
    if stop.t_resume is None or not stop.t_resume <= e.t <= stop.t_resume + RESUME_S:
        return False
    if any(o.pid == e.pid and o.t < e.t for o in runs) or resumed[e.pid] >= POOL:
        return False  # it had started the step before; or more than its workers at once
    resumed[e.pid] += 1
    return True


# --- the journal, read cold -------------------------------------------------------------


@dataclass
class RunRecord:
    """One run as its journal tells it."""

    run_id: str
    name: str
    tag: str | None
    first_seq: int
    status: str = "running"
    outputs: Any = None
    schedule: tuple[str, str] | None = None  # (schedule id, tick)


@dataclass
class JournalView:
    """What :func:`read_journal` keeps of a journal.

    Attributes:
        runs: By run id.
        durable_at: ``(run id, effect step) -> seq`` of its first ok result.
        signals: ``(run id, signal id) -> (name, payload, how many times journaled)``.
        last_seq: The journal's last seq.
    """

    runs: dict[str, RunRecord] = field(default_factory=dict)
    durable_at: dict[tuple[str, str], int] = field(default_factory=dict)
    signals: dict[tuple[str, str], list[Any]] = field(default_factory=dict)
    last_seq: int = 0

    def tag_run(self) -> dict[str, str]:
        """Run id of each tag (runs started with a ``tag`` input)."""
        return {r.tag: r.run_id for r in self.runs.values() if r.tag}


#: The agent's calls of ``fault.effect``: the k-th ``python`` tool task of an
#: ``agent`` step is the mock model's call ``ag<k>`` (``soak_load.py``).
AGENT_CALL = "ag"


def read_journal(source: Any) -> JournalView:
    """Read a stopped journal once (a WAL directory, or a PostgreSQL stream: ``Source``).

    A plan step is the task ``worker:<step id>`` (SPAWN role ``worker``); its
    result is the WAKE with cause ``step`` on that task whose value is
    ``[[ok, output], started, ended]``. An agent's tool call is a task of
    role ``tool`` and tool ``python``, whose WAKE's ``ok`` is its outcome.
    """
    from tiffany.wal import spans_of
    from tiffany.wire.records import RecordType, RunEnd, RunStart, Spawn, Wake, decode

    view = JournalView()
    by_no: dict[bytes, RunRecord] = {}
    tasks: dict[tuple[str, int], tuple[str, bool]] = {}  # (run, ltid) -> (effect step, agent's)
    agent_calls: Counter[tuple[str, str]] = Counter()
    wanted = (RecordType.RUN_START, RecordType.SPAWN, RecordType.WAKE, RecordType.RUN_END)
    for seq, rtype, data, start, end, _ in spans_of(source):
        view.last_seq = seq
        if rtype not in wanted:
            continue
        prefix = bytes(data[start : start + 4])
        rec = decode(rtype, data[start:end])
        if isinstance(rec, RunStart):
            entry = rec.entry if isinstance(rec.entry, dict) else {}
            inputs = entry.get("inputs") if isinstance(entry.get("inputs"), dict) else {}
            sched = entry.get("schedule")
            run = RunRecord(rec.run_id, rec.name, inputs.get("tag"), seq)
            if isinstance(sched, dict):
                run.schedule = (str(sched.get("id")), str(sched.get("tick")))
            view.runs[rec.run_id] = by_no[prefix] = run
            continue
        run = by_no.get(prefix)
        if run is None:
            continue
        if isinstance(rec, Spawn):
            if rec.role == "worker" and rec.step_id:
                tasks[(run.run_id, rec.ltid)] = (rec.step_id, False)
            elif rec.role == "tool" and rec.tool == "python" and rec.step_id:
                agent_calls[(run.run_id, rec.step_id)] += 1
                k = agent_calls[(run.run_id, rec.step_id)]
                tasks[(run.run_id, rec.ltid)] = (f"{AGENT_CALL}{k}", True)
        elif isinstance(rec, Wake):
            if rec.cause == "signal" and isinstance(rec.value, list) and len(rec.value) == 3:
                name, payload, signal_id = rec.value
                got = view.signals.setdefault((run.run_id, str(signal_id)), [name, payload, 0])
                got[2] += 1
            elif rec.cause == "step" and rec.ok:
                task = tasks.get((run.run_id, rec.ltid))
                if task is None:
                    continue
                step, agents = task
                value = rec.value
                ok = agents or bool(
                    isinstance(value, list) and value and isinstance(value[0], list) and value[0][0]
                )
                if ok:
                    view.durable_at.setdefault((run.run_id, step), seq)
        elif isinstance(rec, RunEnd):
            run.status = rec.status
            if isinstance(rec.value, dict):
                run.outputs = rec.value.get("outputs")
    return view
