"""Measures the machine (bench/probe.c): read bandwidth and vector peak at two threads, appended
to bench/results.jsonl; rooflines elsewhere are computed from the latest of these.

    python -m bench.probes.machine [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from bench.support.measure import RESULTS, THREADS, append


def measure(threads: int = THREADS) -> dict:
    src = Path(__file__).with_name("machine.c")
    with tempfile.TemporaryDirectory() as d:
        exe = Path(d) / "probe"
        subprocess.run(["cc", "-O2", "-march=native", "-ffp-contract=off", "-pthread", str(src), "-o", str(exe)],
                       check=True)
        out = subprocess.run([str(exe), str(threads)], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def latest() -> dict | None:
    """The most recent probe result recorded, or None."""
    if not RESULTS.exists():
        return None
    found = None
    for line in RESULTS.read_text().splitlines():
        record = json.loads(line)
        if record.get("bench") == "probe" and not record.get("discard"):
            found = record["probe"]
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=THREADS)
    result = measure(ap.parse_args().threads)
    print(json.dumps(result))
    append({"bench": "probe", "probe": result})


if __name__ == "__main__":
    main()
