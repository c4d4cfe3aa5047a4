"""Fixtures and targets; the tiers (model, c, slow, fast) are tests/tiers.py's.

Targets: every test marked `levels` (the code generator's C tests) runs at this CPU's level and,
on an AVX-512 machine, again at the AVX2 level (NANOCOMPILE_MARCH=x86-64-v3), so what would fail
on an AVX2-only machine fails here too. `--levels native` runs the machine's level only.

The real model and its oracle are loaded once per test session.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # helpers.py
# bench/support (tiny models, the oracle, the llama.cpp peer): the checkout's root goes last on the
# path, so that `import nanocompile` still finds the installed package, not the source tree
sys.path.append(str(Path(__file__).resolve().parents[1]))

pytest.register_assert_rewrite("tiers")
from helpers import LEVELS, N_TOKENS, greedy_run, real_prompt_ids  # noqa: E402
from tiers import REAL_FIXTURES  # noqa: E402

from nanocompile.target import FORCE, cpu_flags, detect_march, has_amx, level_flags  # noqa: E402

pytest_plugins = ["tiers"]  # the model, c, slow and fast tiers (tests/tiers.py)


def pytest_addoption(parser):
    parser.addoption("--levels", default="all", choices=["all", "native"],
                     help="C tests at every vector level this CPU runs (all) or at its own only (native)")


def pytest_configure(config):
    config.addinivalue_line("markers", "levels: run at every vector level this CPU runs (NANOCOMPILE_MARCH)")


def pytest_report_header(config):
    """What this run tests on: the CPU, the levels its C tests build for, and the level each
    library shipped in the installed package was built for."""
    from nanocompile.compiler.build import packaged_manifests
    from nanocompile.target import cpu_model

    shipped = ", ".join(f"{m['fingerprint']['precision']} for {m['fingerprint']['march']}" for m, _ in packaged_manifests())
    return [f"nanocompile: {cpu_model()}; C tests built for {', '.join(_levels(config))} "
            f"(NANOCOMPILE_MARCH for the levels below this CPU's); shipped libraries: {shipped or 'none'}"]


def _levels(config) -> list[str]:
    """This CPU's target; without its AMX tiles (every AVX-512 VNNI CPU's code) if it has them;
    then AVX2 (x86-64-v3) if the CPU has more and runs it."""
    native = detect_march()[0]
    avx2 = LEVELS[-1]
    if config.getoption("--levels") == "native" or native == avx2 or not set(level_flags(avx2)) <= cpu_flags():
        return [native]
    return [native] + ([native.removesuffix("+amx")] if has_amx(native) else []) + [avx2]


def pytest_generate_tests(metafunc):
    names = set(metafunc.fixturenames)
    choose_own = {"march", "lanes"} & names or REAL_FIXTURES & names  # the real model: its own level only
    if metafunc.definition.get_closest_marker("levels") and not choose_own and "target" in names:
        metafunc.parametrize("target", _levels(metafunc.config), indirect=True)


@pytest.fixture(autouse=True)
def target(request, monkeypatch):
    """The x86-64 level a C test builds for (NANOCOMPILE_MARCH)."""
    level = getattr(request, "param", None)
    if level is not None and level != detect_march()[0]:
        monkeypatch.setenv(FORCE, level)
    return level


@pytest.fixture(scope="session")
def real_model():
    """The default model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M), dequantized. Its absence fails
    the test rather than skipping it: the real model is the point of these tests."""
    from nanocompile.models import load_model

    return load_model("default", progress=False)


@pytest.fixture(scope="session")
def real_oracle(real_model):
    from bench.support.oracle import build_oracle

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_oracle(real_model.config, real_model.weights)


@pytest.fixture(scope="session")
def real_session(real_model):
    from nanocompile.engine.interpreted import InterpreterSession

    return InterpreterSession.from_weights(real_model.config, real_model.weights, n_ctx=512)


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory):
    """A tiny random Qwen2 in a GGUF file with a byte-level tokenizer and a ChatML template, loaded
    (into a cache of its own): for the API and the server, where speed matters more than text."""
    from bench.support.tiny import random_weights, tiny_config, write_gguf

    from nanocompile.models import load_model

    d = tmp_path_factory.mktemp("tiny_chat")
    cfg = tiny_config(vocab=300, max_pos=256)
    path = write_gguf(d / "tiny.gguf", cfg, random_weights(cfg, seed=1), quantize=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NANOCOMPILE_CACHE", str(d / "cache"))
        return load_model(path, progress=False)


@pytest.fixture()
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCOMPILE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def real_reference(real_model, real_oracle, real_session):
    """Per prompt, computed once: transformers' greedy run (tokens, logits, cache) and the
    interpreter's (tokens, logits, cache)."""
    from bench.support.oracle import oracle_greedy, oracle_logits

    runs = {}

    def get(name):
        if name not in runs:
            ids = real_prompt_ids(real_model, name)
            tokens, cache, logits = oracle_greedy(real_oracle, ids, N_TOKENS, return_logits=True)
            interp = greedy_run(real_session, ids, N_TOKENS)
            interp["cache"] = dict(real_session.cache)
            runs[name] = {"ids": ids, "oracle": {"tokens": tokens, "step_logits": logits, "cache": cache,
                                                 "prompt_logits": oracle_logits(real_oracle, ids)},
                          "interp": interp}
        return runs[name]

    return get


@pytest.fixture(scope="session")
def real_compiled(real_model):
    from nanocompile.engine.open import open_session

    return open_session(real_model, "compiled", n_ctx=512, threads=2)
