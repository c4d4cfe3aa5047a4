"""The generated source tree as a C developer uses it: generate, build with CMake, run the C
driver (also under AddressSanitizer and UndefinedBehaviorSanitizer), and agree with Python."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from bench.support.tiny import random_weights, tiny_config, write_gguf

from nanocompile.compiler.build import cmake_build
from nanocompile.engine.compiled import CompiledSession
from nanocompile.models import load_model

pytestmark = [pytest.mark.c, pytest.mark.levels]


@pytest.fixture(scope="module")
def tiny_tree(tmp_path_factory):
    d = tmp_path_factory.mktemp("tree")
    cfg = tiny_config(hidden=36, heads=6, kv_heads=2, head_dim=6, ffn=50, layers=2, vocab=300)
    gguf = write_gguf(d / "tiny.gguf", cfg, random_weights(cfg, seed=11), quantize=False)
    env_cache = {"NANOCOMPILE_CACHE": str(d / "cache")}
    r = subprocess.run([sys.executable, "-m", "nanocompile.generate", "-m", str(gguf), "--out", str(d / "src")],
                       capture_output=True, text=True, env={**os.environ, **env_cache})
    assert r.returncode == 0, r.stderr
    return d, gguf


def _driver(build_dir):
    return next(p for p in build_dir.iterdir() if p.name.endswith("_driver"))


def _run_driver(build_dir, weights, steps=6, tokens=(5, 17, 42, 7), threads=None):
    """threads: NANOCOMPILE_THREADS, the thread count before the prompt and each step, cycled."""
    env = {**os.environ, "NANOCOMPILE_THREADS": threads} if threads else None
    r = subprocess.run([str(_driver(build_dir)), str(weights), str(steps), *map(str, tokens)],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def _fnv(logits: np.ndarray) -> str:
    h = 1469598103934665603
    for byte in logits.astype(np.float32).tobytes():
        h ^= byte
        h = (h * 1099511628211) % (1 << 64)
    return f"{h:016x}"


def test_tree_builds_and_the_driver_agrees_with_python_bitwise(tiny_tree, monkeypatch):
    d, gguf = tiny_tree
    src = d / "src"
    for name in ("model.c", "model.h", "driver.c", "CMakeLists.txt", "sources.cmake", "manifest.json",
                 "runtime/nc_runtime.c", "runtime/nc_runtime.h", "cmake/nanocompile.cmake", "weights.bin"):
        assert (src / name).exists(), name
    log = cmake_build(src, d / "build")
    assert "warning:" not in log, log  # generated C compiles clean under -Wall -Wextra
    lines = _run_driver(d / "build", src / "weights.bin")

    monkeypatch.setenv("NANOCOMPILE_CACHE", str(d / "cache"))
    model = load_model(gguf, progress=False)
    s = CompiledSession.from_weights(model.config, model.weights, n_ctx=32)
    logits = s.step([5, 17, 42, 7])
    expected = [f"prompt 4 top {int(np.argmax(logits))} fnv {_fnv(logits)}"]
    for i in range(6):
        logits = s.step([int(np.argmax(logits))])
        expected.append(f"step {i} top {int(np.argmax(logits))} fnv {_fnv(logits)}")
    # then the driver's batched steps (three slots): the same numbers from the Python side
    s0, s1, s2 = s.sequences(3)
    prompt = [5, 17, 42, 7]
    last, two = s.step_batch([(s1, prompt, False), (s2, prompt[:2], True)])
    rows = [last, *two]
    expected += [f"batch {i} top {int(np.argmax(r))} fnv {_fnv(r)}" for i, r in enumerate(rows)]
    vocab = s.vocab
    nxt = [int(np.argmax(last)) % vocab, int(np.argmax(two[-1])) % vocab, int(np.argmax(logits)) % vocab]
    rows = [r[0] for r in s.step_batch([(s1, [nxt[0]]), (s2, [nxt[1]]), (s0, [nxt[2]])])]
    expected += [f"batch step {i} top {int(np.argmax(r))} fnv {_fnv(r)}" for i, r in enumerate(rows)]
    assert [re.sub(r" sum .*", "", line) for line in lines] == expected


SANITIZED_THREADS = (1, 2, 3, 8)  # test_schedules' thread counts, each one also running the prompt
PROMPT = (5, 17, 42, 7, 99, 3, 250, 11, 64, 8, 120, 31)


def test_sanitizer_build_runs_clean(tiny_tree):
    """AddressSanitizer and UndefinedBehaviorSanitizer over the library and its thread pool: the
    pool resized before every step, the prompt run at each thread count once."""
    d, _ = tiny_tree
    build = d / "build-asan"
    cmake_build(d / "src", build, {"CMAKE_BUILD_TYPE": "Debug", "NANOCOMPILE_SANITIZE": "ON"})
    flags = (build / "CMakeCache.txt").read_text()
    assert "NANOCOMPILE_SANITIZE:BOOL=ON" in flags
    release = d / "build"
    if not release.exists():
        cmake_build(d / "src", release)
    want = _run_driver(release, d / "src" / "weights.bin", steps=10, tokens=PROMPT)
    n = len(SANITIZED_THREADS)
    for i in range(n):
        threads = ",".join(str(SANITIZED_THREADS[(i + j) % n]) for j in range(n))
        assert _run_driver(build, d / "src" / "weights.bin", steps=10, tokens=PROMPT, threads=threads) == want


def test_driver_refuses_a_weights_file_for_another_model(tiny_tree, tmp_path):
    d, _ = tiny_tree
    build = d / "build"
    if not build.exists():
        cmake_build(d / "src", build)
    bad = tmp_path / "other.bin"
    data = bytearray((d / "src" / "weights.bin").read_bytes())
    data[24] = ord("0") if data[24] != ord("0") else ord("1")  # another layout hash
    bad.write_bytes(bytes(data))
    r = subprocess.run([str(_driver(build)), str(bad), "1"], capture_output=True, text=True)
    assert r.returncode == 1
    assert "does not match this library" in r.stderr
