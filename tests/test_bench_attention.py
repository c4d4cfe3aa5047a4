"""bench/attention_ab.py refuses a depth it cannot measure in one line, before loading anything."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.mark.parametrize("depth", ["1000", "64", "deep"])
def test_a_depth_the_keys_blocks_cannot_hold_is_refused(depth):
    r = subprocess.run([sys.executable, "-m", "bench.probes.attention", depth], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip() == (f"attention_ab: depth {depth!r}: a multiple of 64 from 128 on (keys are packed in "
                                f"blocks of up to 64 positions)")
