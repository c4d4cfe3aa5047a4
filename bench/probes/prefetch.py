"""pp512 of the default float32 model with the recipes as they are and with the recipes less
PrefetchNext (schedule/prefetch.py: the row tiles of a projection fetch its next column block),
both libraries loaded in one process and alternated prompt by prompt: why the directive is in the
recipes. A sign test over the pairs says whether the difference is more than the machine's noise.

    python -m bench.probes.prefetch [rounds, default 40]   # prints; appends to bench/results.jsonl
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import numpy as np

from bench.support.measure import THREADS, append, pin_threads, sign_test, summary


@contextlib.contextmanager
def recipes_without_prefetch():
    """The projection recipes less their PrefetchNext, while a library is compiled."""
    from nanocompile.schedule import recipes
    from nanocompile.schedule.directives import PrefetchNext

    projection = recipes.projection
    recipes.projection = lambda *a: [d for d in projection(*a) if not isinstance(d, PrefetchNext)]
    try:
        yield
    finally:
        recipes.projection = projection


def main() -> None:
    from nanocompile.engine.compiled import CompiledSession
    from nanocompile.models import load_model

    ap = argparse.ArgumentParser(description="pp512 with and without PrefetchNext, alternated in one process")
    ap.add_argument("rounds", nargs="?", default=40, type=int)
    rounds = ap.parse_args().rounds
    if rounds < 1:
        ap.error(f"rounds: at least 1, not {rounds}")
    pin_threads()
    model = load_model("default", progress=False)
    ids = [int(t) for t in np.random.default_rng(0).integers(1000, 100000, 512)]

    def session():
        s = CompiledSession.from_weights(model.config, model.weights, n_ctx=700, threads=THREADS, weights_key=model.key,
                            tuned=False)
        s.step(ids[:16])  # warm-up: the weights faulted in, the pool started
        return s

    with recipes_without_prefetch():
        without = session()
    sessions = {"recipes": session(), "recipes less PrefetchNext": without}
    speeds = {name: [] for name in sessions}
    names = list(sessions)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            s = sessions[name]
            s.reset()
            t0 = time.perf_counter()
            s.step(ids)
            speeds[name].append(512 / (time.perf_counter() - t0))
        print(f"round {r}: " + ", ".join(f"{n} {speeds[n][-1]:.0f}" for n in names), flush=True)
    for s in sessions.values():
        s.close()
    ratios = [a / b for a, b in zip(*speeds.values())]
    wins = sum(r > 1 for r in ratios)
    p = sign_test(wins, rounds)
    for n in names:
        print(f"{n}: pp512 median {statistics.median(speeds[n]):.0f} t/s [{min(speeds[n]):.0f}-{max(speeds[n]):.0f}]")
    print(f"recipes / less PrefetchNext: median {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}], "
          f"faster in {wins} of {rounds} (sign test p = {p:.2g})")
    append({"bench": "prefetch", "precision": "f32", "rounds": rounds, "pp": 512,
            "engines": {n: summary(v) for n, v in speeds.items()}, "ratio": summary(ratios),
            "wins": wins, "sign_test_p": p, "samples": speeds})


if __name__ == "__main__":
    main()
