"""The 8-lane super-block projections' register tile: a model's native library with the recipe's
budget of long-lived sums (recipes.SUPERBLOCK_BUDGET[8]) and column vectors
(SUPERBLOCK_COLUMNS[8]) set to each variant, each built apart from the cache, loaded in one
process and alternated round by round: a prompt (pp), tokens after it (tg) and, with --verify K,
a step of K rows against a step of one after the prompt (each the minimum of 5, rolled back).
Every variant's prompt logits are asserted bitwise equal to the first's.

    python -m bench.probes.superblock_tile -m big.gguf --variants 2:8,2:24 --rounds 7
    python -m bench.probes.superblock_tile --variants 2:8,2:24,1:24 --verify 8   # default model
                                                             # prints; appends to bench/results.jsonl
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import numpy as np

from bench.probes.without import native_session_apart
from bench.support.measure import append, pin_threads, summary, two_sided_sign_test

LANES = 8


@contextlib.contextmanager
def tile(columns: int, budget: int):
    """The 8-lane super-block recipe with `columns` vectors a tile and `budget` registers of sums."""
    from nanocompile.schedule import recipes

    saved = recipes.SUPERBLOCK_COLUMNS[LANES], recipes.SUPERBLOCK_BUDGET[LANES]
    recipes.SUPERBLOCK_COLUMNS[LANES], recipes.SUPERBLOCK_BUDGET[LANES] = (columns,), budget
    try:
        yield
    finally:
        recipes.SUPERBLOCK_COLUMNS[LANES], recipes.SUPERBLOCK_BUDGET[LANES] = saved


def variant(text: str) -> tuple[int, int]:
    try:
        columns, budget = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a variant is COLUMNS:BUDGET, two whole numbers") from None
    if columns < 1 or budget < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: columns and budget at least 1")
    return columns, budget


def main() -> None:
    from nanocompile.models import load_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="default", help="'default', a GGUF file or a Hugging Face directory")
    ap.add_argument("--variants", default="2:8,2:24", help="COLUMNS:BUDGET,... (the first is the baseline)")
    ap.add_argument("--march", default="x86-64-v3", help="an x86-64 level with 8-lane vectors")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--pp", type=int, default=384)
    ap.add_argument("--tg", type=int, default=16)
    ap.add_argument("--verify", type=int, default=0, help="also a step of this many rows against one")
    args = ap.parse_args()
    try:
        variants = [variant(v) for v in args.variants.split(",")]
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    if args.rounds < 1 or args.pp < 1 or args.tg < 0 or args.verify < 0:
        ap.error("--rounds and --pp at least 1, --tg and --verify at least 0")
    pin_threads()
    model = load_model(args.model, progress=False)
    ids = [int(t) for t in np.random.default_rng(0).integers(1000, 100000, args.pp + max(args.tg, args.verify))]
    sessions = {}
    for columns, budget in variants:
        s = native_session_apart(model, args.march, lambda: tile(columns, budget), len(ids) + 8)
        s.step(ids[:16])
        sessions[f"{columns}:{budget}"] = s
    names = list(sessions)
    tests = ("pp", "tg") + (("verify",) if args.verify else ())
    got = {test: {n: [] for n in names} for test in tests}
    first = None
    for r in range(args.rounds):
        for n in names if r % 2 == 0 else names[::-1]:
            s = sessions[n]
            s.reset()
            t0 = time.perf_counter()
            logits = np.asarray(s.step(ids[:args.pp]))
            t1 = time.perf_counter()
            first = logits if first is None else first
            assert np.array_equal(logits, first), f"{n}: prompt logits differ from {names[0]}'s"
            for t in ids[args.pp:args.pp + args.tg]:
                s.step([t])
            got["pp"][n].append(args.pp / (t1 - t0))
            got["tg"][n].append(args.tg / (time.perf_counter() - t1) if args.tg else 0.0)
            if args.verify:  # the cost of a step of K rows over a step of one (lower is better)
                past, steps = s.past, {1: [], args.verify: []}
                for _ in range(5):
                    for rows in steps:
                        t2 = time.perf_counter()
                        s.step(ids[args.pp:args.pp + rows], all_logits=True)
                        steps[rows].append(time.perf_counter() - t2)
                        s.truncate(past)
                got["verify"][n].append(min(steps[args.verify]) / min(steps[1]))
        print(f"round {r}: " + ", ".join(f"{n} pp {got['pp'][n][-1]:.1f} tg {got['tg'][n][-1]:.1f}" +
                                         (f" verify {got['verify'][n][-1]:.2f}x" if args.verify else "")
                                         for n in names), flush=True)
    for s in sessions.values():
        s.close()
    result = {"bench": "superblock_tile", "model": str(model.source), "march": args.march, "rounds": args.rounds,
              "pp": args.pp, "tg": args.tg, "verify_rows": args.verify, "baseline": names[0]}
    for test in tests:
        result[test] = {n: summary(v) for n, v in got[test].items()}
        for n in names:
            v = got[test][n]
            print(f"{n}: {test} median {statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]")
        for n in names[1:]:
            ratios = [a / b for a, b in zip(got[test][n], got[test][names[0]])]
            wins = sum(x > 1 for x in ratios)
            result[test][f"{n} / {names[0]}"] = {**summary(ratios), "above_1": wins,
                                                 "sign_test_p": two_sided_sign_test(wins, len(ratios))}
            print(f"{test}: {n} / {names[0]} median {statistics.median(ratios):.3f} "
                  f"[{min(ratios):.3f}-{max(ratios):.3f}], above 1 in {wins} of {len(ratios)}")
    append(result)


if __name__ == "__main__":
    main()
