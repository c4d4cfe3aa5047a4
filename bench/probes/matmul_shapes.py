"""Every matmul shape of the default model, at 1 row (decode) and 64 rows (a prefill chunk):
(bench/phase4 and bench/phase6 run this first, in the same process as their other measurements)
the scheduled C kernel (the recipe this CPU gets, through the graph harness), and the roofline,
max(bytes / read bandwidth, operations / peak), from a probe run in the same process.

float32: the kernel against NumPy's x @ W.T (its BLAS at two threads), alternating within each
round; the peak is the probe's vector multiply-add. int8: block_matmul on quantized activations
and Q8_0 weights (the quantization of the activations is a separate kernel, not timed here);
the peak is the probe's int8 dot product, the bytes the weights' 34 per 32 values.

native: every stored format (Q8_0, Q5_0, Q4_0, Q4_K, Q5_K, Q6_K) at the default model's shapes
and the 1.5B sibling's, at 1 row and 96 (a prefill chunk), as the native library runs them (the
quants in 4, 5 or 6 bits wherever the target has vector dot products); the bytes are the packed
weights' as the kernel reads them. Where the recipe unpacks a narrow weight once per column block
(schedule/unpack.py), the recipe less Unpack runs beside it, and on a target with AMX the recipe
less AmxSums (schedule/tiles.py), alternated round by round.
--march runs a level below this CPU's (x86-64-v3: the AVX2 kernels on an AVX-512 machine).

    python -m bench.probes.matmul_shapes [--rounds 5] [--precision f32|int8|native] [--march LEVEL]
                                         [--formats Q4_K,Q6_K]
"""
from __future__ import annotations

import argparse
import statistics
import time

from bench.support.measure import THREADS, append, pin_threads, summary, vector_peak

pin_threads(THREADS)

SHAPES = {  # name: (K inputs, N outputs), in the order a layer runs them
    "q_proj, o_proj": (896, 896),
    "k_proj, v_proj": (896, 128),
    "gate_proj, up_proj": (896, 4864),
    "down_proj": (4864, 896),
    "lm_head": (896, 151936),
}


# native: (name, K, N, the stored format): the default model's projections, then every other
# format the descriptions know at a shape it takes (K formats need rows of whole 256s)
NATIVE_SHAPES = [("q_proj, o_proj", 896, 896, "Q5_0"), ("k_proj, v_proj", 896, 128, "Q5_0"),
                 ("v_proj", 896, 128, "Q8_0"), ("gate_proj, up_proj", 896, 4864, "Q5_0"),
                 ("down_proj", 4864, 896, "Q4_K"), ("down_proj", 4864, 896, "Q6_K"),
                 ("gate_proj, up_proj", 896, 4864, "Q4_0"), ("gate_proj, up_proj", 896, 4864, "Q8_0"),
                 ("down_proj", 4864, 896, "Q5_K"),
                 ("1.5B gate_proj, up_proj", 1536, 8960, "Q4_K"), ("1.5B down_proj", 8960, 1536, "Q6_K")]
NATIVE_ROWS = (1, 96)  # a decode step; a prefill chunk (DEFAULT_CHUNK)

COLD_BYTES = 512e6  # more than every cache


