"""The compiled backend refuses bad input cleanly and keeps its state."""
import os

import numpy as np
import pytest
from bench.support.tiny import random_weights, tiny_config

from nanocompile.compiler.driver import compile_model
from nanocompile.engine.compiled import CompiledSession
from nanocompile.engine.library import NC_ERR_CONTEXT, NC_ERR_TOKEN, SIGNATURES, check_fingerprint
from nanocompile.errors import ContextFullError, InputError, ModelError

pytestmark = [pytest.mark.c, pytest.mark.levels]


@pytest.fixture(scope="module")
def tiny():
    cfg = tiny_config()
    return cfg, random_weights(cfg, seed=2)


def test_threads(tiny):
    cfg, w = tiny
    with pytest.raises(InputError, match="threads must be >= 1, or 0 for all cores; got -1"):
        CompiledSession.from_weights(cfg, w, n_ctx=16, threads=-1)
    s = CompiledSession.from_weights(cfg, w, n_ctx=16, threads=0)
    assert s.threads == os.cpu_count()
    s.set_threads(1)
    assert s.threads == 1
    with pytest.raises(InputError, match="threads must be"):
        s.set_threads(-3)
    assert s.threads == 1


def test_n_ctx_beyond_the_models_maximum(tiny):
    cfg, w = tiny
    with pytest.raises(InputError, match="exceeds the model's maximum of 256"):
        CompiledSession.from_weights(cfg, w, n_ctx=257)


@pytest.mark.parametrize("chunk", [0, -3, 2.5, "96", True])
def test_a_chunk_that_is_not_a_positive_whole_number_is_refused_before_building(chunk):
    cfg = tiny_config()
    with pytest.raises(InputError, match=r"max_chunk .*: the prompt rows a pass takes must be a whole number, at least 1"):
        CompiledSession.from_weights(cfg, random_weights(cfg, seed=1), n_ctx=64, max_chunk=chunk)


def test_overflowing_step_leaves_cache_and_position_unchanged(tiny):
    cfg, w = tiny
    s = CompiledSession.from_weights(cfg, w, n_ctx=8)
    s.step([1, 2, 3, 4, 5])
    with pytest.raises(ContextFullError, match="5 cached \\+ 4 new tokens exceed n_ctx = 8"):
        s.step([6, 7, 8, 9])
    assert s.past == 5
    after = s.step([6])
    fresh = CompiledSession.from_weights(cfg, w, n_ctx=8)
    fresh.step([1, 2, 3, 4, 5])
    assert np.array_equal(after, fresh.step([6]))


def test_the_library_checks_tokens_itself(tiny):
    cfg, w = tiny
    s = CompiledSession.from_weights(cfg, w, n_ctx=8)
    out = np.empty(cfg.vocab_size, np.float32)
    assert s.raw_step(np.array([1, cfg.vocab_size], np.int32), out) == NC_ERR_TOKEN
    assert s.raw_step(np.array([-4], np.int32), out) == NC_ERR_TOKEN
    assert s.raw_step(np.arange(9, dtype=np.int32), out) == NC_ERR_CONTEXT
    assert s.past == 0
    assert "outside the vocabulary" in s.lib.last_error(s._handle).decode() or "context" in s.lib.last_error(s._handle).decode()


def test_weights_file_for_another_model_is_refused_at_load(tiny, tmp_path):
    cfg, w = tiny
    other = tiny_config(ffn=80)
    packed = tmp_path / "other.bin"
    CompiledSession.from_weights(other, random_weights(other), n_ctx=8, packed_path=packed).close()
    with pytest.raises(ModelError, match="does not match this library"):
        CompiledSession.from_weights(cfg, w, n_ctx=8, packed_path=packed)
    truncated = tmp_path / "short.bin"
    good = tmp_path / "good.bin"
    CompiledSession.from_weights(cfg, w, n_ctx=8, packed_path=good).close()
    truncated.write_bytes(good.read_bytes()[:-100])
    with pytest.raises(ModelError, match="truncated"):
        CompiledSession.from_weights(cfg, w, n_ctx=8, packed_path=truncated)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not weights" * 1000)
    with pytest.raises(ModelError, match="not a nanocompile packed weights file"):
        CompiledSession.from_weights(cfg, w, n_ctx=8, packed_path=junk)


def test_fingerprint_mismatch_and_missing_cpu_features(tiny):
    cfg, w = tiny
    s = CompiledSession.from_weights(cfg, w, n_ctx=8)
    check_fingerprint(s.lib, s.module.fingerprint)
    with pytest.raises(ModelError, match="compiled for a different config"):
        check_fingerprint(s.lib, compile_model(tiny_config(layers=3)).fingerprint)
    other = compile_model(cfg)
    other.isa = other.isa + ["amx_tile_imaginary"]
    with pytest.raises(ModelError, match="compiled for a different isa"):
        check_fingerprint(s.lib, other.fingerprint)


def test_every_exported_symbol_is_declared(tiny):
    cfg, w = tiny
    s = CompiledSession.from_weights(cfg, w, n_ctx=8)
    for name in SIGNATURES:
        fn = getattr(s.lib, name)
        assert fn.argtypes is not None, name
    import subprocess
    nm = subprocess.run(["nm", "-D", "--defined-only", str(s.lib.path)], capture_output=True, text=True, check=True)
    exported = {line.split()[-1] for line in nm.stdout.splitlines() if line.split()[-1].startswith(s.module.prefix)}
    assert exported == {s.module.prefix + n for n in SIGNATURES}
    # and nothing else of the library's own is visible
    others = {line.split()[-1] for line in nm.stdout.splitlines() if " T " in line} - exported
    assert not {o for o in others if o.startswith(("nc_", "forward", "matmul"))}, others
