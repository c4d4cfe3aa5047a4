"""Phase 1: the NumPy interpreter against transformers eager, both float32, same weights.

Engines alternate inside one process (the order swaps every round), two threads each.
Prefill: one uncached pass over a P-token prompt. Decode: N cached single-token steps.
Also times the first (cache miss) and second (cache hit) load of the default model, each in a
fresh process with an empty cache directory.

    python -m bench.history.phase1 [--rounds 5] [--prompt 128] [--decode 32]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile

from bench.support.measure import THREADS, append, pin_threads, sign_test, summary, timed_run

pin_threads()


def load_timings() -> dict:
    code = ("import time; t=time.perf_counter(); from nanocompile.models import load_model; "
            "m=load_model('default', progress=False); hit=m.weights.known_finite; m.weights.materialize(); "
            "print(time.perf_counter()-t, 'hit' if hit else 'miss')")  # weights converted, as the interpreter needs
    out = {}
    with tempfile.TemporaryDirectory() as d:
        env = {**__import__("os").environ, "NANOCOMPILE_CACHE": d}
        for label in ("first", "second"):
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
            seconds, hit = r.stdout.split()
            out[label] = {"seconds": float(seconds), "cache": hit}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--no-load", action="store_true", help="skip the load timings")
    args = ap.parse_args()

    import numpy as np
    import torch

    torch.set_num_threads(THREADS)
    from bench.support.oracle import Transformers

    from nanocompile.engine.interpreted import InterpreterSession
    from nanocompile.models import load_model

    loads = None if args.no_load else load_timings()
    model = load_model("default", progress=False)
    oracle = Transformers(model.config, model.weights, THREADS)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, 150000, args.prompt)]
    session = InterpreterSession.from_weights(model.config, model.weights, n_ctx=args.prompt + args.decode + 1)

    engines = {"interpreter": lambda: timed_run(session, prompt, args.decode),
               "transformers": lambda: timed_run(oracle, prompt, args.decode)}
    for fn in engines.values():
        fn()  # warm-up, discarded
    prefill = {k: [] for k in engines}
    decode = {k: [] for k in engines}
    round_decode = {k: [] for k in engines}
    for r in range(args.rounds):
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        for name in order:
            p, steps = engines[name]()
            prefill[name].append(p)
            decode[name].extend(steps)
            round_decode[name].append(float(np.median(steps)))

    results = {}
    print(f"phase 1, {THREADS} threads, {args.rounds} rounds, prompt {args.prompt}, decode {args.decode}")
    print(f"{'engine':14} {'prefill median':>15} {'min':>9} {'max':>9} {'pp tok/s':>9} "
          f"{'decode step median':>19} {'min':>9} {'max':>9} {'tg tok/s':>9}")
    for name in engines:
        p, d = summary(prefill[name]), summary(decode[name])
        results[name] = {"prefill_s": p, "decode_step_s": d, "pp_tok_s": args.prompt / p["median"],
                         "tg_tok_s": 1 / d["median"]}
        print(f"{name:14} {p['median'] * 1e3:12.1f} ms {p['min'] * 1e3:6.1f} ms {p['max'] * 1e3:6.1f} ms "
              f"{args.prompt / p['median']:9.1f} {d['median'] * 1e3:16.1f} ms {d['min'] * 1e3:6.1f} ms "
              f"{d['max'] * 1e3:6.1f} ms {1 / d['median']:9.2f}")
    wins = sum(a < b for a, b in zip(round_decode["interpreter"], round_decode["transformers"]))
    ratio = results["interpreter"]["decode_step_s"]["median"] / results["transformers"]["decode_step_s"]["median"]
    pratio = results["interpreter"]["prefill_s"]["median"] / results["transformers"]["prefill_s"]["median"]
    print(f"interpreter / transformers: decode {ratio:.2f}x the time, prefill {pratio:.2f}x; interpreter "
          f"faster at decode in {wins} of {args.rounds} rounds (sign test p = {sign_test(wins, args.rounds):.3f})")
    if loads:
        print(f"default model load: first {loads['first']['seconds']:.1f} s ({loads['first']['cache']}), "
              f"second {loads['second']['seconds']:.2f} s ({loads['second']['cache']})")
    append({"bench": "phase1", "rounds": args.rounds, "prompt_tokens": args.prompt, "decode_tokens": args.decode,
            "engines": results, "decode_ratio": ratio, "prefill_ratio": pratio,
            "interp_decode_wins": wins, "load": loads})


if __name__ == "__main__":
    main()
