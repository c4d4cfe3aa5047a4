"""Phase 6: int8. Reported as llama-bench reports (pp512, tg128, tokens per second), medians and
minima beside the means; every engine at two threads, alternating in one run, on the same weights:

    nanocompile int8 (Q8_0's numbers; activations quantized in blocks of 32; exact int32 dots)
    nanocompile f32 (the same model's float32 library)
    llama.cpp Q8_0 (a GGUF llama.cpp writes from the default file: the same int8 weights, bit for
                    bit, tests/test_int8_model.py)

and, in the same process: the probe (read bandwidth, the vector and int8 dot peaks, probed just
before and after our int8 engine in each round), every int8 matmul shape at 1 and 64 rows
against its roofline, and a per-kernel profile of a decode step and of a prompt. Gates: decode
at >= 90% of the int8 roofline (bytes per step from the loop IR over the bandwidth) and >= 1.6x
llama.cpp Q8_0; prefill pp512 >= 2x llama.cpp Q8_0 and >= 1.5x our float32.

    python -m bench.history.phase6 [--pp 512] [--tg 128] [--rounds 3] [--shape-rounds 3] [--no-llama]
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench.support.measure import THREADS, append, pin_threads, timed_run
from bench.history.common import alternate, engine_table

pin_threads()

INT8, F32, LLAMA = "nanocompile int8", "nanocompile f32", "llama.cpp Q8_0"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shape-rounds", type=int, default=3, help="rounds of the int8 matmul shapes (0: skip)")
    ap.add_argument("--no-llama", action="store_true")
    args = ap.parse_args()

    import numpy as np

    from bench.probes import machine as probe, matmul_shapes
    from bench.support.peer import LlamaCpp
    from bench.probes.profile import print_profile, profile
    from nanocompile.cache.location import cache_root
    from nanocompile.engine.open import open_session
    from nanocompile.loopir.work import bytes_per_run
    from nanocompile.models import load_model
    from bench.support.peer import requantized

    shapes, shape_probe = [], None
    if args.shape_rounds:
        shape_probe = probe.measure()
        shapes = matmul_shapes.measure(args.shape_rounds, shape_probe, "int8")
    model = load_model("default", progress=False)
    n_ctx = args.pp + args.tg + 8
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 150000, args.pp)]
    sessions = {p: open_session(model, "compiled", n_ctx=n_ctx, threads=THREADS, precision=p) for p in ("int8", "f32")}
    engines = {INT8: lambda: timed_run(sessions["int8"], prompt, args.tg),
               F32: lambda: timed_run(sessions["f32"], prompt, args.tg)}
    if not args.no_llama:
        q8 = requantized(Path(model.source), "q8_0", cache_root().path / "requantized")
        llama = LlamaCpp(q8, n_ctx, THREADS)
        engines[LLAMA] = lambda: timed_run(llama, prompt, args.tg)

    pp, tg, per_round, probes = alternate(engines, args.rounds, args.pp, probed=INT8)
    results = engine_table(engines, pp, tg, args.pp, args.tg)

    bandwidth = statistics.median(p["read_gb_s"]["median"] for p in probes)
    int8_peak = statistics.median(p["int8_dot_gmac_s"]["median"] for p in probes)
    past = args.pp + args.tg // 2
    decode_bytes = bytes_per_run(sessions["int8"].module.variants["last"]).evaluate({"seq": 1, "past": past})
    fractions = [decode_bytes / (r["read_gb_s"] * 1e9) / r[INT8]["step_s"] for r in per_round]
    print(f"\nint8 decode: {decode_bytes / 1e6:.1f} MB per step at past {past} (float32: "
          f"{bytes_per_run(sessions['f32'].module.variants['last']).evaluate({'seq': 1, 'past': past}) / 1e6:.1f} MB); "
          f"bandwidth by round {[round(r['read_gb_s'], 1) for r in per_round]} GB/s; the roofline's step time over "
          f"ours by round {[f'{f:.0%}' for f in fractions]}, median {statistics.median(fractions):.1%} (gate 90%)")
    ratios = {"pp_vs_f32": [r[INT8]["pp"] / r[F32]["pp"] for r in per_round]}
    if LLAMA in engines:
        ratios["pp_vs_llama"] = [r[INT8]["pp"] / r[LLAMA]["pp"] for r in per_round]
        ratios["tg_vs_llama"] = [r[LLAMA]["step_s"] / r[INT8]["step_s"] for r in per_round]
    gates = {"pp_vs_f32": 1.5, "pp_vs_llama": 2.0, "tg_vs_llama": 1.6}
    for key, values in ratios.items():
        print(f"{key}: by round {[round(v, 3) for v in values]}, median {statistics.median(values):.3f}x "
              f"(gate {gates[key]}x)")
    print(f"probe: read {bandwidth:.1f} GB/s, int8 dot {int8_peak:.0f} GMAC/s "
          f"({probes[0]['int8_dot_gmac_s']['kind']}), median of {len(probes)}")

    prof = profile(model, prompt[:128], sessions["int8"].module)
    print_profile(prof, 10)
    append({"bench": "phase6", "pp": args.pp, "tg": args.tg, "rounds": args.rounds, "engines": results,
            "decode_bytes": decode_bytes, "roofline_fraction_by_round": fractions, "ratios_by_round": ratios,
            "per_round": per_round, "probes": probes, "profile_int8": prof,
            "matmul_shapes": {"probe": shape_probe, "rows": shapes} if shapes else None})


if __name__ == "__main__":
    main()
