"""LangGraph side of bench/plans.py; runs inside the bench's LangGraph environment.

    python langgraph_driver.py WORKDIR STEPS [sync|async|exit]

A chain: one node that runs STEPS times, looping through a conditional edge.
A fan-out: STEPS parallel branches through ``Send`` in one super-step. Both
run with ``SqliteSaver`` on a file in WORKDIR, at the given durability
(``invoke(..., durability=...)``, LangGraph >= 0.6; earlier versions spelt
it ``checkpoint_during``):

* ``sync``: a super-step's checkpoint is committed before the next
  super-step starts (the loop waits on the checkpoint's future);
* ``async`` (LangGraph's default): the checkpoint is written by a
  background thread while the next super-step already runs, so a crash
  can lose a step whose successor has started;
* ``exit``: checkpoints are written only when the graph's run ends, so a
  crash loses every step of the run.

The saver puts the database in ``journal_mode=WAL`` and commits once per
``put`` and ``put_writes``; it leaves ``synchronous`` alone. We set
``PRAGMA synchronous=FULL`` on its connection (in WAL mode, FULL syncs the
WAL file at every commit; NORMAL would sync only at a WAL checkpoint) and
report what the connection then reads back, instead of relying on the
SQLite build's default.

Prints one JSON object: steps/s for each workload and the settings used.
"""

from __future__ import annotations

import json
import operator
import os
import sqlite3
import sys
import time
from importlib.metadata import version
from typing import Annotated, TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

#: What ``PRAGMA synchronous`` returns, by value.
SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


class Chain(TypedDict):
    n: int
    total: int


class Fan(TypedDict):
    items: list[int]
    results: Annotated[list[int], operator.add]


def main() -> None:
    workdir, steps = sys.argv[1], int(sys.argv[2])
    durability = sys.argv[3] if len(sys.argv) > 3 else "sync"
    if durability not in ("sync", "async", "exit"):
        raise SystemExit(f"durability must be sync, async or exit, not {durability!r}")
    conn = sqlite3.connect(os.path.join(workdir, "lg.sqlite"), check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()  # journal_mode=WAL and the tables
    conn.execute("PRAGMA synchronous=FULL")
    journal_mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    synchronous = SYNCHRONOUS[conn.execute("PRAGMA synchronous").fetchone()[0]]

    def step(state: Chain) -> Chain:
        return {"n": state["n"] + 1, "total": state["total"] + state["n"]}

    g = StateGraph(Chain)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: "step" if s["n"] < steps else END)
    chain = g.compile(checkpointer=saver)
    t0 = time.perf_counter()
    out = chain.invoke(
        {"n": 0, "total": 0},
        {"configurable": {"thread_id": "chain"}, "recursion_limit": steps + 10},
        durability=durability,
    )
    chain_s = time.perf_counter() - t0
    assert out["n"] == steps

    def work(item: dict) -> Fan:
        return {"results": [item["i"] + 1]}

    f = StateGraph(Fan)
    f.add_node("work", work)
    f.add_conditional_edges(START, lambda s: [Send("work", {"i": i}) for i in s["items"]])
    f.add_edge("work", END)
    fan = f.compile(checkpointer=saver)
    t0 = time.perf_counter()
    res = fan.invoke(
        {"items": list(range(steps)), "results": []},
        {"configurable": {"thread_id": "fan"}},
        durability=durability,
    )
    fan_s = time.perf_counter() - t0
    assert len(res["results"]) == steps
    print(
        json.dumps(
            {
                "chain_steps_per_s": steps / chain_s,
                "fanout_steps_per_s": steps / fan_s,
                "version": version("langgraph"),
                "durability": durability,
                "journal_mode": journal_mode,
                "synchronous": synchronous,
            }
        )
    )


if __name__ == "__main__":
    main()
