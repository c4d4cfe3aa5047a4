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

from bench.support.measure import RESULTS, THREADS, append, positive_int


def run_probe(source: str, threads: int, *flags: str) -> dict:
    """bench/probes/<source> built for this CPU and run on `threads` threads: the JSON it prints."""
    src = Path(__file__).with_name(source)
    with tempfile.TemporaryDirectory() as d:
        exe = Path(d) / src.stem
        subprocess.run(["cc", "-O2", "-march=native", *flags, "-pthread", str(src), "-o", str(exe)], check=True)
        out = subprocess.run([str(exe), str(threads)], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def measure(threads: int = THREADS) -> dict:
    return run_probe("machine.c", threads, "-ffp-contract=off")


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


def probe_main(bench: str, measure, description: str | None = None) -> None:
    """A probe's command line: --threads, the result printed and appended as {bench: result}."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--threads", type=positive_int, default=THREADS)
    result = measure(ap.parse_args().threads)
    print(json.dumps(result))
    append({"bench": bench, bench: result})


def main() -> None:
    probe_main("probe", measure)


if __name__ == "__main__":
    main()
