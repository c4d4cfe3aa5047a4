"""bench/chunk.py refuses chunk sizes it cannot build in one line, before loading anything."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.mark.parametrize("chunks, why", [("64,x", "chunk sizes are whole numbers separated by commas"),
                                         ("96,0", "a chunk holds at least 1 row")])
def test_chunk_sizes_that_cannot_be_built_are_refused(chunks, why):
    r = subprocess.run([sys.executable, "-m", "bench.chunk", "f32", chunks], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == f"chunk.py: error: argument chunks: {chunks!r}: {why}"
