"""pp512 and tg64 of the default model at 1 and 2 threads, each session opened anew, twice in
alternation: a quick look at what a second thread gains (docs/POOL.md, the stall floor).

    python -m bench.probes.threads [int8|f32|native]      # appends to bench/results.jsonl
"""
from __future__ import annotations

import sys

import numpy as np

from bench.support.measure import append, timed_run


def main() -> None:
    from nanocompile.engine.compiled import CompiledSession
    from nanocompile.models import load_model

    precision = sys.argv[1] if len(sys.argv) > 1 else "int8"
    model = load_model("default", progress=False)
    ids = [int(t) for t in np.random.default_rng(0).integers(1000, 100000, 512)]
    runs = []
    for threads in (1, 2, 1, 2):
        s = CompiledSession.from_weights(model.config, model.weights, n_ctx=700, threads=threads, weights_key=model.key,
                            precision=precision)
        s.step(ids[:16])  # warm-up
        prefill, steps = timed_run(s, ids, 64)
        pp, tg = len(ids) / prefill, len(steps) / sum(steps)
        print(f"{precision} threads {threads}: pp512 {pp:.0f} t/s, tg64 {tg:.1f} t/s", flush=True)
        runs.append({"threads": threads, "pp512": pp, "tg64": tg})
        s.close()
    append({"bench": "pp_tg", "precision": precision, "runs": runs})


if __name__ == "__main__":
    main()
