"""Phase 2: the compiled whole-model library (naive loops, one kernel per primitive) against the
interpreter and transformers eager, all float32 on the same weights, two threads each.

Engines alternate inside one process, the order rotating every round. Also: the work counted
from the loop IR, compile time cold and cached, and a per-kernel profile of one prefill and one
decode step from a profiling build of the same library.

    python -m bench.history.phase2 [--rounds 3] [--prompt 32] [--decode 16]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench.support.measure import THREADS, append, pin_threads, sign_test, summary, timed_run
from bench.probes.profile import print_profile, profile

pin_threads()


def work_report(module) -> dict:
    from nanocompile.compiler.driver import count_calls
    from nanocompile.loopir.work import bytes_per_run

    poly = bytes_per_run(module.variants["last"])
    counts = count_calls(module, "last")
    plan = module.plans["last"]
    return {"bytes_polynomial": str(poly), "bytes_decode_past_128": poly.evaluate({"seq": 1, "past": 128}),
            "calls_per_step": counts["calls"], "distinct_kernels_in_step": counts["distinct_kernels"],
            "distinct_kernels_in_library": len(module.kernels),
            "arena_bytes": plan.arena_bytes, "arena_bytes_without_reuse": plan.unshared_bytes}


def compile_times(config) -> dict:
    from nanocompile.codegen.tree import write_tree
    from nanocompile.compiler.build import cmake_build, find_or_build
    from nanocompile.compiler.driver import compile_model

    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        m = compile_model(config)
        write_tree(m, Path(d) / "tree")
        t1 = time.perf_counter()
        cmake_build(Path(d) / "tree", Path(d) / "build")
        t2 = time.perf_counter()
    t3 = time.perf_counter()
    find_or_build(compile_model(config))
    t4 = time.perf_counter()
    return {"generate_s": t1 - t0, "cmake_build_s": t2 - t1, "cold_s": t2 - t0, "cached_s": t4 - t3}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--decode", type=int, default=16)
    args = ap.parse_args()

    import numpy as np
    import torch

    torch.set_num_threads(THREADS)
    from bench.support.oracle import Transformers

    from nanocompile.compiler.driver import compile_model
    from nanocompile.engine.interpreted import InterpreterSession
    from nanocompile.engine.open import open_session
    from nanocompile.models import load_model

    model = load_model("default", progress=False)
    module = compile_model(model.config)
    work = work_report(module)
    compile_t = compile_times(model.config)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, 150000, args.prompt)]
    prof = profile(model, prompt, module)

    n_ctx = args.prompt + args.decode + 1
    compiled = open_session(model, "compiled", n_ctx=n_ctx, threads=THREADS)
    interp = InterpreterSession.from_weights(model.config, model.weights, n_ctx=n_ctx)
    oracle = Transformers(model.config, model.weights, THREADS)

    engines = {"compiled": lambda: timed_run(compiled, prompt, args.decode),
               "interpreter": lambda: timed_run(interp, prompt, args.decode),
               "transformers": lambda: timed_run(oracle, prompt, args.decode)}
    prefill = {k: [] for k in engines}
    decode = {k: [] for k in engines}
    per_round = {k: [] for k in engines}
    for r in range(args.rounds):
        names = list(engines)
        order = names[r % 3:] + names[:r % 3]
        for name in order:
            p, steps = engines[name]()
            prefill[name].append(p)
            decode[name].extend(steps)
            per_round[name].append(float(np.median(steps)))

    results = {}
    print(f"phase 2, {THREADS} threads, {args.rounds} rounds, prompt {args.prompt}, decode {args.decode}")
    for name in engines:
        p, d = summary(prefill[name]), summary(decode[name])
        results[name] = {"prefill_s": p, "decode_step_s": d, "pp_tok_s": args.prompt / p["median"],
                         "tg_tok_s": 1 / d["median"]}
        print(f"  {name:12} prefill {p['median'] * 1e3:9.1f} ms (min {p['min'] * 1e3:9.1f}) "
              f"{args.prompt / p['median']:7.2f} tok/s | decode step {d['median'] * 1e3:8.1f} ms "
              f"(min {d['min'] * 1e3:8.1f}, max {d['max'] * 1e3:8.1f}) {1 / d['median']:6.2f} tok/s")
    ratio = results["compiled"]["decode_step_s"]["median"] / results["interpreter"]["decode_step_s"]["median"]
    wins = sum(a < b for a, b in zip(per_round["compiled"], per_round["interpreter"]))
    print(f"  compiled / interpreter decode time: {ratio:.2f}x; compiled faster in {wins} of {args.rounds} rounds "
          f"(sign test p = {sign_test(wins, args.rounds):.3f})")
    print(f"work: {json.dumps(work)}")
    print(f"compile: {json.dumps(compile_t)}")
    print_profile(prof, 5)
    append({"bench": "phase2", "rounds": args.rounds, "prompt_tokens": args.prompt, "decode_tokens": args.decode,
            "engines": results, "compiled_over_interp_decode": ratio, "compiled_decode_wins": wins,
            "work": work, "compile": compile_t, "profile": prof})


if __name__ == "__main__":
    main()
