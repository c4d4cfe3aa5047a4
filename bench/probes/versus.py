"""Engines side by side on one model file: each round runs every engine in a process of its own
(the report's speed worker), in alternating order, and times pp (a prompt into an empty cache)
and tg (tokens one at a time after it). Ratios are per round, ours over the peer's, and their
median is the figure; medians, minima and spread of each engine's rates beside them. Each of our
engines runs once before the rounds (a first run packs and builds); its peak memory is reported
apart from the rounds'.

    python -m bench.probes.versus nc-native llama-file                      # this CPU's builds
    python -m bench.probes.versus nc-native@x86-64-v3 llama-file@avx2       # both built for AVX2
    python -m bench.probes.versus nc-native llama-file -m big.gguf --rounds 3 --pp 512 --tg 64

An engine@build is one built otherwise (bench/report/engines.engine_named): our library built for
an x86-64 level (NANOCOMPILE_MARCH), llama.cpp from another interpreter built for AVX2 only
(NANOCOMPILE_BENCH_AVX2_PYTHON). Engines are judged in pairs as named: the first against the
second, the third against the fourth, ... Appends to
bench/results.jsonl with the CPU, the levels the engines were built for and every round.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench.report.engines import engine_named, launch, missing
from bench.report.jobs import Run, WorkerError, run_worker
from bench.support.measure import THREADS, append, summary, two_sided_sign_test


def model_files(source: str, engines: list) -> dict:
    """What the workers open: the model for nanocompile, the file (or llama.cpp's requantization of
    it, written once into the cache) for llama.cpp."""
    from nanocompile.cache.location import cache_root
    from nanocompile.models import load_model

    path = Path(load_model(source, progress=False).source)
    files = {"source": str(path), "file": str(path)}
    for weights in {e.weights for e in engines if e.family == "llama.cpp"} - {"file"}:
        from bench.support.peer import requantized

        files[weights] = str(requantized(path, weights, cache_root().path / "requantized"))
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engines", nargs="+", help="engine ids (bench/report/engines.py), optionally @build")
    ap.add_argument("-m", "--model", default="default")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=THREADS)
    args = ap.parse_args()
    if args.rounds < 1 or args.pp < 1 or args.tg < 2:
        raise SystemExit("--rounds and --pp must be at least 1, --tg at least 2")
    engines = [engine_named(name) for name in args.engines]
    for e in engines:
        why = missing(e)
        if why:
            raise SystemExit(f"{e.id} cannot run here: {why}")
    from nanocompile.models import load_model

    vocab = load_model(args.model, progress=False).config.vocab_size
    files = model_files(args.model, engines)
    ops = [{"kind": "pp", "n": args.pp, "start": 0, "name": "pp"},
           {"kind": "tg", "n": args.tg, "start": args.pp, "name": "tg"}]
    spec = {"files": files, "threads": args.threads, "n_ctx": args.pp + args.tg + 8, "vocab": vocab,
            "sequences": [ops]}
    # an engine named in two pairs runs once a round: a round's ratios are of runs side by side
    # (before, it ran twice and the pairs' ratios took its runs in turn, out of step with the rounds)
    distinct = list({e.id: e for e in engines}.values())
    rates = {e.id: {"pp": [], "tg": []} for e in engines}
    rss = {e.id: [] for e in engines}
    first_run_rss, first_run_open = {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        run = Run(Path(scratch))
        # our first run of a file may pack its weights and build a library; it is run once before
        # the rounds, so they time and measure what every later run does, and its peak is kept apart
        for e in distinct:
            if e.family == "nanocompile":
                python, env = launch(e)
                try:
                    out = run_worker(run, "speed", {**spec, "engine": e.id}, args.threads, env, python)
                except WorkerError as err:
                    raise SystemExit(f"{e.id}: {err}") from None
                first_run_rss[e.id] = out["process"]["peak_rss_bytes"]
                first_run_open[e.id] = out["open_s"]
                print(f"{e.id}'s first run: opened in {out['open_s']:.1f} s (packing and building where the cache "
                      f"had neither)", flush=True)
        for r in range(args.rounds):
            for e in distinct if r % 2 == 0 else distinct[::-1]:
                python, env = launch(e)
                try:
                    out = run_worker(run, "speed", {**spec, "engine": e.id}, args.threads, env, python)
                except WorkerError as err:
                    raise SystemExit(f"{e.id}: {err}") from None
                for test in ("pp", "tg"):
                    rates[e.id][test].append(out["tests"][test]["t_s"])
                rss[e.id].append(out["process"]["peak_rss_bytes"])
            print(f"round {r}: " + ", ".join(f"{e.id} pp {rates[e.id]['pp'][-1]:.1f} tg {rates[e.id]['tg'][-1]:.2f} t/s"
                                             for e in distinct), flush=True)
    result = {"bench": "versus", "model": files["source"], "engines": [e.id for e in engines], "pp": args.pp,
              "tg": args.tg, "rounds": args.rounds, "builds": {e.id: e.build or "this CPU" for e in engines},
              "rates": {e: {t: summary(v) for t, v in by.items()} for e, by in rates.items()},
              "peak_rss_bytes": {e: max(v) for e, v in rss.items()}, "first_run_peak_rss_bytes": first_run_rss,
              "first_run_open_s": first_run_open,
              "by_round": rates, "pairs": []}
    for i in range(0, len(engines) - 1, 2):
        ours, peer = engines[i].id, engines[i + 1].id
        pair = {"ours": ours, "peer": peer}
        for test in ("pp", "tg"):
            ratios = [a / b for a, b in zip(rates[ours][test], rates[peer][test])]
            wins = sum(x > 1 for x in ratios)
            pair[f"{test}_ratio"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                                     "faster_in": wins, "p": two_sided_sign_test(wins, len(ratios))}
            print(f"{test}{args.pp if test == 'pp' else args.tg}: {ours} / {peer} {statistics.median(ratios):.3f}x "
                  f"(rounds {', '.join(f'{x:.2f}' for x in ratios)}; faster in {wins} of {len(ratios)})")
        pair["rss_ratio"] = result["peak_rss_bytes"][ours] / result["peak_rss_bytes"][peer]
        print(f"peak RSS: {ours} {result['peak_rss_bytes'][ours] / 2**20:.0f} MiB, "
              f"{peer} {result['peak_rss_bytes'][peer] / 2**20:.0f} MiB ({pair['rss_ratio']:.2f}x)")
        if ours in first_run_rss:
            pair["first_run_rss_ratio"] = first_run_rss[ours] / result["peak_rss_bytes"][peer]
            print(f"peak RSS of {ours}'s first run (packing, building): {first_run_rss[ours] / 2**20:.0f} MiB "
                  f"({pair['first_run_rss_ratio']:.2f}x)")
        result["pairs"].append(pair)
    append(result)


if __name__ == "__main__":
    main()
