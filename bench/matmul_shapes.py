"""Every matmul shape of the default model, at 1 row (decode) and 64 rows (a prefill chunk):
(bench/phase4 runs this first, in the same process as its other measurements)
the scheduled C kernel (the recipe this CPU gets, through the graph harness), NumPy's x @ W.T
(its BLAS at two threads) and the roofline, max(bytes / read bandwidth, flops / vector peak),
from a probe run in the same process. Engines alternate within each round.

    python -m bench.matmul_shapes [--rounds 5]
"""
from __future__ import annotations

import argparse
import statistics
import time

from bench.common import THREADS, append, pin_threads, summary, vector_peak

pin_threads(THREADS)

SHAPES = {  # name: (K inputs, N outputs), in the order a layer runs them
    "q_proj, o_proj": (896, 896),
    "k_proj, v_proj": (896, 128),
    "gate_proj, up_proj": (896, 4864),
    "down_proj": (4864, 896),
    "lm_head": (896, 151936),
}


COLD_BYTES = 512e6  # more than every cache


def _graph(k: int, n: int):
    from nanocompile.ir import SEQ, GraphBuilder
    b = GraphBuilder(f"matmul_{k}x{n}")
    b.output("y", b.matmul(b.input("x", [SEQ, k]), b.permute(b.weight("w", [n, k]), [1, 0])))
    return b.finish()


def _time(fn, repeat: int) -> float:
    best = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best.append(time.perf_counter() - t0)
    return statistics.median(best)


HEADER = ("| shape | K x N | rows | nanocompile us, median | numpy us | roofline us | roofline / nanocompile |\n"
          "|---|---|---|---|---|---|---|")


def measure(rounds: int, machine: dict) -> list[dict]:
    """Every shape at 1 and 64 rows; prints a table row as each is measured."""
    import numpy as np

    from nanocompile.codegen.graph_library import GraphLibrary

    print(HEADER)
    rng = np.random.default_rng(0)
    bw, peak = machine["read_gb_s"]["median"] * 1e9, vector_peak(machine)["median"] * 1e9
    rows = []
    for name, (k, n) in SHAPES.items():
        lib = GraphLibrary(_graph(k, n), max_seq=64, schedule="default")
        w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        for m in (1, 64):
            x = rng.standard_normal((m, k)).astype(np.float32)
            # copies of the weights, used in turn, so that each call reads its weights from
            # memory as decode does, not from a cache the previous call filled
            copies = [w] + [w.copy() for _ in range(max(0, int(COLD_BYTES // w.nbytes)))]
            runs = [lib.bind({"seq": m, "past": 0}, {"x": x}, {"w": c}, threads=THREADS) for c in copies]
            turn = {"c": 0, "np": 0}

            def run_c():
                turn["c"] = (turn["c"] + 1) % len(runs)
                return runs[turn["c"]]()

            def run_np():
                turn["np"] = (turn["np"] + 1) % len(copies)
                return x @ copies[turn["np"]].T

            engines = {"nanocompile": run_c, "numpy": run_np}
            got = np.asarray(runs[0]()[-1])
            assert np.allclose(got, x @ w.T, rtol=1e-3, atol=1e-3), name
            samples = {e: [] for e in engines}
            inner = 3 if n * k * 4 > 1e8 else 20
            for r in range(rounds):
                for e in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
                    # the other engine's threads spin for a while after its call (OpenBLAS's and
                    # our pool's both): let them sleep, or the two pools share two cores
                    time.sleep(0.2)
                    engines[e]()
                    samples[e].append(_time(engines[e], inner))
            nbytes, flops = 4 * (n * k + m * k + m * n), 2 * m * n * k
            roof = max(nbytes / bw, flops / peak)
            row = {"shape": name, "K": k, "N": n, "rows": m, "roofline_us": roof * 1e6,
                   **{e: summary([t * 1e6 for t in s]) for e, s in samples.items()}}
            rows.append(row)
            c, npy = row["nanocompile"]["median"], row["numpy"]["median"]
            print(f"| {name} | {k}x{n} | {m} | {c:9.1f} (min {row['nanocompile']['min']:.1f}) | {npy:9.1f} | "
                  f"{roof * 1e6:9.1f} | {roof * 1e6 / c:5.0%} |", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from bench import probe

    machine = probe.measure()
    rows = measure(args.rounds, machine)
    append({"bench": "matmul_shapes", "rounds": args.rounds, "probe": machine, "rows": rows})


if __name__ == "__main__":
    main()
