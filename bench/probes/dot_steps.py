"""What the 8-lane dot steps cost on this CPU, in cycles per step, on every thread at once
(bench/probes/dot_steps.c): the floor under a verify step's rows at 8 lanes without VNNI, where
they are compute-bound (docs/results/phase20.md). Appended to bench/results.jsonl.

    python -m bench.probes.dot_steps [--threads 2]
"""
from __future__ import annotations

from bench.probes.machine import probe_main, run_probe
from bench.support.measure import THREADS


def measure(threads: int = THREADS) -> dict:
    return run_probe("dot_steps.c", threads)


def main() -> None:
    probe_main("dot_steps", measure, __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
