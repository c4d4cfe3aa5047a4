"""What a step of k new rows costs against a step of one, after a long context: the shape of a
speculative verify step (k drafted tokens checked in one pass over the weights). For each
precision, the default model's library at this CPU's level (or --march), a context of --past
tokens, then steps of 1, 2, 4, 8, 16 rows, each rolled back (truncate) before the next; the sizes
alternate within a round, and each size keeps the minimum and median of --rounds rounds.

    python -m bench.probes.small_steps [--precisions native,int8,f32] [--march x86-64-v3]
                                       [--past 256] [--rounds 6] [--rows 1,2,4,8,16] [--sequences]
                                       # prints a table; appends to bench/results.jsonl

--sequences: the k rows are one each of k sequences (a batched decoding step of the server,
CompiledSession.step_batch, each sequence after a context of its own, each row's logits): k over
the ratio is how many times one row's tokens per second a batch of k gives.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from bench.support.measure import THREADS, append, pin_threads, positive_int, summary


def sizes(text: str) -> list[int]:
    try:
        rows = [int(r) for r in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: row counts are whole numbers separated by commas") from None
    if any(r < 1 for r in rows) or 1 not in rows:
        raise argparse.ArgumentTypeError(f"{text!r}: every count is at least 1, and 1 (the reference) is among them")
    return rows


def measure(session, context: list[int], rows: list[int], rounds: int, rng) -> dict[int, list[float]]:
    """Seconds of one step of k rows after the context, per k, rounds times (k's order rotates)."""
    session.reset()
    session.step(context)
    past = session.past
    seconds: dict[int, list[float]] = {k: [] for k in rows}
    for r in range(rounds + 1):  # round 0 warms each shape (the pool, the pages the step touches)
        for k in rows[r % len(rows):] + rows[:r % len(rows)]:
            ids = [int(t) for t in rng.integers(1000, 100000, k)]
            t0 = time.perf_counter()
            session.step(ids, all_logits=True)  # a verify step reads every row's logits
            elapsed = time.perf_counter() - t0
            session.truncate(past)
            if r:
                seconds[k].append(elapsed)
    return seconds


def measure_sequences(session, context: list[int], rows: list[int], rounds: int, rng) -> dict[int, list[float]]:
    """Seconds of one batched step of one row in each of k sequences, each after the context."""
    sequences = session.sequences(max(rows))
    for s in sequences:
        s.reset()
        s.step(context)
    past = sequences[0].past
    seconds: dict[int, list[float]] = {k: [] for k in rows}
    for r in range(rounds + 1):
        for k in rows[r % len(rows):] + rows[:r % len(rows)]:
            parts = [(s, [int(rng.integers(1000, 100000))]) for s in sequences[:k]]
            t0 = time.perf_counter()
            session.step_batch(parts)
            elapsed = time.perf_counter() - t0
            for s, _ in parts:
                s.truncate(past)
            if r:
                seconds[k].append(elapsed)
    return seconds


def read_rate() -> float:
    """The machine's read bandwidth now (GB/s, the probe's median): one row's time follows it and
    an 8-row step's, bound by its arithmetic, does not, so the ratios move with it (phase21.md)."""
    from bench.probes.machine import measure as probe_machine

    return probe_machine()["read_gb_s"]["median"]


def main() -> None:
    ap = argparse.ArgumentParser(description="the cost of a step of k rows against one row, after a context")
    ap.add_argument("--precisions", default="native,int8,f32")
    ap.add_argument("--march", default=None, help="another level than this CPU's, e.g. x86-64-v3 (AVX2)")
    ap.add_argument("--past", type=positive_int, default=256)
    ap.add_argument("--rounds", type=positive_int, default=6)
    ap.add_argument("--rows", type=sizes, default=[1, 2, 4, 8, 16])
    ap.add_argument("--sequences", action="store_true", help="one row in each of k sequences (a batched step)")
    args = ap.parse_args()
    pin_threads()
    from nanocompile.engine.compiled import CompiledSession
    from nanocompile.models import load_model
    from nanocompile.target import detect_march

    model = load_model("default", progress=False)
    march = args.march or detect_march()[0]
    rng = np.random.default_rng(0)
    context = [int(t) for t in rng.integers(1000, 100000, args.past)]
    record = {"bench": "small_steps", "march": march, "past": args.past, "rounds": args.rounds, "precisions": {},
              "rows_are": "sequences" if args.sequences else "one sequence", "read_gb_s_before": read_rate()}
    print(f"| precision ({march}) | " + " | ".join(f"{k} rows" for k in args.rows) + " |")
    print("|---" * (len(args.rows) + 1) + "|")
    for precision in args.precisions.split(","):
        session = CompiledSession.from_weights(model.config, model.weights, n_ctx=args.past + max(args.rows) + 8,
                                               threads=THREADS,
                                               weights_key=model.key, precision=precision, march=args.march)
        seconds = (measure_sequences if args.sequences else measure)(session, context, args.rows, args.rounds, rng)
        session.close()
        one = min(seconds[1])
        print(f"| {precision} (1 row {one * 1e3:.1f} ms) | "
              + " | ".join(f"{min(seconds[k]) / one:.2f}x" for k in args.rows) + " |", flush=True)
        record["precisions"][precision] = {
            str(k): {"seconds": summary(s), "min_over_one_row": min(s) / one,
                     "median_over_one_row": statistics.median(s) / statistics.median(seconds[1])}
            for k, s in seconds.items()}
    record["read_gb_s_after"] = read_rate()
    print(f"the machine read {record['read_gb_s_before']:.1f} GB/s before, {record['read_gb_s_after']:.1f} after")
    append(record)


if __name__ == "__main__":
    main()
