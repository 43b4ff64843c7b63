"""A plan validated at submission is not parsed again by its planner (but is on replay)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiffany.config import Settings
from tiffany.durable import verify
from tiffany.engine import build, replay_resolvers

PLAN = {
    "name": "once",
    "steps": [
        {"id": "a", "tool": "sleep", "args": {"seconds": 0}},
        {"id": "b", "tool": "sleep", "after": ["a"], "args": {"seconds": 0}},
    ],
}


def test_the_planner_uses_the_plan_validated_at_submission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tiffany.agents.planner as planner

    settings = Settings(data_dir=tmp_path, _env_file=None)
    engine = build(settings)
    run_id = engine.submit_plan(PLAN)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the planner parsed the plan again")

    with monkeypatch.context() as m:
        m.setattr(planner, "parse_plan", refuse)
        with engine.runtime as rt:
            rt.run()
            assert rt.status(run_id).status == "succeeded"
    # A replay has no submission: it parses the journaled document itself.
    assert verify(tmp_path, run_id, resolvers=replay_resolvers(settings)).ok


def test_a_runs_step_bound_is_in_its_entry_and_a_plan_past_it_is_refused(tmp_path: Path) -> None:
    """``max_steps`` is journaled with the run (its replay applies it); more static steps: 422."""
    from tiffany.agents import PlanError

    settings = Settings(data_dir=tmp_path, max_steps=2, _env_file=None)
    engine = build(settings)
    try:
        entry, _ = engine.prepare_plan(PLAN)
        assert entry["limits"] == {"max_steps": 2}
        three = {
            **PLAN,
            "steps": [*PLAN["steps"], {"id": "c", "tool": "sleep", "args": {"seconds": 0}}],
        }
        with pytest.raises(PlanError) as info:
            engine.prepare_plan(three)
        assert info.value.errors == [
            {"loc": "steps", "msg": "3 steps: more than TIFFANY_MAX_STEPS (2)"}
        ]
    finally:
        engine.runtime.close()
