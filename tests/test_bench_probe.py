"""bench/probes/machine.c (the machine probe) and dot_steps.c build at every x86-64 level the project meets (AVX2 with
and without AVX-VNNI, AVX-512 with and without VNNI): the AVX-512 and VNNI parts compile only where the level has them."""
import shutil
import subprocess
import sys
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


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_dot_steps_probe_builds_without_warnings(level, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on this machine")
    r = subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-pthread", *LEVELS[level],
                        str(PROBE.with_name("dot_steps.c")), "-o", str(tmp_path / "dot_steps")], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr


def test_dot_steps_probe_reports_every_step_on_this_cpu():
    """Every mix is timed on this CPU (cycles a step, positive), at one thread and at two; the
    256-bit vpdpbusd where the CPU has VNNI at 256 bits, null where it has not."""
    from bench.probes.dot_steps import measure

    from nanocompile.target import cpu_flags

    flags = cpu_flags()
    vnni = {"avx512_vnni", "avx512vl"} <= flags or "avx_vnni" in flags
    for threads in (1, 2):
        r = measure(threads)
        assert r["threads"] == threads and r["clock_ghz"] > 0.1
        steps = r["cycles_per_step"]
        assert set(steps) == {"signed", "unsigned", "pairs", "int16", "vpmaddubsw", "vpsignb", "vpdpbusd_256"}
        assert all(v > 0 for k, v in steps.items() if k != "vpdpbusd_256")
        assert (steps["vpdpbusd_256"] is not None) == vnni and (not vnni or steps["vpdpbusd_256"] > 0)


AMX_PROBE = PROBE.with_name("amx.c")
AMX_LEVELS = {"avx2": ["-march=x86-64-v3"], "avx512+vnni": ["-march=x86-64-v4", "-mavx512vnni"],
              "avx512+vnni+amx": ["-march=x86-64-v4", "-mavx512vnni", "-mamx-tile", "-mamx-int8"]}


@pytest.mark.parametrize("source", ["amx.c", "amx_superblock.c"])
@pytest.mark.parametrize("level", sorted(AMX_LEVELS))
def test_amx_probe_builds_without_warnings(level, source, tmp_path):
    """bench/probes/amx.c and amx_superblock.c build at AVX2 (where they only say they need AVX-512
    VNNI), at AVX-512 VNNI without AMX (the VNNI form alone) and with it."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on this machine")
    flags = AMX_LEVELS[level] + (["-mavx512vbmi"] if "amx" in level else [])
    r = subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", "-pthread", *flags,
                        str(PROBE.with_name(source)), "-o", str(tmp_path / "amx")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_amx_products_equal_the_vnni_form_bit_for_bit():
    """Where the CPU has AMX-INT8 and AVX-512 VNNI: the probe's two AMX forms of a block-quantized
    product (the weights' columns or the activations' rows as the tiles' rows) give the float sums
    the kernels' VNNI form gives, bit for bit (the integer block sums are exact, the rescale is
    the same operations in the same order), at 8 and 16 rows, one thread and two."""
    from bench.probes.amx import measure

    from nanocompile.target import cpu_flags

    lacking = {"avx512_vnni", "amx_int8", "amx_tile"} - cpu_flags()
    if lacking:
        pytest.skip(f"this CPU lacks {', '.join(sorted(lacking))}")
    for rows in (8, 16):
        for threads in (1, 2):
            r = measure(threads, rows)
            if "amx" in r:  # the kernel refused tile data
                pytest.skip(r["amx"])
            assert r["amx_equal_vnni"] is True, r
            assert r["vnni_gmac_s"] > 0 and r["amx_rows_gmac_s"] > 0, r


def test_amx_superblock_products_equal_the_interpreters_definition_bit_for_bit():
    """Where the CPU has AMX-INT8 and AVX-512 VNNI: a Q4_K and a Q6_K product over 96 rows, with
    the sub-scales moved into the weights (split in two int8 halves) and the mins a third tile
    product, give the float sums of the interpreter's superblock_matmul bit for bit, as the VNNI
    form does, at one thread and two."""
    from bench.probes.amx import measure_superblock

    from nanocompile.target import cpu_flags

    lacking = {"avx512_vnni", "avx512vbmi", "amx_int8", "amx_tile"} - cpu_flags()
    if lacking:
        pytest.skip(f"this CPU lacks {', '.join(sorted(lacking))}")
    for fmt in ("Q4_K", "Q6_K"):
        for threads in (1, 2):
            r = measure_superblock(threads, 1, fmt)
            if "amx" in r:  # the kernel refused tile data
                pytest.skip(r["amx"])
            assert r["format"] == fmt and r["vnni_equal_reference"] is True and r["amx_equal_reference"] is True, r
            assert r["vnni_gmac_s"] > 0 and r["amx_gmac_s"] > 0, r


def test_amx_probe_refuses_a_thread_count_it_cannot_run(tmp_path):
    """bench.probes.amx --threads 0: one line, nothing built or appended."""
    root = Path(__file__).parents[1]
    r = subprocess.run([sys.executable, "-m", "bench.probes.amx", "--threads", "0"], cwd=root, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == "amx.py: error: argument --threads: '0': a whole number, at least 1"
