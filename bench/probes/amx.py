"""What AMX's tile product would give a block-quantized projection over a few rows against the
AVX-512 VNNI form the kernels use (bench/probes/amx.c): compute rates at 8 and 16 rows, the data in
L1/L2, and whether the AMX forms' float sums equal the VNNI form's bit for bit.

    python -m bench.probes.amx [--threads 2]     # prints JSON lines; appends to bench/results.jsonl
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from bench.support.measure import THREADS, append, machine, positive_int

SOURCE = Path(__file__).with_name("amx.c")


def build(out: Path, amx: bool) -> None:
    flags = ["-march=native"] + (["-mamx-tile", "-mamx-int8"] if amx else [])
    subprocess.run(["cc", "-O3", "-Wall", "-ffp-contract=off", "-pthread", *flags, str(SOURCE), "-o", str(out)],
                   check=True)


def measure(threads: int, rows: int) -> dict:
    from nanocompile.target import cpu_flags

    with tempfile.TemporaryDirectory() as d:
        exe = Path(d) / "amx"
        build(exe, "amx_int8" in cpu_flags())
        return json.loads(subprocess.run([str(exe), str(threads), str(rows)], capture_output=True, text=True,
                                         check=True).stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=positive_int, default=THREADS)
    args = ap.parse_args()
    results = [measure(threads, rows) for rows in (8, 16) for threads in sorted({1, args.threads})]
    for r in results:
        print(json.dumps(r))
    append({"bench": "amx", "machine": machine(), "results": results})


if __name__ == "__main__":
    main()
