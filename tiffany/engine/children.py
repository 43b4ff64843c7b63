"""The tree of child runs (``plan.run``): its bounds, and how a cancel closes it.

A ``plan.run`` step starts a child run (``Engine.start_child``); a child may
start children of its own. Everything a plan can make grow that way is
bounded, each bound a setting named in its refusal (``LimitExceeded``,
code ``limit.<setting>``):

* ``max_child_depth``: how deep children nest under their root run (a
  root's child is at depth 1);
* ``max_children``: children one run may start, retries included;
* ``max_descendants``: runs one root run's whole tree may start.

A refusal is the answer of ``start_child``: the inline step that asked
journals it, the ``plan.run`` step fails with it (a replay reads it back).

Closing: a run asked to cancel, and a run that ended, is *closed*: no run
under it may start a child any more, from the moment it is asked (before
the cancel reaches any of the tree's tasks at the next wait stage), and
its running children are asked to cancel, which closes them in turn. So a
cancel of a root first stops the tree's growth, then cancels it level by
level; a tree that grows faster than a cancel travels down it cannot
outrun it.

Invariants:

* On the engine's loop only (the inline step, the run ends, the control
  intake's queued calls); nothing here blocks.
* A node is kept per live run of a tree (a root from its first child on):
  a closed tree's nodes go with its runs.
* A child's entry carries its ``root``, ``depth`` and place in the counts
  (``descendant``: the n-th run its root's tree started), so a restarted
  engine counts on from where the journal says (:meth:`RunTree.recover`).

Rejected: bounding the children running at once. A tree of failing children
that its parents retry, or a plan that starts children in sequence, then
grows without end; only totals bound what one submission can start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tiffany.errors import LimitExceeded, TiffanyError

__all__ = ["ChildLimits", "RunTree", "TreeClosed"]


@dataclass(frozen=True, slots=True)
class ChildLimits:
    """The bounds on child runs: the settings of the same names (defaults in ``config.py``)."""

    max_child_depth: int
    max_children: int
    max_descendants: int


class TreeClosed(TiffanyError):
    """A child asked for under a run that is being cancelled or has ended."""

    code = "plan.tree_closed"
    outcome = True


@dataclass(slots=True)
class _Node:
    parent: str | None  # None: the tree's root
    root: str
    depth: int
    started: int = 0  # children this run started
    descendants: int = 0  # the root's: runs its whole tree started
    running: set[str] = field(default_factory=set)  # its children still running
    closed: bool = False  # asked to cancel, or ended: no new child under it


class RunTree:
    """Live runs that have, or are, children; their counts; their closing.

    Args:
        limits: The bounds.
        cancel: ``cancel(run_id, reason)``: ask the journal to cancel a run.
    """

    def __init__(self, limits: ChildLimits, cancel: Callable[[str, str], Any]) -> None:
        self.limits = limits
        self._cancel = cancel
        self._nodes: dict[str, _Node] = {}

    def __len__(self) -> int:
        """How many runs the tree tracks (live roots with children, and children)."""
        return len(self._nodes)

    def admit(self, parent: str) -> dict[str, Any]:
        """Count a new child of ``parent``; the ``parent`` fields of its entry.

        Raises:
            TreeClosed: ``parent``, or a run above it, is closed.
            LimitExceeded: A bound would be passed (nothing is counted then).
        """
        node = self._nodes.get(parent)
        if node is None:  # a root's first child
            node = self._nodes[parent] = _Node(None, parent, 0)
        self._check_open(parent, node)
        root = self._nodes.get(node.root)
        limits = self.limits
        if node.depth + 1 > limits.max_child_depth:
            raise LimitExceeded(
                "max_child_depth",
                limits.max_child_depth,
                f"run {parent} is at depth {node.depth} under its root {node.root}: a child "
                f"would pass TIFFANY_MAX_CHILD_DEPTH ({limits.max_child_depth})",
                run_id=parent,
            )
        if node.started + 1 > limits.max_children:
            raise LimitExceeded(
                "max_children",
                limits.max_children,
                f"run {parent} started {node.started} children already: one more would pass "
                f"TIFFANY_MAX_CHILDREN ({limits.max_children})",
                run_id=parent,
            )
        if root is None or root.descendants + 1 > limits.max_descendants:
            count = root.descendants if root is not None else 0
            raise LimitExceeded(
                "max_descendants",
                limits.max_descendants,
                f"the tree of root run {node.root} started {count} runs already: one more "
                f"would pass TIFFANY_MAX_DESCENDANTS ({limits.max_descendants})",
                run_id=parent,
                root=node.root,
            )
        node.started += 1
        root.descendants += 1
        return {"root": node.root, "depth": node.depth + 1, "descendant": root.descendants}

    def started(self, parent: str, child: str, fields: Mapping[str, Any]) -> None:
        """The child :meth:`admit` counted is running (its entry holds ``fields``)."""
        self._nodes[child] = _Node(parent, str(fields["root"]), int(fields["depth"]))
        self._nodes[parent].running.add(child)

    def close(self, run_id: str, reason: str) -> None:
        """Stop the tree growing under running run ``run_id`` (a cancel was asked, or it ended).

        Its running children are asked to cancel; each closes its own when
        it ends (:meth:`ended` forgets the run's node).
        """
        node = self._nodes.get(run_id)
        if node is None:  # a run with no child yet: it may start none now
            node = self._nodes[run_id] = _Node(None, run_id, 0)
        if node.closed:
            return
        node.closed = True
        for child in sorted(node.running):
            self._cancel(child, reason)

    def ended(self, run_id: str) -> None:
        """Run ``run_id`` ended: its running children are asked to cancel; it is forgotten.

        What is under it is closed from now on: a run whose parent is not
        tracked any more starts no child (:meth:`_check_open`).
        """
        node = self._nodes.pop(run_id, None)
        if node is None:  # a run that neither has nor is a child
            return
        for child in sorted(node.running):
            self._cancel(child, f"its parent run {run_id} ended")
        if node.parent is not None:
            up = self._nodes.get(node.parent)
            if up is not None:
                up.running.discard(run_id)

    def recover(self, runs: Iterable[tuple[str, Mapping[str, Any] | None, bool]]) -> list[str]:
        """Rebuild from the journal's runs at start-up: ``(run id, parent fields, unfinished)``.

        In RUN_START order, every run the start-up index holds (the runs
        after its checkpoint, and every unfinished one: a parent missing
        from it has ended). An unfinished child gets its node back; every
        child counts for its parent and its root (at least what its entry
        says: the n-th descendant). Old entries take ``root`` and ``depth``
        from their parent's (old layout: see docs/wal-format.md, compatibility).

        Returns the unfinished children whose parent has ended (the cancel
        the parent's end asked for was lost with its engine): the caller
        cancels those it resumed.
        """
        runs = list(runs)
        alive = {run_id for run_id, _, running in runs if running}
        seen: dict[str, tuple[str | None, str, int]] = {}  # child -> (parent, root, depth)
        orphans = []
        for run_id, fields, running in runs:
            parent = fields.get("run_id") if isinstance(fields, Mapping) else None
            if not isinstance(fields, Mapping) or not isinstance(parent, str):
                continue
            root, depth = fields.get("root"), fields.get("depth")
            if not isinstance(root, str) or not isinstance(depth, int):
                _, up_root, up_depth = seen.get(parent, (None, parent, 0))
                root, depth = up_root, up_depth + 1
            seen[run_id] = (parent, root, depth)
            if running:
                self._nodes.setdefault(run_id, _Node(parent, root, depth))
            if parent in alive:
                up = self._nodes.get(parent)
                if up is None:
                    pp, pr, pd = seen.get(parent, (None, parent, 0))
                    up = self._nodes[parent] = _Node(pp, pr, pd)
                up.started += 1
                if running:
                    up.running.add(run_id)
            elif running:
                orphans.append(run_id)
            if root in alive:
                top = self._nodes.setdefault(root, _Node(None, root, 0))
                nth = fields.get("descendant")
                top.descendants = max(top.descendants + 1, nth if isinstance(nth, int) else 0)
        return orphans

    def running_children(self, run_id: str) -> list[str]:
        """The children of ``run_id`` still running."""
        node = self._nodes.get(run_id)
        return sorted(node.running) if node is not None else []

    def _check_open(self, parent: str, node: _Node) -> None:
        """Refuse a child under a closed run (``parent`` itself, or a run above it)."""
        at: _Node | None = node
        name = parent
        while at is not None:
            if at.closed:
                raise TreeClosed(
                    f"run {name} is being cancelled or has ended: no run under it starts a child",
                    run_id=parent,
                    closed=name,
                )
            if at.parent is None:
                return
            name = at.parent
            at = self._nodes.get(at.parent)
        # A parent no longer tracked has ended: its tree is closed.
        raise TreeClosed(
            f"run {name} has ended: no run under it starts a child", run_id=parent, closed=name
        )
