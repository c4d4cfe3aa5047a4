"""How long each Python-only test tier takes here: `pytest -m fast` (the gate: under a minute)
and `pytest -m slow`, each in a fresh process from the repository's root, wall time from the
parent (Python's start included) and pytest's own count and time.

    python -m bench.probes.tiers [--tiers fast,slow]     # appends to bench/results.jsonl
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from bench.support.measure import append

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = re.compile(r"(\d+) passed(?:, (\d+) \w+)*.* in ([\d.]+)s")
TIERS = ("fast", "slow", "c", "model")  # tests/tiers.py


def tier_names(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",")]
    unknown = [t for t in names if t not in TIERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown tier {', '.join(map(repr, unknown))}: the tiers are {', '.join(TIERS)}")
    return names


def run_tier(tier: str) -> dict:
    t0 = time.perf_counter()
    # -P: the tests import the installed package, not the source tree at the working directory
    r = subprocess.run([sys.executable, "-P", "-m", "pytest", "-m", tier, "-q", "-p", "no:cacheprovider"], cwd=ROOT,
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    found = SUMMARY.search(last)
    if r.returncode != 0 or found is None:
        raise SystemExit(f"pytest -m {tier} did not pass (exit status {r.returncode}): {last or r.stderr[-400:]}")
    return {"passed": int(found.group(1)), "pytest_s": float(found.group(3)), "wall_s": round(wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiers", type=tier_names, default="fast,slow")
    args = ap.parse_args()
    tiers = {}
    for tier in args.tiers:
        tiers[tier] = run_tier(tier)
        print(f"pytest -m {tier}: {tiers[tier]['passed']} passed in {tiers[tier]['pytest_s']:.1f} s "
              f"({tiers[tier]['wall_s']:.1f} s wall)")
    append({"bench": "tiers", "tiers": tiers})


if __name__ == "__main__":
    main()
