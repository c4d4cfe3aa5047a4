"""bench/probes/chunk.py, bench/probes/without.py, bench/probes/superblock_tile.py,
bench/probes/setting.py, bench/probes/pages.py, the machine probes and bench/support/siblings.py refuse arguments they
cannot run in one line, before loading anything."""
import os
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


@pytest.mark.parametrize("args, why", [
    (["PrefetchNext", "--rounds", "0"], "--rounds and --pp at least 1, --tg and --verify at least 0 (got 0, 512, 16, 0)"),
    (["PrefetchNext", "--verify", "-1"], "--rounds and --pp at least 1, --tg and --verify at least 0 (got 40, 512, 16, -1)"),
    (["PrefetchNext", "--rounds", "x"], "argument --rounds: invalid int value: 'x'"),
    (["Split"], "argument directive: invalid choice: 'Split' (choose from 'AmxSums', 'FetchNextBlock', 'PairSums', 'PrefetchNext', 'Unpack')")])
def test_directive_ab_refuses_what_it_cannot_run(args, why):
    """bench/probes/without.py: rounds below 1, a number that is not one, a directive the recipes
    do not hold: one line, nothing loaded."""
    r = subprocess.run([sys.executable, "-m", "bench.probes.without", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == f"without.py: error: {why}"


@pytest.mark.parametrize("args, why", [
    (["--march", "x86-64-v9"], "argument --march: unknown x86-64 level 'x86-64-v9'; known: x86-64, x86-64-v2, x86-64-v3, x86-64-v4"),
    (["-m", "/nonexistent/model.gguf"], "/nonexistent/model.gguf: no such file or directory")])
def test_page_size_probe_refuses_what_it_cannot_run(args, why):
    """bench/probes/pages.py: a level the compiler does not know, a model that is not there: one
    line, nothing packed, nothing appended to the results."""
    results = ROOT / "bench" / "results.jsonl"
    before = results.read_bytes()
    r = subprocess.run([sys.executable, "-m", "bench.probes.pages", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == f"pages.py: error: {why}"
    assert results.read_bytes() == before


@pytest.mark.c
def test_directive_ab_runs_two_different_libraries(tmp_path):
    """The A/B's library less the directive is built apart from the cache: the recipes' library
    (found or built under its key) holds the directive, the other none (before, the second could be
    the first, found under the same key). The tiny GGUF with K formats, native, one round."""
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import write_k_gguf

    path = write_k_gguf(tmp_path / "k.gguf")
    env = {**os.environ, "NANOCOMPILE_CACHE": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "bench.probes.without", "FetchNextBlock", "-m", str(path), "--precision",
                        "native", "--rounds", "2", "--pp", "12", "--tg", "1", "--verify", "8", "--no-append"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "FetchNextBlock in " in r.stdout and "none in the other" in r.stdout, r.stdout
    assert "verify: recipes / less FetchNextBlock" in r.stdout, r.stdout


@pytest.mark.parametrize("args, why", [
    (["2B"], "argument sizes: invalid choice: '2B' (choose from '1.5B', '3B', '7B')"),
    (["1.5B", "--threads", "0"], "argument --threads: '0': a whole number, at least 1")])
def test_siblings_refuse_a_size_or_thread_count_they_cannot_make(args, why, tmp_path):
    """bench/support/siblings.py: one line, nothing written."""
    env = {**os.environ, "NANOCOMPILE_SIBLINGS": str(tmp_path / "siblings")}
    r = subprocess.run([sys.executable, "-m", "bench.support.siblings", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == f"python -m bench.support.siblings: error: {why}"
    assert not (tmp_path / "siblings").exists()


def test_requantized_types_are_llamas_ftypes(tmp_path):
    """bench/support/requantized.py names each type by the llama_ftype llama.h gives it, and refuses
    a type it does not know in one line, writing nothing."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is in the [model] extra")
    from bench.support.requantized import FTYPES

    for name, value in FTYPES.items():
        assert getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name}") == value, name
    env = {**os.environ, "NANOCOMPILE_SIBLINGS": str(tmp_path / "siblings")}
    r = subprocess.run([sys.executable, "-m", "bench.support.requantized", "Q7_0"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 2 and "argument kinds: invalid choice: 'Q7_0'" in r.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "siblings").exists()


@pytest.mark.parametrize("args, why", [
    (["--variants", "2:8,2:x"], "'2:x': a variant is COLUMNS:BUDGET, two whole numbers"),
    (["--variants", "0:24"], "'0:24': columns and budget at least 1"),
    (["--rounds", "0"], "--rounds and --pp at least 1, --tg and --verify at least 0"),
])
def test_superblock_tile_ab_refuses_what_it_cannot_run(args, why):
    r = subprocess.run([sys.executable, "-m", "bench.probes.superblock_tile", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == f"superblock_tile.py: error: {why}"


@pytest.mark.parametrize("args, why", [
    (["MIN_TILES", "2", "3"], "argument setting: 'MIN_TILES': a setting is MODULE:NAME, e.g. "
                              "nanocompile.schedule.unpack:MIN_TILES"),
    (["nanocompile.schedule.unpack:MIN_TILES", "{8: 3", "2"], "argument values: '{8: 3': a value is a Python literal "
                                                              "(a number, a tuple, a dict)"),
    (["nanocompile.schedule.unpack:MIN_TILES", "2"], "at least two values: the baseline, then the ones to compare "
                                                     "with it"),
    (["nanocompile.schedule.nowhere:MIN_TILES", "2", "3"], "no module nanocompile.schedule.nowhere"),
    (["nanocompile.schedule.unpack:MAX_TILES", "2", "3"], "nanocompile.schedule.unpack has no MAX_TILES"),
])
def test_setting_ab_refuses_what_it_cannot_run(args, why):
    r = subprocess.run([sys.executable, "-m", "bench.probes.setting", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == f"setting.py: error: {why}"


@pytest.mark.parametrize("probe", ["machine", "dot_steps"])
def test_machine_probes_refuse_a_thread_count_below_one(probe):
    r = subprocess.run([sys.executable, "-m", f"bench.probes.{probe}", "--threads", "0"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == f"{probe}.py: error: argument --threads: '0': a whole number, at least 1"


@pytest.mark.parametrize("args, why", [
    (["MIN_TILES", "2", "3"], "argument setting: 'MIN_TILES': a setting is MODULE:NAME, e.g. "
                              "nanocompile.schedule.unpack:MIN_TILES"),
    (["nanocompile.schedule.unpack:MIN_TILES", "2"], "the following arguments are required: values"),
    (["nanocompile.schedule.unpack:MAX_TILES", "2", "3"], "nanocompile.schedule.unpack has no MAX_TILES"),
    (["nanocompile.schedule.unpack:MIN_TILES", "2", "3", "--rows", "17"],
     "argument --rows: '17': the timing program takes 1 to 16 rows"),
    (["nanocompile.schedule.unpack:MIN_TILES", "2", "3", "--past", "5000"], "--past is at most 4096"),
])
def test_tree_ab_refuses_what_it_cannot_run(args, why):
    """bench/probes/tree_ab.py: one line, no tree written."""
    r = subprocess.run([sys.executable, "-m", "bench.probes.tree_ab", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == f"tree_ab.py: error: {why}"


@pytest.mark.c
def test_tree_ab_times_two_trees_that_compute_the_same(tmp_path):
    """Two trees of the tiny K-format GGUF written with Unpack's MIN_TILES at two values, each
    built and timed in its own process: the probe finds the same hash of the 8-row step's logits in
    every process (else it exits 1), prints each measure's ratio, keeps the trees where asked and
    appends nothing."""
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import write_k_gguf

    path = write_k_gguf(tmp_path / "k.gguf")
    results = ROOT / "bench" / "results.jsonl"
    before = results.read_bytes() if results.exists() else b""
    env = {**os.environ, "NANOCOMPILE_CACHE": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "bench.probes.tree_ab", "nanocompile.schedule.unpack:MIN_TILES",
                        "{8: 2, 16: 2}", "{8: 1, 16: 1}", "-m", str(path), "--rounds", "2", "--steps", "2",
                        "--past", "24", "--keep", str(tmp_path / "trees"), "--no-append"], cwd=ROOT,
                       capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "{8: 1, 16: 1} / {8: 2, 16: 2}, 2 rounds, processes alternated:" in r.stdout, r.stdout
    for label in ("prompt", "one", "8 rows"):
        assert f"  {label} " in r.stdout, r.stdout
    assert (tmp_path / "trees" / "baseline" / "tree_steps").exists()
    assert (tmp_path / "trees" / "variant" / "tree_steps").exists()
    assert (results.read_bytes() if results.exists() else b"") == before
