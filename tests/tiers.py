"""The test tiers, a pytest plugin (conftest.py loads it; tests/test_tiers.py runs it on tests of its own).

    model  needs the real default model: a test that uses a real_* fixture, or says so
    c      compiles C: a test marked c, or one that uses the cc fixture (a C compiler of its own)
    fast   every other test: `pytest -m fast` runs in under a minute without a compiler or the model

A fast test cannot reach the builder: every test outside c and model runs with
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


def pytest_collection_modifyitems(config, items):
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if REAL_FIXTURES & names:
            item.add_marker(pytest.mark.model)
        if C_FIXTURES & names:
            item.add_marker(pytest.mark.c)
        if not (item.get_closest_marker("model") or item.get_closest_marker("c")):
            item.add_marker(pytest.mark.fast)


@pytest.fixture(autouse=True)
def fast_tier_compiles_nothing(request, monkeypatch, tmp_path_factory):
    if request.node.get_closest_marker("fast") is not None:
        monkeypatch.setenv(NO_BUILD, "1")
        monkeypatch.setenv("NANOCOMPILE_CACHE", str(tmp_path_factory.mktemp("fast-cache")))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except Exception as e:
        if item.get_closest_marker("fast") is not None and NO_BUILD in str(e):
            raise pytest.fail.Exception(f"a fast test reached the C builder ({e}); it belongs in the c tier: "
                                        f"mark it c (pytest.mark.c) or use the cc fixture") from e
        raise


@pytest.fixture(scope="session")
def cc() -> str:
    """The C compiler, for a test that compiles C itself (the test is in the c tier)."""
    found = shutil.which("cc") or shutil.which("gcc")
    if found is None:
        pytest.fail("no C compiler on this machine: the c tier needs one")
    return found
