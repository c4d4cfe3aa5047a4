"""The test tiers, a pytest plugin (conftest.py loads it; tests/test_tiers.py runs it on tests of its own).

    model  needs the real default model: a test that uses a real_* fixture, or says so
    c      compiles C: a test marked c, or one that uses the cc fixture (a C compiler of its own)
    slow   neither, but seconds each: marked slow (fuzzers over hundreds of inputs, the tuner's
           spaces over the whole model, the CLI or pytest in a process of its own, transformers)
    fast   every other test: `pytest -m fast` runs in under a minute without a compiler or the model

A fast or slow test cannot reach the builder: every test outside c and model runs with
NANOCOMPILE_NO_BUILD set (inherited by the processes it starts), so the compiler's builders
(compiler/build.cmake_build, compiler/graph_library.compile_source) refuse, and with a cache of
its own, so a library another test built is not found instead. Such a test fails, naming the tier.
"""
from __future__ import annotations

import shutil

import pytest

from nanocompile.compiler.build import NO_BUILD

REAL_FIXTURES = {"real_model", "real_oracle", "real_session", "real_reference", "real_compiled"}
C_FIXTURES = {"cc"}


def pytest_configure(config):
    config.addinivalue_line("markers", "fast: needs neither a C compiler nor the real model")
    config.addinivalue_line("markers", "c: compiles C")
    config.addinivalue_line("markers", "model: needs the real default model")
    config.addinivalue_line("markers", "slow: needs neither a C compiler nor the model, but takes seconds")


def pytest_collection_modifyitems(config, items):
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if REAL_FIXTURES & names:
            item.add_marker(pytest.mark.model)
        if C_FIXTURES & names:
            item.add_marker(pytest.mark.c)
        if not any(item.get_closest_marker(tier) for tier in ("model", "c", "slow")):
            item.add_marker(pytest.mark.fast)


def _builds_nothing(item) -> bool:
    """The fast and slow tiers: no C compiler, no model."""
    return not (item.get_closest_marker("model") or item.get_closest_marker("c"))


@pytest.fixture(autouse=True)
def python_tiers_compile_nothing(request, monkeypatch, tmp_path_factory):
    if _builds_nothing(request.node):
        monkeypatch.setenv(NO_BUILD, "1")
        monkeypatch.setenv("NANOCOMPILE_CACHE", str(tmp_path_factory.mktemp("fast-cache")))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except Exception as e:
        if _builds_nothing(item) and NO_BUILD in str(e):
            tier = "slow" if item.get_closest_marker("slow") else "fast"
            raise pytest.fail.Exception(f"a {tier} test reached the C builder ({e}); it belongs in the c tier: "
                                        f"mark it c (pytest.mark.c) or use the cc fixture") from e
        raise


FAST_SECONDS = 1.5  # a fast test slower than this is named at the end of the run


def pytest_terminal_summary(terminalreporter):
    """Names the fast tests that took long enough to belong in slow, so the tier stays quick."""
    slow = sorted(((r.duration, r.nodeid) for kind in ("passed", "failed") for r in terminalreporter.stats.get(kind, ())
                   if getattr(r, "when", "") == "call" and "fast" in r.keywords and r.duration > FAST_SECONDS),
                  reverse=True)
    if slow:
        terminalreporter.section("fast tests that belong in the slow tier")
        for seconds, nodeid in slow:
            terminalreporter.line(f"{seconds:6.2f}s {nodeid}  (over {FAST_SECONDS} s: mark it slow)")


@pytest.fixture(scope="session")
def cc() -> str:
    """The C compiler, for a test that compiles C itself (the test is in the c tier)."""
    found = shutil.which("cc") or shutil.which("gcc")
    if found is None:
        pytest.fail("no C compiler on this machine: the c tier needs one")
    return found
