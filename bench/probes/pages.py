"""What the page size of the packed weights' mapping costs a step: the same packed file written
twice, in pieces of odd sizes under 2 MiB at unaligned offsets (as the packer wrote tensor by tensor before
cache/files.WRITE_PIECE: the page cache keeps such a file in 4 KiB folios until it is evicted)
and through the packer's writer (aligned 8 MiB pieces: 2 MiB folios where the kernel and
filesystem have them), each mapped by a fresh process that times steps of 1 and 8 rows after a
context (each rolled back), the two processes alternating round by round. Each process reports
how much of the weights it touched (the mapping's Rss: a step reads each weight the graph uses)
the kernel mapped in 2 MiB pages (FilePmdMapped).

    python -m bench.probes.pages [--precision native] [--rounds 4] [--steps 30] [--past 256]
                                 [-m FILE] [--march x86-64-v3]
                                 # prints a table; appends to bench/results.jsonl
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.support.measure import THREADS, append, pin_threads, positive_int, summary, x86_level

CHILD = """
import json, sys, time
from pathlib import Path
import numpy as np
from nanocompile.engine.compiled import CompiledSession
from nanocompile.models import load_model
path, precision, past, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
source, march = sys.argv[5], sys.argv[6] or None
model = load_model(source, progress=False)
s = CompiledSession.from_weights(model.config, model.weights, n_ctx=past + 16, threads={threads},
                                 weights_key=model.key, precision=precision, packed_path=path, march=march)
rng = np.random.default_rng(0)
s.step([int(t) for t in rng.integers(1000, 100000, past)])
seconds = {{1: [], 8: []}}
for r in range(steps + 1):
    for k in (1, 8):
        ids = [int(t) for t in rng.integers(1000, 100000, k)]
        t0 = time.perf_counter()
        s.step(ids, all_logits=True)
        if r:
            seconds[k].append(time.perf_counter() - t0)
        s.truncate(past)
start = s._weights.ctypes.data
pmd = rss = 0
inside = False
for line in open("/proc/self/smaps"):
    head = line.split()[0]
    if "-" in head and ":" not in head:
        lo, hi = (int(x, 16) for x in head.split("-"))
        inside = lo <= start < hi
    elif inside and line.startswith("FilePmdMapped:"):
        pmd = int(line.split()[1])
    elif inside and line.startswith("Rss:"):
        rss = int(line.split()[1])
print(json.dumps({{"seconds": seconds, "pmd_kib": pmd, "rss_kib": rss}}))
"""


def write_unaligned(source: Path, dest: Path) -> None:
    """source's bytes in pieces of odd sizes, as the packer wrote tensor by tensor."""
    sizes = itertools.cycle((4097, (1 << 20) + 3, 777, 300_001, 3 << 19))  # each under 2 MiB
    with open(source, "rb") as src, open(dest, "wb") as out:
        while piece := src.read(next(sizes)):
            out.write(piece)
        out.flush()
        os.fsync(out.fileno())


def write_pieces(source: Path, dest: Path) -> None:
    """source's bytes through the packer's writer."""
    from nanocompile.cache.files import AtomicFile

    with open(source, "rb") as src, AtomicFile(dest) as out:
        while piece := src.read(3 << 20):
            out.write(piece)


def main() -> None:
    ap = argparse.ArgumentParser(description="decode steps with the packed weights in 4 KiB against 2 MiB pages")
    ap.add_argument("--precision", default="native")
    ap.add_argument("--rounds", type=positive_int, default=4)
    ap.add_argument("--steps", type=positive_int, default=30)
    ap.add_argument("--past", type=positive_int, default=256)
    ap.add_argument("-m", "--model", default="default", help="'default', a GGUF file or a Hugging Face directory")
    ap.add_argument("--march", type=x86_level, default=None, help="another level than this CPU's, e.g. x86-64-v3 (AVX2)")
    args = ap.parse_args()
    pin_threads()
    from nanocompile.engine.compiled import CompiledSession
    from nanocompile.errors import ModelError
    from nanocompile.models import load_model
    from nanocompile.target import detect_march

    try:
        model = load_model(args.model, progress=False)
    except ModelError as e:
        ap.error(str(e))
    session = CompiledSession.from_weights(model.config, model.weights, n_ctx=64, threads=THREADS,
                                           weights_key=model.key, precision=args.precision, march=args.march)
    packed = session.packed_path
    session.close()
    results = {"unaligned writes": [], "packer's writer": []}
    pmd, rss = {}, {}
    with tempfile.TemporaryDirectory(prefix="nc-pages-", dir=packed.parent) as tmp:
        files = {"unaligned writes": Path(tmp) / "unaligned.bin", "packer's writer": Path(tmp) / "pieces.bin"}
        # one at a time, each on disk before the next: the other's dirty pages change how the
        # kernel allocates a file's folios
        write_pieces(packed, files["packer's writer"])
        write_unaligned(packed, files["unaligned writes"])
        child = CHILD.format(threads=THREADS)
        for r in range(args.rounds):
            order = list(files.items()) if r % 2 == 0 else list(files.items())[::-1]
            for name, path in order:
                out = subprocess.run([sys.executable, "-c", child, str(path), args.precision, str(args.past),
                                      str(args.steps), args.model, args.march or ""], capture_output=True, text=True, check=True)
                got = json.loads(out.stdout.strip().splitlines()[-1])
                results[name].append(got["seconds"])
                pmd[name], rss[name] = got["pmd_kib"], got["rss_kib"]
                one, eight = (statistics.median(got["seconds"][k]) for k in ("1", "8"))
                print(f"round {r} {name}: 1 row {one * 1e3:.1f} ms, 8 rows {eight * 1e3:.1f} ms, "
                      f"{got['pmd_kib'] >> 10} of the {got['rss_kib'] >> 10} MiB of weights it touched in 2 MiB "
                      f"pages", flush=True)
    record = {"bench": "pages", "model": str(model.source), "precision": args.precision,
              "march": args.march or detect_march()[0], "past": args.past,
              "pmd_kib": pmd, "touched_kib": rss, "rows": {}}
    print(f"\n| rows | unaligned writes, ms | packer's writer, ms | ratio of medians per round |")
    print("|---|---|---|---|")
    for k in ("1", "8"):
        a = [statistics.median(s[k]) for s in results["unaligned writes"]]
        b = [statistics.median(s[k]) for s in results["packer's writer"]]
        ratios = [x / y for x, y in zip(a, b)]
        record["rows"][k] = {"unaligned": summary(a), "pieces": summary(b), "ratios": ratios}
        print(f"| {k} | {statistics.median(a) * 1e3:.1f} | {statistics.median(b) * 1e3:.1f} | "
              f"{statistics.median(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)}) |")
    append(record)


if __name__ == "__main__":
    main()
