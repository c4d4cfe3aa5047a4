"""What the phase scripts alone share: engines alternated in rounds with the machine probed
around one of them, and llama-bench's table of the results."""
from __future__ import annotations

import time

from bench.support.measure import THREADS, summary


def alternate(engines: dict, rounds: int, pp: int, probed: str | None = None):
    """Runs each engine once per round, the order rotating from round to round; around the
    engine named `probed` the machine is probed just before and just after (its bandwidth
    drifts within a round). Returns (prefill t/s by engine, decode t/s by engine, per round: each
    engine's prefill t/s and median step seconds, and the bandwidth around `probed`; probes)."""
    import statistics

    from bench.probes import machine as probe

    prefill = {k: [] for k in engines}
    decode = {k: [] for k in engines}
    per_round, probes = [], []
    for r in range(rounds):
        names = list(engines)
        this = {}
        for name in names[r % len(names):] + names[:r % len(names)]:
            if name == probed:
                probes.append(probe.measure())
                before = probes[-1]["read_gb_s"]["median"]
            time.sleep(0.2)  # the last engine's threads spin for a while after its call
            p, steps = engines[name]()
            if name == probed:
                probes.append(probe.measure())
                this["read_gb_s"] = (before + probes[-1]["read_gb_s"]["median"]) / 2
            prefill[name].append(pp / p)
            decode[name].extend(1 / s for s in steps)
            this[name] = {"pp": pp / p, "step_s": statistics.median(steps)}
            print(f"  round {r} {name}: pp {pp / p:.1f} t/s, tg median {1 / statistics.median(steps):.2f} t/s",
                  flush=True)
        per_round.append(this)
    return prefill, decode, per_round, probes


def engine_table(engines, prefill: dict, decode: dict, pp: int, tg: int, threads: dict | None = None) -> dict:
    """llama-bench's table (t/s as mean ± sd, with median, min and max); returns the numbers."""
    import statistics

    results = {}
    print("\n| engine | threads | test | t/s (mean ± sd) | median | min | max |\n|---|---|---|---|---|---|---|")
    for name in engines:
        for test, samples in ((f"pp{pp}", prefill[name]), (f"tg{tg}", decode[name])):
            s = summary(samples)
            sd = statistics.stdev(samples) if len(samples) > 1 else 0.0
            results.setdefault(name, {})[test] = {**s, "mean": statistics.mean(samples), "sd": sd}
            print(f"| {name} | {(threads or {}).get(name, THREADS)} | {test} | {statistics.mean(samples):.2f} ± "
                  f"{sd:.2f} | {s['median']:.2f} | {s['min']:.2f} | {s['max']:.2f} |")
    return results
