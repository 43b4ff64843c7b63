"""A run's model budget: one ledger its planner, workers and agent loops share.

A plan's ``budget`` (:class:`~tiffany.agents.plan.BudgetSpec`: tokens, US
dollars) bounds the model usage of the run's steps. The planner makes one
:class:`Ledger` for the run and hands it to every worker; the workers hand
it to their tools (``ToolContext.budget``). Whoever makes a model call:

* **checks before it** (:meth:`Ledger.check`): once the run's usage has
  reached the budget, the call is refused with :class:`BudgetExceeded`
  (``budget.exceeded``) and the model is not called. The worker checks
  before each attempt of a step whose tool is one model call (``llm``);
  the ``agent`` loop before each turn, and before each metered tool it calls;
* **charges after it** (:meth:`Ledger.charge`) what the call reports, whether
  it succeeded or not: a model error raised after the model answered (a
  reply the tool cannot use) carries the reply's ``usage`` and ``cost_usd``
  in its fields, so a failed attempt's record (its ``error``) has them too;
* a step whose own usage takes the run past the budget fails with
  ``budget.exceeded`` (its output was bought beyond the budget), and is not
  retried. The run's result reports the ledger's total as ``usage``.

Which tools are metered, and by whom, is the tool's :data:`METERED` class
attribute: ``"call"`` (the step is one model call: the worker checks and
charges), ``"self"`` (the tool checks and charges each of its calls itself:
``agent``); any other tool's output is charged if it reports usage.

Invariants:
    - Replay: the ledger is plain state of the run, changed and read only by
      the run's tasks on the kernel's thread, from values the journal holds
      (step results, errors), at points the journaled dispatch order fixes.
      A replay runs the same tasks in the same order with the same values,
      so every check decides as it did live, and needs no record of its own
      (``replay --verify`` holds it to that).
    - Bound: a check admits a call while the total is below the budget; a
      call's usage is known only when it returns. So the run may spend past
      its budget by at most the usage of the calls already in flight when
      the total crossed it (one per step running a model call at that
      moment: the plan's parallel ``llm`` steps, and agents mid-turn), and
      no call starts after that.
    - Runs of versions before 3 keep the rules they ran under
      (:func:`legacy_spend`; old layout: see docs/wal-format.md, compatibility).

Discussion: the bound is the one peers give for their limits. Temporal's
activity timeouts and LangGraph's ``recursion_limit`` stop what has not
started; what is in flight runs to its end and is counted. A reservation
(hold ``max_tokens`` before a call) would bound overspend tighter, but a
call's usage is not known before the model answers (prompt tokens depend
on the provider's tokenizer), and a reservation without ``max_tokens`` would
have to hold the whole rest of the budget, which serialises every model
call of the run.

Rejected: counting at the planner when a step reports (the design before
version 3). A failed step's usage never reached it (a 200,000-token step
that failed left the run at 0 against a 5,000-token budget), a retry
started whatever had been spent, and every parallel step started whatever
the others had spent. A system call for the check, journaled: the check's
inputs are journaled already, and a record per model call would cost the
loop a dispatch for nothing a replay does not recompute.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Literal

from tiffany.errors import TiffanyError

if TYPE_CHECKING:
    from tiffany.agents.plan import BudgetSpec

__all__ = [
    "BUDGET_COMPAT",
    "METERED",
    "BudgetExceeded",
    "Ledger",
    "legacy_spend",
    "metered",
    "usage_of",
]

#: The first journal version whose runs keep their budget with a :class:`Ledger`.
BUDGET_COMPAT: Final = 3
#: The class attribute a tool declares how its model calls are metered by (module docstring).
METERED: Final = "metered"

Metering = Literal["call", "self"] | None


class BudgetExceeded(TiffanyError):
    """The run's model usage reached its budget: a call was refused, or a step's crossed it."""

    code = "budget.exceeded"
    outcome = True


def metered(tool: Any) -> Metering:
    """Return how ``tool``'s model calls are metered: ``"call"``, ``"self"`` or None."""
    how = getattr(tool, METERED, None)
    return how if how in ("call", "self") else None


