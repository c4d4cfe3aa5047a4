"""`pip install .` ships the default architecture's compiled libraries (float32 and int8), and
what is needed to compile any other config later."""
from pathlib import Path

import pytest

import nanocompile
from nanocompile.compiler.build import find_or_build, packaged_manifests
from nanocompile.compiler.driver import compile_model
from nanocompile.generate import DEFAULT_ARCH


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["f32", "int8"])
def test_default_library_is_in_the_wheel(precision):
    shipped = {m["fingerprint"]["precision"]: (m, d) for m, d in packaged_manifests()}
    assert sorted(shipped) == ["f32", "int8"]
    manifest, directory = shipped[precision]
    assert directory == Path(nanocompile.__file__).parent / "lib"
    module = compile_model(DEFAULT_ARCH, precision)
    assert manifest["fingerprint"] == module.fingerprint
    path, _ = find_or_build(module)
    assert path.parent == directory  # used as shipped, not rebuilt


def test_wheel_carries_templates_runtime_and_cmake():
    root = Path(nanocompile.__file__).parent
    for f in ("templates/model.c.j2", "templates/kernel.c.j2", "runtime/nc_runtime.c", "cmake/nanocompile.cmake"):
        assert (root / f).is_file(), f


@pytest.mark.model
def test_real_model_uses_the_shipped_library(real_model, real_compiled):
    """Without tuned schedules the shipped library; with them (`nanocompile tune` ran on this
    CPU with this cache) a library built for them in the cache."""
    from nanocompile.engine.open import open_session

    shipped = Path(nanocompile.__file__).parent / "lib"
    untuned = open_session(real_model, "compiled", n_ctx=64, threads=1, tuned=False)
    assert untuned.lib.path.parent == shipped
    untuned.close()
    assert (real_compiled.lib.path.parent == shipped) == (not real_compiled.module.tuned_kernels)
