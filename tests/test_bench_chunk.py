"""bench/chunk.py and bench/prefetch.py refuse arguments they cannot run in one line, before loading anything."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.mark.parametrize("chunks, why", [("64,x", "chunk sizes are whole numbers separated by commas"),
                                         ("96,0", "a chunk holds at least 1 row")])
def test_chunk_sizes_that_cannot_be_built_are_refused(chunks, why):
    r = subprocess.run([sys.executable, "-m", "bench.probes.chunk", "f32", chunks], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == f"chunk.py: error: argument chunks: {chunks!r}: {why}"


@pytest.mark.parametrize("rounds, why", [("0", "rounds: at least 1, not 0"),
                                         ("x", "argument rounds: invalid int value: 'x'")])
def test_prefetch_ab_refuses_rounds_it_cannot_run(rounds, why):
    """bench/prefetch.py: a number of rounds below 1 (or not a number) in one line, nothing loaded."""
    r = subprocess.run([sys.executable, "-m", "bench.probes.prefetch", rounds], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == f"prefetch.py: error: {why}"
