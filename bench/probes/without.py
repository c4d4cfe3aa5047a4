"""The default model with the recipes as they are and with the recipes less one kind of directive
(PrefetchNext: a projection's row tiles fetch its next column block; Unpack: a narrow weight's
bytes rebuilt once per column block; PairSums: a sub-block's 4-bit dot products summed in int16
pairs), or another model file (-m), both libraries loaded in one process and alternated round by
round: a prompt (pp) and tokens after it (tg) each round. Why a directive is in the recipes, at a
precision and an x86-64 level; a sign test over the rounds says whether the difference is more than
the machine's noise.

    python -m bench.probes.without PrefetchNext                  # f32, pp512: the recorded A/B of stop 24
    python -m bench.probes.without Unpack --precision native --march x86-64-v3 --rounds 20
                                                                  # prints; appends to bench/results.jsonl
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import numpy as np

from bench.support.measure import THREADS, append, pin_threads, summary, two_sided_sign_test


@contextlib.contextmanager
def recipes_without(kind: type):
    """Every recipe's candidates less their directives of this kind, while a library is compiled."""
    from nanocompile.schedule import recipes

    candidates = recipes._candidates

    def less(*args, **kwargs):
        for schedule in candidates(*args, **kwargs):
            yield [d for d in schedule if not isinstance(d, kind)]

    recipes._candidates = less
    try:
        yield
    finally:
        recipes._candidates = candidates


def main() -> None:
    from nanocompile import schedule
    from nanocompile.engine.compiled import CompiledSession
    from nanocompile.engine.precision import PRECISIONS
    from nanocompile.models import load_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directive", choices=["PairSums", "PrefetchNext", "Unpack"])
    ap.add_argument("-m", "--model", default="default", help="'default', a GGUF file or a Hugging Face directory")
    ap.add_argument("--precision", default="f32", choices=list(PRECISIONS))
    ap.add_argument("--march", default=None, help="an x86-64 level below this CPU's (default: this CPU's)")
    ap.add_argument("--rounds", default=40, type=int)
    ap.add_argument("--pp", default=512, type=int)
    ap.add_argument("--tg", default=16, type=int)
    args = ap.parse_args()
    if args.rounds < 1 or args.pp < 1 or args.tg < 0:
        ap.error(f"--rounds and --pp at least 1, --tg at least 0 (got {args.rounds}, {args.pp}, {args.tg})")
    pin_threads()
    model = load_model(args.model, progress=False)
    ids = [int(t) for t in np.random.default_rng(0).integers(1000, 100000, args.pp + args.tg)]

    def session():
        s = CompiledSession.from_weights(model.config, model.weights, n_ctx=args.pp + args.tg + 8, threads=THREADS,
                                         weights_key=model.key, precision=args.precision, march=args.march,
                                         tuned=False)
        s.step(ids[:16])  # warm-up: the weights faulted in, the pool started
        return s

    with recipes_without(getattr(schedule, args.directive)):
        without = session()
    sessions = {"recipes": session(), f"less {args.directive}": without}
    names = list(sessions)
    speeds = {test: {name: [] for name in names} for test in ("pp", "tg")}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            s = sessions[name]
            s.reset()
            t0 = time.perf_counter()
            s.step(ids[:args.pp])
            t1 = time.perf_counter()
            for t in ids[args.pp:]:
                s.step([t])
            speeds["pp"][name].append(args.pp / (t1 - t0))
            if args.tg:
                speeds["tg"][name].append(args.tg / (time.perf_counter() - t1))
        print(f"round {r}: " + ", ".join(f"{n} pp {speeds['pp'][n][-1]:.0f}" +
                                         (f" tg {speeds['tg'][n][-1]:.1f}" if args.tg else "") for n in names),
              flush=True)
    for s in sessions.values():
        s.close()
    result = {"bench": "without", "directive": args.directive, "model": str(model.source), "precision": args.precision,
              "march": args.march or "this CPU's", "rounds": args.rounds, "pp": args.pp, "tg": args.tg}
    for test in ("pp", "tg") if args.tg else ("pp",):
        ratios = [a / b for a, b in zip(*speeds[test].values())]
        wins = sum(x > 1 for x in ratios)
        p = two_sided_sign_test(wins, len(ratios))
        for n in names:
            v = speeds[test][n]
            print(f"{n}: {test} median {statistics.median(v):.1f} t/s [{min(v):.1f}-{max(v):.1f}]")
        print(f"{test}: recipes / less {args.directive}: median {statistics.median(ratios):.3f} "
              f"[{min(ratios):.3f}-{max(ratios):.3f}], faster in {wins} of {len(ratios)} (sign test p = {p:.2g})")
        result[test] = {"engines": {n: summary(v) for n, v in speeds[test].items()}, "ratio": summary(ratios),
                        "wins": wins, "sign_test_p": p, "samples": speeds[test]}
    append(result)


if __name__ == "__main__":
    main()
