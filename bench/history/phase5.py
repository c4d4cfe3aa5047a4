"""Phase 5: the tuned build against the recipes and llama.cpp F32, two threads, engines
alternating in one run (each round starts with the next engine), reported as llama-bench does
(t/s) with medians, minima and per-round ratios:

    pp512              a 512-token prompt from an empty cache
    tg128 @ d          128 greedy steps after d tokens of context (d = 0, 1024, 4096)

Engines: nanocompile with the schedules `nanocompile tune` stored for this CPU, nanocompile
with the recipes alone, llama.cpp through llama-cpp-python on an F32 GGUF of the same weights
(written by llama.cpp itself). Before timing, the tuned library's logits are checked bitwise
equal to the recipes' on the prompt and a few steps (the gate says so), and the tuner's per
kernel verification (sign tests against the recipes) is copied from its results file.

    python -m bench.history.phase5 [--rounds 3] [--depths 0,1024,4096]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from bench.support.measure import THREADS, append, pin_threads, summary, timed_run

pin_threads()


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--depths", default="0,1024,4096")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--no-recipes", action="store_true",
                    help="time the tuned library only (the bitwise check against the recipes still runs)")
    args = ap.parse_args()
    depths = [int(d) for d in args.depths.split(",")]

    import numpy as np

    from nanocompile.engine.compiled import CompiledSession
    from nanocompile.engine.open import tuned_store
    from nanocompile.cache.location import cache_dir
    from nanocompile.models import load_model
    from nanocompile.target import detect_march
    from nanocompile.tune.store import load

    model = load_model("default", progress=False)
    n_ctx = max(depths) + args.tg + 8
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, 150000, args.pp)]
    context = [int(t) for t in rng.integers(0, 150000, max(depths) or 1)]

    tuned = CompiledSession.from_weights(model.config, model.weights, n_ctx, THREADS, model.key, tuned=True)
    recipes = CompiledSession.from_weights(model.config, model.weights, n_ctx, THREADS, model.key, tuned=False)
    print(f"tuned kernels: {tuned.module.tuned_kernels}", flush=True)
    # the gate's first part: the tuned model is bitwise the untuned one
    identical = True
    for s in (tuned, recipes):
        s.reset()
    a, b = tuned.step(prompt, all_logits=True), recipes.step(prompt, all_logits=True)
    identical &= bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))
    token = int(np.argmax(a[-1]))
    for _ in range(8):
        x, y = tuned.step([token]), recipes.step([token])
        identical &= bool(np.array_equal(x.view(np.uint32), y.view(np.uint32)))
        token = int(np.argmax(x))
    print(f"tuned logits bitwise equal to the recipes': {identical}", flush=True)
    if args.no_recipes:
        recipes.close()

    def timed(engine):
        """pp over the prompt, then tg greedy steps after each depth of context."""
        def run():
            out = {f"pp{args.pp}": args.pp / timed_run(engine, prompt, 0)[0]}
            for d in depths:
                _, steps = timed_run(engine, context[:d] if d else [prompt[0]], args.tg)
                out[f"tg{args.tg}@{d}"] = args.tg / sum(steps)
            return out
        return run

    engines = {"nanocompile tuned": timed(tuned)}
    if not args.no_recipes:
        engines["nanocompile recipes"] = timed(recipes)
    if not args.no_llama:
        from bench.support.peer import LlamaCpp, requantized
        f32 = requantized(Path(model.source), "f32", cache_dir() / "requantized")
        engines["llama.cpp F32"] = timed(LlamaCpp(f32, n_ctx, THREADS))

    per_round, loads = [], []
    for r in range(args.rounds):
        names = list(engines)
        order = names[r % len(names):] + names[:r % len(names)]
        this = {}
        for name in order:
            loads.append(load_average())
            this[name] = engines[name]()
            print(f"  round {r} {name}: " + ", ".join(f"{k} {v:.1f} t/s" for k, v in this[name].items())
                  + f"  (load {loads[-1]})", flush=True)
        per_round.append(this)

    tests = list(per_round[0][next(iter(engines))])
    results = {n: {t: summary([r[n][t] for r in per_round]) for t in tests} for n in engines}
    print("\n| engine | threads | test | t/s median | min | max |\n|---|---|---|---|---|---|")
    for n in engines:
        for t in tests:
            s = results[n][t]
            print(f"| {n} | {THREADS} | {t} | {s['median']:.2f} | {s['min']:.2f} | {s['max']:.2f} |")
    ratios = {}
    for other in [n for n in engines if n != "nanocompile tuned"]:
        ratios[other] = {t: [r["nanocompile tuned"][t] / r[other][t] for r in per_round] for t in tests}
        print(f"\ntuned / {other}, by round (median):")
        for t in tests:
            print(f"  {t}: {[round(x, 3) for x in ratios[other][t]]} ({statistics.median(ratios[other][t]):.3f}x)")
    store = tuned_store(None)
    data = load(store) if store.exists() else {"kernels": {}}
    kernels = {n: {"class": e["class"], "stable": e.get("stable"), "use": e.get("use"),
                   "verify": {k: e["verify"][k] for k in ("gain", "p_faster", "p_slower", "recipe_cost", "tuned_cost")}
                   if e.get("verify") else None} for n, e in data["kernels"].items()}
    print(f"\nload average during the run: {loads}")
    append({"bench": "phase5", "pp": args.pp, "tg": args.tg, "depths": depths, "rounds": args.rounds,
            "march": detect_march()[0], "engines": results, "per_round": per_round, "ratios_by_round": ratios,
            "tuned_bitwise_equal_to_recipes": identical, "tuned_kernels": tuned.module.tuned_kernels,
            "tuner": {"store": str(store), "run": data.get("run"), "kernels": kernels}, "load_average": loads})
    print(json.dumps({"identical": identical}))


if __name__ == "__main__":
    main()
