"""How many rows a projection's register tile holds: the real model compiled with the AVX-512
recipe's row tile (and the vector accumulators it may use) set to each candidate, alternating in
one process, two threads, pp512 per round. The columns per tile follow from the accumulator
budget (4 vectors of 16 columns, 2 for SwiGLU's two matmuls). Every variant reads the same
packed weights file (the row tile does not change the layout).

    python -m bench.probes.row_tile [--rounds 3] [--tiles 4,6,7,8]
"""
from __future__ import annotations

import argparse
import statistics

from bench.support.measure import THREADS, append, pin_threads, summary, timed_run

pin_threads()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tiles", default="4,6,7,8")
    ap.add_argument("--pp", type=int, default=512)
    args = ap.parse_args()
    import numpy as np

    import nanocompile.schedule.recipes as recipes
    from nanocompile.engine.compiled import CompiledSession
    from nanocompile.models import load_model
    from nanocompile.target import detect_march, vector_lanes

    model = load_model("default", progress=False)
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 150000, args.pp)]
    sessions = {}
    saved = dict(recipes.TILES)
    lanes = vector_lanes(detect_march()[0])
    columns = {16: 4, 8: 2}[lanes]  # the recipe's column vectors per row at this width
    for rows in map(int, args.tiles.split(",")):
        recipes.TILES[lanes] = (rows, columns * rows)
        sessions[rows] = CompiledSession.from_weights(model.config, model.weights, args.pp + 8, THREADS, model.key)
    recipes.TILES.update(saved)
    samples = {rows: [] for rows in sessions}
    for r in range(args.rounds):
        order = list(sessions)[r % len(sessions):] + list(sessions)[:r % len(sessions)]
        for rows in order:
            seconds, _ = timed_run(sessions[rows], prompt, 1)
            samples[rows].append(args.pp / seconds)
    print("| row tile | accumulators | pp t/s median | min | max |\n|---|---|---|---|---|")
    for rows, s in samples.items():
        print(f"| {rows} | {4 * rows} | {statistics.median(s):.1f} | {min(s):.1f} | {max(s):.1f} |")
    append({"bench": "row_tile", "pp": args.pp, "rounds": args.rounds,
            "engines": {f"rows {rows}": {f"pp{args.pp}": summary(s)} for rows, s in samples.items()}})


if __name__ == "__main__":
    main()