def usage_of(found: Any) -> tuple[float, float] | None:
    """Return ``(tokens, usd)`` a step's output or error reports, or None if it reports none.

    ``usage.total_tokens`` and ``cost_usd`` (the fields of ``llm`` and
    ``agent`` outputs, and of the errors a model call raised after it
    answered); a number that is not there counts 0.
    """
    if not isinstance(found, Mapping):
        return None
    used = found.get("usage")
    tokens = used.get("total_tokens") if isinstance(used, Mapping) else None
    cost = found.get("cost_usd")
    if isinstance(tokens, bool) or not isinstance(tokens, int | float):
        tokens = None
    if isinstance(cost, bool) or not isinstance(cost, int | float):
        cost = None
    if tokens is None and cost is None:
        return None
    return tokens or 0, cost or 0.0


class Ledger:
    """What a run has spent of its budget, shared by its tasks (module docstring).

    Attributes:
        budget: The plan's budget.
        tokens: Model tokens charged so far.
        usd: US dollars charged so far.
    """

    __slots__ = ("budget", "tokens", "usd")

    def __init__(self, budget: BudgetSpec) -> None:
        self.budget = budget
        self.tokens: float = 0
        self.usd: float = 0.0

    def charge(self, found: Any) -> bool:
        """Add the usage ``found`` (an output, an error's info) reports; True if it reports any."""
        used = usage_of(found)
        if used is None:
            return False
        self.tokens += used[0]
        self.usd = round(self.usd + used[1], 8)
        return True

    def spent(self) -> bool:
        """True once the usage has reached the budget: no model call may start."""
        b = self.budget
        return (b.tokens is not None and self.tokens >= b.tokens) or (
            b.usd is not None and self.usd >= b.usd
        )

    def over(self) -> bool:
        """True once the usage is past the budget (the step that took it there fails)."""
        b = self.budget
        return (b.tokens is not None and self.tokens > b.tokens) or (
            b.usd is not None and self.usd > b.usd
        )

    def check(self, what: str) -> None:
        """Refuse a model call (``what`` names it) once the budget is spent.

        Raises:
            BudgetExceeded: The usage has reached the budget; the call must not start.
        """
        if self.spent():
            raise self.exceeded(f"{what} not started")

    def exceeded(self, why: str) -> BudgetExceeded:
        """The error of a refused call or an over-budget step (``why`` says which)."""
        b = self.budget
        limits = [f"{b.tokens} tokens"] if b.tokens is not None else []
        limits += [f"${b.usd:g}"] if b.usd is not None else []
        return BudgetExceeded(
            f"{why}: the run's model usage ({self.tokens:g} tokens, ${self.usd:g}) has reached "
            f"the plan's budget ({', '.join(limits)})",
            tokens=self.tokens,
            usd=self.usd,
            budget_tokens=b.tokens,
            budget_usd=b.usd,
        )

    def totals(self) -> dict[str, float]:
        """The run's usage, as its result reports it: ``{"tokens", "usd"}``."""
        return {"tokens": self.tokens, "usd": self.usd}


def legacy_spend(usage: dict[str, float], output: Any, budget: BudgetSpec) -> bool:
    """Version 2's rule: add a succeeded step's usage to the run's; True if that crosses the budget.

    Old layout: see docs/wal-format.md, compatibility.
    """
    if isinstance(output, Mapping):  # word for word as version 2 did it: its replays compare
        used = output.get("usage")
        tokens = used.get("total_tokens") if isinstance(used, Mapping) else None
        if isinstance(tokens, int | float) and not isinstance(tokens, bool):
            usage["tokens"] += tokens
        cost = output.get("cost_usd")
        if isinstance(cost, int | float) and not isinstance(cost, bool):
            usage["usd"] = round(usage["usd"] + cost, 8)
    over_tokens = budget.tokens is not None and usage["tokens"] > budget.tokens
    return over_tokens or (budget.usd is not None and usage["usd"] > budget.usd)
