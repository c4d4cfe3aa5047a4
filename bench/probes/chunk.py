"""pp512 of the default model with libraries built for different prompt chunks (the rows one pass
takes: compiler.DEFAULT_CHUNK), alternated round by round, and llama.cpp on the same weights
(F32 or Q8_0 GGUF, one 512-token batch) in the same rounds: why the default chunk is what it is.

    python -m bench.probes.chunk [f32|int8] [chunks, default 64,96,192] [rounds, default 5]
                                                   # prints; appends to bench/results.jsonl
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from bench.support.measure import THREADS, append, pin_threads, summary, timed_run

PEER = {"f32": "f32", "int8": "q8_0"}


def chunk_sizes(text: str) -> list[int]:
    try:
        sizes = [int(c) for c in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: chunk sizes are whole numbers separated by commas") from None
    if any(c < 1 for c in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: a chunk holds at least 1 row")
    return sizes


def main() -> None:
    from bench.support.peer import LlamaCpp, requantized
    from nanocompile.cache.location import cache_dir
    from nanocompile.engine.compiled import CompiledSession
    from nanocompile.models import load_model

    ap = argparse.ArgumentParser(description="pp512 at several prompt chunk sizes, alternated with llama.cpp")
    ap.add_argument("precision", nargs="?", default="f32", choices=sorted(PEER))
    ap.add_argument("chunks", nargs="?", default=[64, 96, 192], type=chunk_sizes, help="comma-separated, e.g. 64,96,192")
    ap.add_argument("rounds", nargs="?", default=5, type=int)
    args = ap.parse_args()
    precision, chunks, rounds = args.precision, args.chunks, args.rounds
    pin_threads()
    model = load_model("default", progress=False)
    ids = [int(t) for t in np.random.default_rng(0).integers(1000, 100000, 512)]

    def ours(chunk: int):
        def run() -> float:
            s = CompiledSession.from_weights(model.config, model.weights, n_ctx=700, threads=THREADS, weights_key=model.key,
                                precision=precision, max_chunk=chunk)
            timed_run(s, ids[:16], 0)  # warm-up: the weights faulted in, the pool started
            seconds = timed_run(s, ids, 0)[0]
            s.close()
            return seconds
        return run

    engines = {f"nanocompile {precision}, chunk {c}": ours(c) for c in chunks}
    for run in engines.values():  # builds (or finds) every library before the first round
        run()
    peer_name = f"llama.cpp {PEER[precision].upper()}"
    llama = LlamaCpp(requantized(Path(model.source), PEER[precision], cache_dir() / "requantized"), 700, THREADS)
    timed_run(llama, ids[:16], 0)

    def peer() -> float:
        return timed_run(llama, ids, 0)[0]

    engines[peer_name] = peer
    speeds = {name: [] for name in engines}
    names = list(engines)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            time.sleep(0.2)  # the last engine's threads spin for a while after its call
            speeds[name].append(512 / engines[name]())
        print(f"round {r}: " + ", ".join(f"{n} {speeds[n][-1]:.0f}" for n in names), flush=True)
    ratios = {n: [a / b for a, b in zip(speeds[n], speeds[peer_name])] for n in names[:-1]}
    for n in names:
        line = f"{n}: pp512 median {statistics.median(speeds[n]):.0f} t/s [{min(speeds[n]):.0f}-{max(speeds[n]):.0f}]"
        if n in ratios:
            line += f", / {peer_name} median {statistics.median(ratios[n]):.2f} [{min(ratios[n]):.2f}-{max(ratios[n]):.2f}]"
        print(line)
    append({"bench": "chunk", "precision": precision, "rounds": rounds, "pp": 512,
            "engines": {n: summary(v) for n, v in speeds.items()},
            "ratio_to_peer": {n: summary(v) for n, v in ratios.items()}, "samples": speeds})


if __name__ == "__main__":
    main()
