"""Every decode step's time, one after another, after a context: what an average hides (stretches
of slow steps, as the pool's back-off made them on a VM whose agent takes a few percent of a core;
docs/POOL.md). The default model's native library at this CPU's level, --past tokens, then
--steps single-token steps, each rolled back; reports the median, the share of steps slower than
1.5x the median, and the longest run of such steps.

    python -m bench.probes.step_times [--past 1024] [--steps 200] [--label TEXT]   # appends to bench/results.jsonl
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from bench.support.measure import THREADS, append, pin_threads, positive_int, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--past", type=positive_int, default=1024)
    ap.add_argument("--steps", type=positive_int, default=200)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    pin_threads()
    from nanocompile.engine.compiled import CompiledSession
    from nanocompile.models import load_model

    model = load_model("default", progress=False)
    rng = np.random.default_rng(0)
    session = CompiledSession.from_weights(model.config, model.weights, n_ctx=args.past + 8, threads=THREADS,
                                           weights_key=model.key, precision="native")
    session.step([int(t) for t in rng.integers(1000, 100000, args.past)])
    times = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        session.step([int(rng.integers(1000, 100000))])
        times.append(time.perf_counter() - t0)
        session.truncate(args.past)
    session.close()
    median = statistics.median(times)
    slow = [t > 1.5 * median for t in times]
    longest = run = 0
    for s in slow:
        run = run + 1 if s else 0
        longest = max(longest, run)
    print(f"{args.steps} steps after {args.past}: median {median * 1e3:.1f} ms, {sum(slow)} slower than 1.5x "
          f"({100 * sum(slow) / len(slow):.0f}%), the longest run of them {longest}")
    append({"bench": "step_times", "label": args.label, "past": args.past, "steps": args.steps,
            "seconds": summary(times), "slow_share": sum(slow) / len(slow), "longest_slow_run": longest,
            "ms": [round(t * 1e3, 2) for t in times]})


if __name__ == "__main__":
    main()
