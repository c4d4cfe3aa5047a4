"""What AMX's tile product would give a block-quantized projection over a few rows against the
AVX-512 VNNI form the kernels use (bench/probes/amx.c): compute rates at 8 and 16 rows, the data in
L1/L2, and whether the AMX forms' float sums equal the VNNI form's bit for bit. --superblock: a
K-format projection over a prefill chunk of 96 rows instead (bench/probes/amx_superblock.c: Q4_K
and Q6_K, the sub-scales moved into the weights so one tile product spans a super-block; the two
forms alternating, each checked bit for bit against the interpreter's definition).

    python -m bench.probes.amx [--threads 2] [--superblock [--rounds 5]]
                                                 # prints JSON lines; appends to bench/results.jsonl
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from bench.support.measure import THREADS, append, machine, positive_int

SOURCE = Path(__file__).with_name("amx.c")
SUPERBLOCK_SOURCE = Path(__file__).with_name("amx_superblock.c")


def build(out: Path, amx: bool, source: Path = SOURCE) -> None:
    flags = ["-march=native"] + (["-mamx-tile", "-mamx-int8"] if amx else [])
    subprocess.run(["cc", "-O3", "-Wall", "-ffp-contract=off", "-pthread", *flags, str(source), "-o", str(out)],
                   check=True)


def measure(threads: int, rows: int) -> dict:
    from nanocompile.target import cpu_flags

    with tempfile.TemporaryDirectory() as d:
        exe = Path(d) / "amx"
        build(exe, "amx_int8" in cpu_flags())
        return json.loads(subprocess.run([str(exe), str(threads), str(rows)], capture_output=True, text=True,
                                         check=True).stdout)


def measure_superblock(threads: int, rounds: int, fmt: str) -> dict:
    """The Q4_K or Q6_K product over 96 rows, VNNI and AMX forms alternating for rounds."""
    from nanocompile.target import cpu_flags

    with tempfile.TemporaryDirectory() as d:
        exe = Path(d) / "amx_superblock"
        build(exe, "amx_int8" in cpu_flags(), SUPERBLOCK_SOURCE)
        return json.loads(subprocess.run([str(exe), str(threads), str(rounds), fmt], capture_output=True, text=True,
                                         check=True).stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=positive_int, default=THREADS)
    ap.add_argument("--superblock", action="store_true", help="K formats over a prefill chunk (amx_superblock.c)")
    ap.add_argument("--rounds", type=positive_int, default=5, help="with --superblock: alternating rounds")
    args = ap.parse_args()
    if args.superblock:
        results = [measure_superblock(threads, min(args.rounds, 100), fmt) for fmt in ("Q4_K", "Q6_K")
                   for threads in sorted({1, args.threads})]
    else:
        results = [measure(threads, rows) for rows in (8, 16) for threads in sorted({1, args.threads})]
    for r in results:
        print(json.dumps(r))
    append({"bench": "amx_superblock" if args.superblock else "amx", "machine": machine(), "results": results})


if __name__ == "__main__":
    main()
