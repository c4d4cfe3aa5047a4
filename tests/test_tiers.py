"""The tiers hold (tests/tiers.py): a test outside the c and model tiers that reaches the C builder
fails, naming the tier it belongs in; the same test marked c gets past the check; a test that
asks for the cc fixture is in the c tier. The cases are a test file of their own, run by pytest in
a subprocess with the plugin."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nanocompile.compiler.build import NO_BUILD

TESTS = Path(__file__).resolve().parent

CASES = '''
import pytest
from nanocompile.compiler.build import cmake_build
from nanocompile.compiler.graph_library import compile_source


def test_fast_reaches_cmake(tmp_path):
    cmake_build(tmp_path, tmp_path / "build")


def test_fast_compiles_a_graph_library(tmp_path):
    compile_source("int x;", "x86-64", tmp_path)


@pytest.mark.slow
def test_slow_reaches_cmake(tmp_path):
    cmake_build(tmp_path, tmp_path / "build")


@pytest.mark.c
def test_marked_c_reaches_cmake(tmp_path):
    cmake_build(tmp_path, tmp_path / "build")  # an empty tree: cmake fails for its own reason


def test_asks_for_cc(cc):
    assert cc
'''


def pytest_on(case: Path, *options: str) -> subprocess.CompletedProcess:
    """pytest with the tiers plugin on one file, in a process whose environment this test's own
    tier has not touched (this test runs in the fast tier, with the builder turned off)."""
    env = {k: v for k, v in os.environ.items() if k != NO_BUILD}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tiers", "-p", "no:cacheprovider", "-q", "-rA",
                           *options, "--rootdir", str(case.parent), str(case)], capture_output=True, text=True,
                          cwd=case.parent, env={**env, "PYTHONPATH": str(TESTS), "COLUMNS": "1000"}, timeout=300)


def outcomes(stdout: str) -> dict[str, str]:
    """test name -> PASSED or FAILED, with the failure's first line, from pytest's -rA summary."""
    return {m.group(2): m.group(1) + (m.group(3) or "") for m in
            re.finditer(r"^(PASSED|FAILED) \S+::(\w+)(?: - (.*))?$", stdout, re.MULTILINE)}


@pytest.mark.slow
def test_a_fast_test_that_reaches_the_builder_fails_naming_its_tier_and_a_c_test_does_not(tmp_path):
    case = tmp_path / "test_cases.py"
    case.write_text(CASES)
    r = pytest_on(case)
    got = outcomes(r.stdout)
    assert set(got) == {"test_fast_reaches_cmake", "test_fast_compiles_a_graph_library", "test_slow_reaches_cmake",
                        "test_marked_c_reaches_cmake", "test_asks_for_cc"}, r.stdout
    for name in ("test_fast_reaches_cmake", "test_fast_compiles_a_graph_library"):
        assert got[name].startswith("FAILED") and "a fast test reached the C builder" in got[name], got[name]
    assert "mark it c" in r.stdout and NO_BUILD in r.stdout
    # the slow tier is Python only too
    assert got["test_slow_reaches_cmake"].startswith("FAILED")
    assert "a slow test reached the C builder" in got["test_slow_reaches_cmake"], got["test_slow_reaches_cmake"]
    # the same call marked c gets past the tier's check: cmake fails for its own reason
    assert got["test_marked_c_reaches_cmake"].startswith("FAILED")
    assert "fast test" not in got["test_marked_c_reaches_cmake"] and NO_BUILD not in got["test_marked_c_reaches_cmake"]
    assert got["test_asks_for_cc"] == "PASSED"


@pytest.mark.slow
def test_the_cc_fixture_puts_a_test_in_the_c_tier(tmp_path):
    case = tmp_path / "test_cases.py"
    case.write_text(CASES)
    fast = pytest_on(case, "--collect-only", "-m", "fast").stdout
    assert "test_asks_for_cc" not in fast and "test_marked_c_reaches_cmake" not in fast
    assert "test_fast_reaches_cmake" in fast and "test_slow_reaches_cmake" not in fast
    slow = pytest_on(case, "--collect-only", "-m", "slow").stdout
    assert "test_slow_reaches_cmake" in slow and "test_fast_reaches_cmake" not in slow


def test_the_tier_timer_refuses_an_unknown_tier_naming_the_tiers():
    r = subprocess.run([sys.executable, "-m", "bench.probes.tiers", "--tiers", "fast,quick"], capture_output=True,
                       text=True, cwd=TESTS.parent, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1].endswith("unknown tier 'quick': the tiers are fast, slow, c, model"), r.stderr