def _graph(k: int, n: int, precision: str = "f32"):
    from nanocompile.ir import SEQ, GraphBuilder
    b = GraphBuilder(f"matmul_{k}x{n}_{precision}")
    if precision == "int8":
        y = b.block_matmul(b.input("xq", [SEQ, k], "i8"), b.input("xd", [SEQ, k // 32]), b.weight("wq", [n, k], "i8"),
                           b.weight("wd", [n, k // 32], "f16"))
    else:
        y = b.matmul(b.input("x", [SEQ, k]), b.permute(b.weight("w", [n, k]), [1, 0]))
    b.output("y", y)
    return b.finish()


def _native(k: int, n: int, kind: str, m: int, rng):
    """(graph, inputs, weights, reference y, schedule for the graph library, weight bytes read) for
    a [n, k] matrix stored in `kind`, run as the native library runs it."""
    import numpy as np

    from nanocompile.frontend import nn
    from nanocompile.ir import SEQ, GraphBuilder, interpreter
    from nanocompile.models.formats import format_named
    from nanocompile.models.quantize import (narrow_storage, quantize_q8_0, split_exact, split_superblocks,
                                             superblock_form)
    from nanocompile.schedule.recipes import NARROW_LANES, default_schedule
    from nanocompile.schedule.program import with_tile_sums
    from nanocompile.target import detect_march, dot_weight_offset, has_amx, vector_lanes

    fmt = format_named(kind)
    raw = rng.integers(0, 256, (n, k // fmt.block, fmt.nbytes), dtype=np.uint8)
    for f in fmt.fields:  # finite, small scales
        if f.dtype == "f16":
            scale = (rng.random((n, k // fmt.block, f.count)) * 0.01 + 1e-3).astype(np.float16)
            raw[:, :, f.offset:f.offset + f.nbytes] = scale.view(np.uint8).reshape(n, k // fmt.block, -1)
    b = GraphBuilder(f"native_{kind}_{k}x{n}")
    xq = b.input("xq", [SEQ, k], "i8")
    if superblock_form(fmt):
        w = split_superblocks(raw, fmt, n, k)
        xd = b.input("xd", [SEQ, k // fmt.block])
        nodes = [b.weight(name, list(a.shape), {"i1": "i8", "f2": "f16"}[a.dtype.kind + str(a.itemsize)])
                 for name, a in w.items()]
        # with the activations' sums, as nn.linear_k passes them (their small kernel is timed too)
        sums = nn.sub_block_sums(b, xq, k // fmt.sub)
        b.output("y", b.superblock_matmul(xq, xd, *nodes, xs=sums))
        inputs = {"xq": rng.integers(-127, 128, (m, k)).astype(np.int8),
                  "xd": (rng.random((m, k // fmt.block)) * 0.01).astype(np.float32)}
        want = interpreter.superblock_matmul(inputs["xq"], inputs["xd"], *w.values())
    else:
        if kind == "Q8_0":  # as a quantizer writes it: within [-127, 127]
            qs, d = quantize_q8_0((rng.standard_normal((n, k)) * 0.05).astype(np.float32))
        else:
            qs, d = split_exact(raw, fmt, n, k)
        w = {"wq": qs, "wd": d}
        b.output("y", b.block_matmul(xq, b.input("xd", [SEQ, k // 32]), b.weight("wq", [n, k], "i8"),
                                     b.weight("wd", [n, k // 32], "f16"), nn.sub_block_sums(b, xq, k // 32)))
        inputs = {"xq": rng.integers(-127, 128, (m, k)).astype(np.int8),
                  "xd": (rng.random((m, k // 32)) * 0.01).astype(np.float32)}
        want = interpreter.block_matmul(inputs["xq"], inputs["xd"], qs, d)
    march = detect_march()[0]
    lanes, offset = vector_lanes(march), dot_weight_offset(march)
    storage = narrow_storage(fmt) if lanes in NARROW_LANES else None  # 4-6 bits wherever dot products are vectors
    quants = next(iter(w))

    def schedule(kernel):
        # p1 is the activations (read first); the other reads are the weights. Of the int8 ones
        # only the quants can be narrow (the recipe's choice), so naming all of them is enough
        weights = frozenset(p.name for p in kernel.params if p.access == "read" and p.name != "p1")
        narrow = {p.name: storage for p in kernel.params if p.name in weights and p.dtype == "i8"} if storage else {}
        recipe = default_schedule(kernel, lanes, weights, dot_offset=offset, narrow=narrow)
        return with_tile_sums(kernel, recipe) if has_amx(march) else recipe  # as schedule_program does

    bits = storage[0] if storage else 8
    nbytes = sum(a.nbytes for a in w.values()) - w[quants].nbytes * (8 - bits) // 8
    return b.finish(), inputs, w, want, schedule, nbytes


def _operands(k: int, n: int, m: int, precision: str, rng):
    """(inputs, weights, reference y) for one shape."""
    import numpy as np

    if precision == "int8":
        from nanocompile.ir import interpreter
        from nanocompile.models.quantize import quantize_q8_0
        wq, wd = quantize_q8_0((rng.standard_normal((n, k)) * 0.05).astype(np.float32))
        xq = rng.integers(-127, 128, (m, k)).astype(np.int8)
        xd = (rng.random((m, k // 32)) * 0.01).astype(np.float32)
        return {"xq": xq, "xd": xd}, {"wq": wq, "wd": wd}, interpreter.block_matmul(xq, xd, wq, wd)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    return {"x": x}, {"w": w}, x @ w.T


def _time(fn, repeat: int) -> float:
    best = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best.append(time.perf_counter() - t0)
    return statistics.median(best)


HEADER = ("| shape | K x N | rows | nanocompile us, median | numpy us | roofline us | roofline / nanocompile |\n"
          "|---|---|---|---|---|---|---|")


def measure(rounds: int, machine: dict, precision: str = "f32") -> list[dict]:
    """Every shape at 1 and 64 rows; prints a table row as each is measured."""
    import numpy as np

    from nanocompile.compiler.graph_library import GraphLibrary

    print(HEADER)
    rng = np.random.default_rng(0)
    bw = machine["read_gb_s"]["median"] * 1e9
    peak = (machine["int8_dot_gmac_s"]["median"] if precision == "int8" else vector_peak(machine)["median"]) * 1e9
    rows = []
    for name, (k, n) in SHAPES.items():
        lib = GraphLibrary(_graph(k, n, precision), max_seq=64, schedule="default")
        for m in (1, 64):
            inputs, weights, want = _operands(k, n, m, precision, rng)
            # copies of the weights, used in turn, so that each call reads its weights from
            # memory as decode does, not from a cache the previous call filled
            size = sum(w.nbytes for w in weights.values())
            copies = [weights] + [{key: w.copy() for key, w in weights.items()}
                                  for _ in range(max(0, int(COLD_BYTES // size)))]
            runs = [lib.bind({"seq": m, "past": 0}, inputs, c, threads=THREADS) for c in copies]
            turn = {"c": 0, "np": 0}

            def run_c():
                turn["c"] = (turn["c"] + 1) % len(runs)
                return runs[turn["c"]]()

            def run_np():
                turn["np"] = (turn["np"] + 1) % len(copies)
                return inputs["x"] @ copies[turn["np"]]["w"].T

            engines = {"nanocompile": run_c} if precision == "int8" else {"nanocompile": run_c, "numpy": run_np}
            got = np.asarray(runs[0]()[-1])
            if precision == "int8":
                assert np.array_equal(got, want), name  # exact: integer sums, the float part in order
            else:
                assert np.allclose(got, want, rtol=1e-3, atol=1e-3), name
            samples = {e: [] for e in engines}
            inner = 3 if n * k * 4 > 1e8 else 20
            for r in range(rounds):
                for e in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
                    # the other engine's threads spin for a while after its call (OpenBLAS's and
                    # our pool's both): let them sleep, or the two pools share two cores
                    time.sleep(0.2)
                    engines[e]()
                    samples[e].append(_time(engines[e], inner))
            nbytes = size + sum(x.nbytes for x in inputs.values()) + 4 * m * n
            roof = max(nbytes / bw, (m * n * k if precision == "int8" else 2 * m * n * k) / peak)
            row = {"shape": name, "K": k, "N": n, "rows": m, "precision": precision, "roofline_us": roof * 1e6,
                   **{e: summary([t * 1e6 for t in s]) for e, s in samples.items()}}
            rows.append(row)
            c = row["nanocompile"]["median"]
            npy = f"{row['numpy']['median']:9.1f}" if "numpy" in row else "—"
            print(f"| {name} | {k}x{n} | {m} | {c:9.1f} (min {row['nanocompile']['min']:.1f}) | {npy} | "
                  f"{roof * 1e6:9.1f} | {roof * 1e6 / c:5.0%} |", flush=True)
    return rows


def measure_native(rounds: int, machine: dict, formats=None) -> list[dict]:
    """Every stored format at 1 and 96 rows, as the native library runs them; beside a recipe that
    unpacks a narrow weight (schedule/unpack.py), the recipe less Unpack, alternated."""
    import numpy as np

    from nanocompile.compiler.graph_library import GraphLibrary
    from nanocompile.schedule import AmxSums, PairSums, Unpack

    print("| shape | K x N | format | rows | schedule | nanocompile us, median | roofline us | roofline / nanocompile |\n"
          "|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    bw = machine["read_gb_s"]["median"] * 1e9
    peak = machine["int8_dot_gmac_s"]["median"] * 1e9
    rows = []
    for name, k, n, kind in NATIVE_SHAPES:
        if formats and kind not in formats:
            continue
        for m in NATIVE_ROWS:
            g, inputs, weights, want, schedule, wbytes = _native(k, n, kind, m, rng)
            copies = [weights] + [{key: a.copy() for key, a in weights.items()}
                                  for _ in range(max(0, int(COLD_BYTES // wbytes)))]
            engines = {"recipe": GraphLibrary(g, max_seq=max(NATIVE_ROWS), schedule=schedule)}
            for kind_of, mark in ((Unpack, "nc_unpack"), (PairSums, "nc_pairs_"), (AmxSums, "nc_tile_sums(")):
                if mark in engines["recipe"].source:
                    def less(kernel, kind_of=kind_of):  # what each directive gives (AmxSums goes with Unpack)
                        drop = (kind_of, AmxSums) if kind_of is Unpack else kind_of
                        return tuple(d for d in schedule(kernel) if not isinstance(d, drop))
                    engines[f"less {kind_of.__name__}"] = GraphLibrary(g, max_seq=max(NATIVE_ROWS), schedule=less)
            runs, turn = {}, {}
            for e, lib in engines.items():
                runs[e] = [lib.bind({"seq": m, "past": 0}, inputs, c, threads=THREADS) for c in copies]
                turn[e] = 0
                assert np.array_equal(np.asarray(runs[e][0]()[-1]), want), (name, kind, e)  # exact, as int8's

            def call(e):
                turn[e] = (turn[e] + 1) % len(runs[e])
                return runs[e][turn[e]]()

            samples = {e: [] for e in engines}
            for r in range(rounds):
                for e in list(engines) if r % 2 == 0 else list(engines)[::-1]:
                    time.sleep(0.2)
                    call(e)
                    samples[e].append(_time(lambda: call(e), 20 if m == 1 else 5))
            nbytes = wbytes + sum(x.nbytes for x in inputs.values()) + 4 * m * n
            roof = max(nbytes / bw, m * n * k / peak)
            for e, s in samples.items():
                row = {"shape": name, "K": k, "N": n, "format": kind, "rows": m, "precision": "native", "schedule": e,
                       "weight_bytes": wbytes, "roofline_us": roof * 1e6, "nanocompile": summary([t * 1e6 for t in s])}
                rows.append(row)
                c = row["nanocompile"]["median"]
                print(f"| {name} | {k}x{n} | {kind} | {m} | {e} | {c:9.1f} (min {row['nanocompile']['min']:.1f}) | "
                      f"{roof * 1e6:9.1f} | {roof * 1e6 / c:5.0%} |", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--precision", choices=["f32", "int8", "native"], default="f32")
    ap.add_argument("--formats", default=None, help="native: these stored formats only (Q4_K,Q6_K)")
    ap.add_argument("--march", default=None, help="an x86-64 level below this CPU's (NANOCOMPILE_MARCH)")
    args = ap.parse_args()
    if args.march:
        import os

        from nanocompile.target import FORCE, detect_march
        os.environ[FORCE] = args.march
        detect_march()  # refuses a level this CPU cannot run, in one line
    from bench.probes import machine as probe

    machine = probe.measure()
    formats = args.formats.split(",") if args.formats else None
    rows = measure_native(args.rounds, machine, formats) if args.precision == "native" else \
        measure(args.rounds, machine, args.precision)
    from nanocompile.target import detect_march

    append({"bench": "matmul_shapes", "rounds": args.rounds, "precision": args.precision, "probe": machine,
            "march": detect_march()[0], "rows": rows})


if __name__ == "__main__":
    main()
