"""The soak's rule for re-run effects (``soak_account.classify``), case by case.

Each case is a handful of effect lines of one step and the stops of the
engines that ran them: what the soak counts as allowed (a re-run of a step
in flight at a stop) and as duplicated, and to which cause it charges it.
"""

from __future__ import annotations

from soak_account import (
    FENCE,
    KILL9,
    NONE,
    POOL,
    SIGTERM,
    Execution,
    Stop,
    Verdict,
    classify,
)

RUN = {"t1": "run-1"}


def _one(lines: list[tuple[int, float]], durable: int | None, stops: list[Stop]) -> Verdict:
    executions = [Execution("t1", "s", pid, t) for pid, t in lines]
    durable_at = {} if durable is None else {("run-1", "s"): durable}
    return classify(executions, RUN, durable_at, {s.pid: s for s in stops})


def test_a_step_in_flight_at_a_kill_may_run_once_more() -> None:
    v = _one([(10, 1.0), (11, 3.0)], durable=50, stops=[Stop(KILL9, 10, 2.0, 40)])
    assert (v.in_flight_reruns, sum(v.duplicated.values())) == (1, 0)


def test_a_step_durable_at_the_kill_that_runs_again_is_duplicated() -> None:
    v = _one([(10, 1.0), (11, 3.0)], durable=30, stops=[Stop(KILL9, 10, 2.0, 40)])
    assert (v.in_flight_reruns, v.duplicated[KILL9]) == (0, 1)
    assert "charged to kill -9" in v.problems[0]


def test_a_job_started_after_the_sigterm_and_run_again_is_a_sigterm_duplicate() -> None:
    # The stopping engine ran a queued job (its result never journaled): the next one reruns it.
    v = _one([(10, 2.5), (11, 4.0)], durable=60, stops=[Stop(SIGTERM, 10, 2.0, 40)])
    assert (v.in_flight_reruns, v.duplicated[SIGTERM], v.after_cut[SIGTERM]) == (0, 1, 1)


def test_a_job_started_after_the_sigterm_whose_result_was_journaled_is_no_duplicate() -> None:
    v = _one([(10, 2.5)], durable=40, stops=[Stop(SIGTERM, 10, 2.0, 40)])
    assert (sum(v.duplicated.values()), v.after_cut[SIGTERM]) == (0, 1)


def test_a_fenced_engine_that_starts_the_step_after_its_successor_did_is_charged_to_the_fence() -> (
    None
):
    # In flight at the SIGSTOP in 10, rerun by 11 (allowed), then run by 10 once continued.
    lines = [(10, 1.0), (11, 5.0), (10, 9.0)]
    v = _one(lines, durable=70, stops=[Stop(FENCE, 10, 2.0, 40)])
    assert (v.in_flight_reruns, v.duplicated[FENCE], sum(v.duplicated.values())) == (1, 1, 1)
    # The order of the lines does not matter: counts, not sequences.
    assert (
        _one(lines[::-1], durable=70, stops=[Stop(FENCE, 10, 2.0, 40)]).duplicated == v.duplicated
    )


def test_a_step_a_sigstop_caught_past_the_lease_gate_may_run_once_more() -> None:
    # The worker asked the gate before the SIGSTOP at 2.0 and went on into the
    # effect right after SIGCONT (8.0); the successor ran the step at 5.0.
    fence = Stop(FENCE, 10, 2.0, None, t_resume=8.0)
    v = _one([(11, 5.0), (10, 8.01)], durable=70, stops=[fence])
    assert (v.in_flight_reruns, sum(v.duplicated.values()), v.after_cut[FENCE]) == (1, 0, 0)
    # Later than just after SIGCONT: a job the engine began after the stop.
    v = _one([(11, 5.0), (10, 9.0)], durable=70, stops=[fence])
    assert (v.in_flight_reruns, v.duplicated[FENCE]) == (0, 1)
    # A step it had started before the stop is not started again by a caught worker.
    v = _one([(10, 1.0), (11, 5.0), (10, 8.01)], durable=70, stops=[fence])
    assert (v.in_flight_reruns, v.duplicated[FENCE]) == (1, 1)


def test_no_more_executions_are_caught_by_a_sigstop_than_the_pool_has_workers() -> None:
    fence = Stop(FENCE, 10, 2.0, None, t_resume=8.0)
    steps = [f"s{i}" for i in range(POOL + 2)]
    executions = [Execution("t1", s, 11, 5.0) for s in steps]
    executions += [Execution("t1", s, 10, 8.01) for s in steps]
    v = classify(executions, RUN, {("run-1", s): 70 for s in steps}, {10: fence})
    assert (v.in_flight_reruns, v.duplicated[FENCE]) == (POOL, 2)


def test_a_rerun_no_stop_explains_is_charged_to_none() -> None:
    v = _one([(10, 1.0), (10, 2.0)], durable=None, stops=[])
    assert (v.in_flight_reruns, v.duplicated[NONE]) == (0, 1)


def test_lines_of_unknown_tags_are_left_out() -> None:
    v = classify([Execution("other", "s", 10, 1.0)], RUN, {}, {})
    assert (v.executions, sum(v.duplicated.values())) == (0, 0)
