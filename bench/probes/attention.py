"""Attention's kernels at depth, the schedules before stop 21 against the recipes now: each
kernel of the int8 model's attention (scores, softmax's two kernels, probabilities times values)
compiled both ways side by side (the tuner's harness: checked bit for bit against the kernel as
lowered first), timed alternately at 2 threads for a decode row after depth - 1 positions and a
64-row chunk after depth - 64.

    python -m bench.probes.attention [depth]      # default 4096; appends to bench/results.jsonl
"""
from __future__ import annotations

import statistics
import sys

from bench.support.measure import THREADS, append
from nanocompile.schedule import apply
from nanocompile.schedule.directives import Pack, Parallel, Reorder, Split, UnrollJam, Vectorize
from nanocompile.target import vector_lanes
from nanocompile.tune.harness import KernelHarness, Shape
from nanocompile.tune.tuner import model_jobs

ROUNDS = 7


def schedules_before(lanes: int) -> dict:
    """The recipes' choices at stop 20 for vectors of `lanes`, by kernel name."""
    keys = 4 * lanes  # 4 vectors of keys per block
    return {
        "matmul_mul_2x7": (Split("i2", keys), Vectorize("i2i", lanes), UnrollJam("i2i", 4), Pack("p2", 128, keys),
                           Parallel("i1")),
        "rowreduce_exp_select_exp": (Parallel("i2"),),
        "rowreduce_div": (Parallel("i2"),),
        "matmul_store_2x7": (Vectorize("i2", lanes), Reorder("i1", "i2"), Split("i1", 8), UnrollJam("i1i", 8),
                             Parallel("i1o"), Parallel("i1t")),
    }


def main() -> None:
    from nanocompile.models import load_model

    depth = sys.argv[1] if len(sys.argv) > 1 else "4096"
    if not depth.isdigit() or int(depth) < 128 or int(depth) % 64:
        raise SystemExit(f"attention_ab: depth {depth!r}: a multiple of 64 from 128 on (keys are packed in "
                         f"blocks of up to 64 positions)")
    depth = int(depth)
    cfg = load_model("default", progress=False).config
    jobs, march = model_jobs(cfg, None, "int8")
    lanes = vector_lanes(march)
    if not lanes:
        raise SystemExit(f"attention_ab: {march} has no vector code; the schedules compared are vector schedules")
    BEFORE = schedules_before(lanes)
    shapes = [Shape("decode", 1, depth - 1), Shape("chunk", 64, depth - 64)]
    rows = []
    for job in jobs:
        key = next((k for k in BEFORE if job.name.startswith(k)), None)
        if key is None:
            continue
        now = job.schedules[job.recipe]
        h = KernelHarness(job.kernel, [apply(job.kernel, BEFORE[key]), apply(job.kernel, now)], job.buffers, march,
                          shapes)
        for which in (1, 2):
            problem = h.check(which, THREADS)
            assert problem is None, (job.name, problem)
        for shape in shapes:
            times = {1: [], 2: []}
            for r in range(ROUNDS):
                for which in ((1, 2) if r % 2 == 0 else (2, 1)):
                    times[which].append(h.seconds(which, shape, THREADS, 20 if shape.seq == 1 else 3))
            was, now_s = statistics.median(times[1]), statistics.median(times[2])
            print(f"{job.name[:44]:44} {shape.name:6} before {was * 1e6:9.1f} us  now {now_s * 1e6:9.1f} us  "
                  f"{was / now_s:.2f}x", flush=True)
            rows.append({"kernel": job.name, "shape": shape.name, "seq": shape.seq, "past": shape.past,
                         "before_s": times[1], "now_s": times[2], "speedup": was / now_s,
                         "before": [str(d) for d in BEFORE[key]], "now": [str(d) for d in now]})
    append({"bench": "attention_ab", "depth": depth, "march": march, "rows": rows})


if __name__ == "__main__":
    main()
