"""LangGraph side of bench/plans.py; runs inside the bench's LangGraph environment.

    python langgraph_driver.py WORKDIR STEPS

A chain: one node that runs STEPS times, looping through a conditional edge,
with the SQLite checkpointer (one checkpoint per step, LangGraph's durable
mode). A fan-out: STEPS parallel branches through ``Send`` in one super-step.
Prints one JSON object: steps/s for each.
"""

from __future__ import annotations

import json
import operator
import os
import sqlite3
import sys
import time
from typing import Annotated, TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send


class Chain(TypedDict):
    n: int
    total: int


class Fan(TypedDict):
    items: list[int]
    results: Annotated[list[int], operator.add]


def main() -> None:
    workdir, steps = sys.argv[1], int(sys.argv[2])
    conn = sqlite3.connect(os.path.join(workdir, "lg.sqlite"), check_same_thread=False)
    saver = SqliteSaver(conn)

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
        {"items": list(range(steps)), "results": []}, {"configurable": {"thread_id": "fan"}}
    )
    fan_s = time.perf_counter() - t0
    assert len(res["results"]) == steps
    print(json.dumps({"chain_steps_per_s": steps / chain_s, "fanout_steps_per_s": steps / fan_s}))


if __name__ == "__main__":
    main()
