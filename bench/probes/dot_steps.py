"""What the 8-lane dot steps cost on this CPU, in cycles per step, on every thread at once
(bench/probes/dot_steps.c): the floor under a verify step's rows at 8 lanes without VNNI, where
they are compute-bound (docs/results/phase20.md). Appended to bench/results.jsonl.

    python -m bench.probes.dot_steps [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from bench.support.measure import THREADS, append, positive_int


def measure(threads: int = THREADS) -> dict:
    src = Path(__file__).with_name("dot_steps.c")
    with tempfile.TemporaryDirectory() as d:
        exe = Path(d) / "dot_steps"
        subprocess.run(["cc", "-O2", "-march=native", "-pthread", str(src), "-o", str(exe)], check=True)
        out = subprocess.run([str(exe), str(threads)], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=positive_int, default=THREADS)
    result = measure(ap.parse_args().threads)
    print(json.dumps(result))
    append({"bench": "dot_steps", "dot_steps": result})


if __name__ == "__main__":
    main()
