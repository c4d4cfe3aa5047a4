"""One open step (engine/open.py) behind every entry point, and the warm start (engine/warm.py):
a tiny GGUF that native runs entirely as stored (Q4_K and Q6_K down projections, Q5_0, Q8_0)
opens into the same library and the same packed weights file from `compile`, `run`, `bench`, the
Python API and `tune`'s kernels; a run whose library and weights are cached finds them by the key
of its inputs without compiling; the key changes with everything that reaches the generated C,
and the library's own fingerprint is still checked on load."""
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import write_k_gguf

from nanocompile.cache.files import read_record, write_record
from nanocompile.codegen.options import Options
from nanocompile.engine import warm
from nanocompile.engine.compiled import CompiledSession
from nanocompile.engine.open import open_model
from nanocompile.errors import ModelError
from nanocompile.models import load_model

pytestmark = pytest.mark.c
NC = [sys.executable, "-m", "nanocompile"]


@pytest.fixture()
def k_file(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("NANOCOMPILE_CACHE", str(cache))
    return write_k_gguf(tmp_path / "k.gguf"), cache, {**os.environ, "NANOCOMPILE_CACHE": str(cache)}


def cached(cache: Path, kind: str) -> list[Path]:
    """The libraries (libs/<fingerprint>/, beside their build trees) or packed weights files
    (packed/) in a cache."""
    pattern = {"libs": "*/*.so", "packed": "*.bin"}[kind]
    return sorted((cache / kind).glob(pattern))


def no_compiler(monkeypatch):
    """The compiler may not run in this process (a warm start must not need it)."""
    import nanocompile.compiler.driver as driver

    def refuse(*a, **k):
        raise AssertionError("the compiler ran")
    monkeypatch.setattr(driver, "compile_program", refuse)  # Opened.compile imports it from the driver when called


def test_every_entry_point_opens_the_file_into_one_library_and_one_weights_file(k_file, monkeypatch):
    path, cache, env = k_file
    r = subprocess.run([*NC, "compile", "-q", "-m", str(path)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "precision native" in r.stderr  # auto on a file native runs as stored
    libs, packed = cached(cache, "libs"), cached(cache, "packed")
    assert len(libs) == 1 and len(packed) == 1, (libs, packed)
    assert str(libs[0]) in r.stdout and str(packed[0]) in r.stdout

    # the next runs build nothing: the builder refuses, and they still run
    quiet = {**env, "NANOCOMPILE_NO_BUILD": "1"}
    r = subprocess.run([*NC, "run", "-q", "-m", str(path), "--prompt-ids", "1 2 3", "-n", "3", "--ids", "--temp", "0"],
                       capture_output=True, text=True, env=quiet)
    assert r.returncode == 0, r.stderr
    assert "precision native" in r.stderr and len(r.stdout.split()) == 3
    r = subprocess.run([*NC, "bench", "-q", "-m", str(path), "-p", "8", "-n", "2", "-r", "1", "-o", "json"],
                       capture_output=True, text=True, env=quiet)
    assert r.returncode == 0, r.stderr
    (row,) = [x for x in json.loads(r.stdout) if x["test"] == "pp8"]
    assert row["precision"] == "native"

    # the API opens the same library and weights without running the compiler
    no_compiler(monkeypatch)
    from nanocompile import Model

    model = Model(str(path), n_ctx=64, n_threads=1, progress=False)
    assert model.precision == "native" and model.session.warm
    assert model.session.lib.path == libs[0] and model.session.packed_path == packed[0]
    # bench sized native's weights as the library reads them, not as int8's 8-bit form
    assert row["model_size"] == model.session.weights_bytes == model.session.built.weights_bytes
    model.close()
    assert cached(cache, "libs") == libs and cached(cache, "packed") == packed


def test_bench_and_tune_on_a_native_file_use_natives_weights_and_kernels(k_file):
    path, cache, env = k_file
    model = load_model(path, progress=False)
    native = CompiledSession(open_model(model, "native"), n_ctx=32)
    int8 = CompiledSession(open_model(model, "int8"), n_ctx=32)
    assert native.weights_bytes < int8.weights_bytes  # K formats as stored, 4-6-bit storage where the target keeps it
    r = subprocess.run([*NC, "tune", "-q", "-m", str(path), "--precision", "native", "--budget", "1"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if "(native)" in line]
    assert lines and any("superblock projection" in line for line in lines)  # the K-format kernels native runs
    r = subprocess.run([*NC, "tune", "-q", "-m", str(path), "--precision", "int8", "--budget", "1"],
                       capture_output=True, text=True, env={**env, "NANOCOMPILE_CACHE": str(cache) + "-int8"},
                       timeout=600)
    assert r.returncode == 0 and "(int8)" in r.stdout and "superblock projection" not in r.stdout


def test_a_warm_start_finds_the_library_by_its_inputs_without_compiling(k_file, monkeypatch):
    path, cache, _ = k_file
    model = load_model(path, progress=False)
    first = CompiledSession(open_model(model), n_ctx=32)
    assert not first.warm
    logits = first.step([1, 2, 3])
    first.close()
    no_compiler(monkeypatch)
    again = CompiledSession(open_model(model), n_ctx=32)
    assert again.warm and again.lib.path == first.lib.path and again.packed_path == first.packed_path
    assert (again.step([1, 2, 3]) == logits).all()


def test_the_library_is_checked_against_its_record_on_load(k_file):
    path, cache, _ = k_file
    model = load_model(path, progress=False)
    opened = open_model(model)
    CompiledSession(opened, n_ctx=32).close()
    (record_file,) = sorted((cache / "warm").glob("*.json"))
    record = read_record(record_file)
    record["fingerprint"] = {**record["fingerprint"], "march": "x86-64-v2"}
    write_record(record_file, record)
    with pytest.raises(ModelError, match="compiled for a different march"):
        CompiledSession(opened, n_ctx=32)


def test_a_record_whose_library_is_gone_compiles_again(k_file):
    path, cache, _ = k_file
    model = load_model(path, progress=False)
    opened = open_model(model)
    first = CompiledSession(opened, n_ctx=32)
    first.close()
    shutil.rmtree(first.lib.path.parent)  # the cached library and its tree
    again = CompiledSession(opened, n_ctx=32)
    assert not again.warm and again.lib.path.exists()


def test_the_key_changes_with_everything_that_reaches_the_generated_c(k_file, monkeypatch, tmp_path):
    path, _, _ = k_file
    model = load_model(path, progress=False)
    base = open_model(model, "native", "x86-64-v3")
    key = warm.warm_key(base)
    assert warm.warm_key(open_model(model, "native", "x86-64-v3")) == key  # the same inputs, the same key

    def changed(opened) -> bool:
        return warm.warm_key(opened) != key

    cfg = dataclasses.replace(base.config, rms_norm_eps=1e-5)
    assert changed(dataclasses.replace(base, config=cfg))                      # the config
    assert changed(open_model(model, "int8", "x86-64-v3"))                     # the precision (graph, storage)
    assert changed(open_model(model, "native", "x86-64-v4"))                   # the target
    o = base.options
    variants = {"precision": "f32", "max_chunk": o.max_chunk + 1, "max_past": 100, "march": "x86-64-v2",
                "fuse": not o.fuse, "schedule": not o.schedule, "lanes": 4, "fma": False,
                "tuned": (("digest", ("Split(i0, 6)",), None),), "narrow": o.narrow[1:],
                "superblocks": o.superblocks[1:]}
    fields = {f.name for f in dataclasses.fields(Options)} - {"choose"}
    assert set(variants) == fields, "a new option must be seen to change the key"
    for name, value in variants.items():
        assert changed(dataclasses.replace(base, options=dataclasses.replace(o, **{name: value}))), name
    assert warm.warm_key(dataclasses.replace(base, options=dataclasses.replace(o, choose=lambda k: ()))) is None

    monkeypatch.setattr(warm, "GENERATOR", "nanocompile 0.0.0 codegen 1")       # the generator version
    assert changed(base)
    monkeypatch.undo()

    # the compiler's own sources: an edited pass, template or runtime file is another compiler
    copy = tmp_path / "package"
    shutil.copytree(warm.package_root(), copy, ignore=shutil.ignore_patterns("__pycache__", "lib"))
    digest = warm.compiler_digest(copy)
    for edited in ("schedule/recipes.py", "codegen/render.py", "target.py"):
        f = copy / edited
        text = f.read_text()
        f.write_text(text + "\n# edited\n")
        assert warm.compiler_digest(copy) != digest, edited
        f.write_text(text)
    assert warm.compiler_digest(copy) == digest
    monkeypatch.setattr(warm, "sources_digest", lambda: "templates and runtime edited")
    monkeypatch.setattr(warm, "_compiler_digest", [])
    assert changed(base)


def test_a_first_run_packs_the_weights_while_the_c_compiler_runs(k_file, monkeypatch):
    """A cold start's two long jobs (the C build, the packing) overlap, and the result is the
    library and weights a warm start finds: the same logits."""
    import time

    import nanocompile.compiler.build as build
    import nanocompile.engine.compiled as compiled

    path, cache, _ = k_file
    spans = {}

    def timed(name, fn):
        def run(*a, **k):
            start = time.monotonic()
            try:
                return fn(*a, **k)
            finally:
                spans[name] = (start, time.monotonic())
        return run

    monkeypatch.setattr(build, "cmake_build", timed("build", build.cmake_build))
    monkeypatch.setattr(compiled, "open_packed", timed("pack", compiled.open_packed))
    model = load_model(path, progress=False)
    first = CompiledSession(open_model(model), n_ctx=32)
    assert not first.warm and cached(cache, "libs") and cached(cache, "packed")
    (b0, b1), (p0, p1) = spans["build"], spans["pack"]
    assert p0 < b1 and b0 < p1, spans  # the packing ran inside the build's time
    logits = first.step([1, 2, 3])
    first.close()
    again = CompiledSession(open_model(model), n_ctx=32)
    assert again.warm and (again.step([1, 2, 3]) == logits).all()


def test_a_packing_error_during_the_build_still_leaves_the_library_built(k_file, monkeypatch):
    import nanocompile.engine.compiled as compiled

    path, cache, _ = k_file

    def broken(*a, **k):
        raise ModelError("the weights cannot be read")
    monkeypatch.setattr(compiled, "open_packed", broken)
    with pytest.raises(ModelError, match="cannot be read"):
        CompiledSession(open_model(load_model(path, progress=False)), n_ctx=32)
    assert cached(cache, "libs") and not cached(cache, "packed")  # the build finished and was kept
