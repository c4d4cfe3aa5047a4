"""Worker: one engine, one thread count, one round: every operation of plan.sequences timed.

pp and fill: the whole prompt in one call (the engine chunks it as it does for users); tg: one
call per token. Tokens are fixed random ids (as llama-bench's), the same for every engine."""
from __future__ import annotations

import time

import numpy as np

from bench.report.child import run_worker
from bench.report.engines import engine_named
from bench.report.runners import open_runner
from bench.support.measure import timed_run


def tokens(n: int, vocab: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]


def run_sequence(runner, ops: list[dict], vocab: int) -> dict:
    runner.reset()
    at, out = 0, {}
    for i, op in enumerate(ops):
        if op["start"] != at:
            raise RuntimeError(f"{op['name']} should start at depth {op['start']}, the cache holds {at}")
        ids = tokens(op["n"], vocab, seed=i)
        if op["kind"] == "tg":  # every token a call of its own: the first, then the rest as steps
            first, steps = timed_run(runner, ids[:1], len(ids) - 1, tokens=ids[1:], reset=False)
            steps = [first] + steps
            seconds = sum(steps)
            out[op["name"]] = {"tokens": op["n"], "seconds": seconds, "t_s": op["n"] / seconds,
                               "median_step_s": float(np.median(steps)), "depth": op["start"]}
        else:
            seconds = timed_run(runner, ids, 0, reset=False)[0]
            out[op["name"]] = {"tokens": op["n"], "seconds": seconds, "t_s": op["n"] / seconds, "depth": op["start"]}
        at += op["n"]
    return out


WARMUP = ({"kind": "pp", "n": 16, "start": 0, "name": "warm-up prompt"},
          {"kind": "tg", "n": 4, "start": 16, "name": "warm-up tokens"})


def work(spec: dict) -> dict:
    engine = engine_named(spec["engine"])
    start = time.perf_counter()
    runner = open_runner(engine, spec["files"], spec["n_ctx"], spec["threads"])
    opened = time.perf_counter()
    # as llama-bench warms up: the first calls fault the weights in and start the thread pool
    run_sequence(runner, list(WARMUP), spec["vocab"])
    result = {"open_s": opened - start, "warmup_s": time.perf_counter() - opened, "tests": {}}
    for ops in spec["sequences"]:
        result["tests"].update(run_sequence(runner, ops, spec["vocab"]))
    counted = getattr(runner, "decode_bytes", None)  # nanocompile's, from its loop IR; the peers' from their files
    if counted:  # per tg test, the mean over its steps (bytes grow linearly with depth)
        result["decode_bytes"] = {name: (counted(t["depth"]) + counted(t["depth"] + t["tokens"] - 1)) / 2
                                  for name, t in result["tests"].items() if "median_step_s" in t}
    return result


if __name__ == "__main__":
    run_worker(work)
