"""bench/probes/machine.c (the machine probe) builds at every x86-64 level the project meets (AVX2 with and without AVX-VNNI,
AVX-512 with and without VNNI): the AVX-512 and VNNI parts compile only where the level has them."""
import shutil
import subprocess
from pathlib import Path

import pytest

PROBE = Path(__file__).parents[1] / "bench" / "probes" / "machine.c"
LEVELS = {"avx2": ["-march=x86-64-v3"], "avx2+avxvnni": ["-march=x86-64-v3", "-mavxvnni"],
          "avx512": ["-march=x86-64-v4"], "avx512+vnni": ["-march=x86-64-v4", "-mavx512vnni"]}

pytestmark = pytest.mark.c


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_probe_builds_without_warnings(level, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on this machine")
    r = subprocess.run([cc, "-O2", "-Wall", "-Werror", "-ffp-contract=off", "-pthread", *LEVELS[level], str(PROBE),
                        "-o", str(tmp_path / "probe"), "-lm"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
