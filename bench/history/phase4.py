"""Phase 4: schedules. Reported as llama-bench reports (pp512, tg128, tokens per second), with
medians and minima beside the means; every engine at two threads, alternating in one run:

    nanocompile, scheduled (the recipes: vector code, packed weights, register tiles, the pool)
    nanocompile, unscheduled (phase 3's library, one thread)
    llama.cpp through llama-cpp-python, on an F32 GGUF of the same weights
    transformers eager

every matmul shape at 1 and 64 rows (bench.probes.matmul_shapes: C, NumPy, roofline), and the decode
step against the bandwidth roofline (bytes per step from the loop IR over the read bandwidth,
the mean of bench/probe's measurements just before and just after our engine in each round).

    python -m bench.history.phase4 [--pp 512] [--tg 128] [--rounds 2] [--no-baseline] [--shape-rounds 5]
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench.support.measure import THREADS, append, pin_threads, timed_run, vector_peak
from bench.history.common import alternate, engine_table

pin_threads()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unscheduled library (slow)")
    ap.add_argument("--shape-rounds", type=int, default=5, help="rounds of bench.probes.matmul_shapes (0: skip)")
    args = ap.parse_args()

    import numpy as np
    import torch

    torch.set_num_threads(THREADS)
    from bench.support.oracle import Transformers

    from bench.probes import machine as probe
    from nanocompile.cache.location import cache_dir
    from nanocompile.engine.compiled import CompiledSession
    from nanocompile.loopir.work import bytes_per_run
    from nanocompile.models import load_model

    probes = []  # the machine is measured in every round, between the engines: its bandwidth drifts
    shapes = []
    if args.shape_rounds:
        from bench.probes import matmul_shapes
        shape_probe = probe.measure()
        shapes = matmul_shapes.measure(args.shape_rounds, shape_probe)
    model = load_model("default", progress=False)
    n_ctx = args.pp + args.tg + 8
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, 150000, args.pp)]

    scheduled = CompiledSession.from_weights(model.config, model.weights, n_ctx, THREADS, model.key)
    engines = {"nanocompile scheduled": lambda: timed_run(scheduled, prompt, args.tg)}
    if not args.no_baseline:
        unscheduled = CompiledSession.from_weights(model.config, model.weights, n_ctx, 1, model.key, schedule=False)
        engines["nanocompile unscheduled"] = lambda: timed_run(unscheduled, prompt, args.tg)
    if not args.no_llama:
        from bench.support.peer import LlamaCpp, requantized
        f32 = requantized(Path(model.source), "f32", cache_dir() / "requantized")
        llama = LlamaCpp(f32, n_ctx, THREADS)
        engines["llama.cpp F32"] = lambda: timed_run(llama, prompt, args.tg)
    oracle = Transformers(model.config, model.weights, THREADS)
    engines["transformers eager"] = lambda: timed_run(oracle, prompt, args.tg)

    pp, tg, per_round, round_probes = alternate(engines, args.rounds, args.pp, probed="nanocompile scheduled")
    probes += round_probes

    probes = [{"read_gb_s": p["read_gb_s"], "vector_mul_add_gflop_s": vector_peak(p)} for p in probes]
    machine = {key: {"median": statistics.median(p[key]["median"] for p in probes),
                     "min": min(p[key]["median"] for p in probes), "max": max(p[key]["median"] for p in probes)}
               for key in ("read_gb_s", "vector_mul_add_gflop_s")}
    decode_bytes = bytes_per_run(scheduled.module.variants["last"]).evaluate({"seq": 1, "past": args.pp + args.tg // 2})
    roofline_s = decode_bytes / (machine["read_gb_s"]["median"] * 1e9)
    results = engine_table(engines, pp, tg, args.pp, args.tg, {"nanocompile unscheduled": 1})
    ours = "nanocompile scheduled"
    fractions = [decode_bytes / (r["read_gb_s"] * 1e9) / r[ours]["step_s"] for r in per_round]
    fraction = statistics.median(fractions)
    print(f"\ndecode: {decode_bytes / 1e9:.3f} GB per step at past {args.pp + args.tg // 2}; read bandwidth by "
          f"round {[round(r['read_gb_s'], 1) for r in per_round]} GB/s; the roofline's step time over ours, by "
          f"round: {[f'{f:.0%}' for f in fractions]}, median {fraction:.1%} (gate: 95%)")
    ratios = {}
    if "llama.cpp F32" in results:
        ratios = {"pp": [r[ours]["pp"] / r["llama.cpp F32"]["pp"] for r in per_round],
                  "tg": [r["llama.cpp F32"]["step_s"] / r[ours]["step_s"] for r in per_round]}
        print(f"nanocompile / llama.cpp F32 by round: prefill {[round(x, 3) for x in ratios['pp']]} (median "
              f"{statistics.median(ratios['pp']):.3f}x, gate 2.5x), decode {[round(x, 3) for x in ratios['tg']]} "
              f"(median {statistics.median(ratios['tg']):.3f}x)")
    append({"bench": "phase4", "pp": args.pp, "tg": args.tg, "rounds": args.rounds, "engines": results,
            "decode_bytes": decode_bytes, "roofline_ms": roofline_s * 1e3, "roofline_fraction": fraction,
            "roofline_fraction_by_round": fractions, "ratios_to_llama_by_round": ratios, "per_round": per_round,
            "probe": machine, "matmul_shapes": {"probe": shape_probe, "rows": shapes} if shapes else None})


if __name__ == "__main__":
    main()
