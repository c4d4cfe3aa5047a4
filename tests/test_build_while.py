"""build_while (compiler/build.py): a first run's C build on a thread of its own while the caller
packs the weights; both finish before it returns, and an error of either is raised."""
import threading
import time

import pytest

from nanocompile.compiler.build import BuildError, build_while



def test_both_run_at_once():
    built, packed = threading.Event(), threading.Event()

    def build():  # each waits for the other: one after the other would time out
        built.set()
        assert packed.wait(10)

    def meanwhile():
        packed.set()
        assert built.wait(10)
    build_while(build, meanwhile)


def test_the_callers_error_comes_after_the_build_has_finished():
    done = []

    def build():
        time.sleep(0.2)
        done.append("build")

    def meanwhile():
        raise ValueError("bad weights")
    with pytest.raises(ValueError, match="bad weights"):
        build_while(build, meanwhile)
    assert done == ["build"]  # no compiler left running behind the error


def test_the_builds_error_comes_after_the_caller_has_finished():
    done = []

    def build():
        raise BuildError("cmake failed")

    def meanwhile():
        time.sleep(0.2)
        done.append("packed")
    with pytest.raises(BuildError, match="cmake failed"):
        build_while(build, meanwhile)
    assert done == ["packed"]
