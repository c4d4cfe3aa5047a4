"""Model sources on real files: GGUF (F32 and Q8_0 tensors) and Hugging Face directories
(both config forms, sharded, bfloat16), each checked against what was written and, for HF
directories, against transformers loading the same directory."""
import dataclasses
import warnings

import numpy as np
import pytest
from bench.support.tiny import bf16_round, hf_config_dict, random_weights, tiny_config, write_gguf, write_hf_dir

from nanocompile.engine.interpreted import InterpreterSession
from nanocompile.errors import ModelError
from nanocompile.models import load_model


def test_gguf_f32_loads_exactly(tmp_path, isolated_cache):
    cfg = tiny_config()
    w = random_weights(cfg)
    m = load_model(write_gguf(tmp_path / "t.gguf", cfg, w, quantize=False), progress=False)
    # GGUF stores the epsilon as float32
    assert m.config == dataclasses.replace(cfg, rms_norm_eps=float(np.float32(cfg.rms_norm_eps)))
    assert set(m.weights) == set(w)
    for k in w:
        assert np.array_equal(m.weights[k], w[k]), k


def test_gguf_q8_0_dequantizes_like_gguf_reference(tmp_path, isolated_cache):
    import gguf

    cfg = tiny_config(hidden=64, head_dim=16, ffn=96)
    w = random_weights(cfg)
    m = load_model(write_gguf(tmp_path / "q.gguf", cfg, w, quantize=True), progress=False)
    q = w["model.layers.0.mlp.up_proj.weight"]
    ref = gguf.quants.dequantize(gguf.quants.quantize(q, gguf.GGMLQuantizationType.Q8_0),
                                 gguf.GGMLQuantizationType.Q8_0)
    assert np.array_equal(m.weights["model.layers.0.mlp.up_proj.weight"], ref)
    # Q8_0 keeps 8 bits per value: the dequantized weight is close to the original
    assert np.abs(ref - q).max() <= np.abs(q).max() / 127


def test_gguf_second_load_is_identical_and_keyed_by_content(tmp_path, isolated_cache):
    cfg = tiny_config()
    w = random_weights(cfg)
    path = write_gguf(tmp_path / "t.gguf", cfg, w, quantize=False)
    first = load_model(path, progress=False)
    second = load_model(path, progress=False)
    assert second.key == first.key and second.config == first.config
    for k in first.weights:
        assert np.array_equal(first.weights[k], second.weights[k])
    assert second.tokenizer.encode("hi <|im_end|>") == first.tokenizer.encode("hi <|im_end|>")
    # the key is the content's: the same bytes written again (a new mtime) keep it, and a changed
    # weight changes it, so the cache never serves what a changed file no longer holds
    path.write_bytes(path.read_bytes())
    assert load_model(path, progress=False).key == first.key
    w["model.norm.weight"][0] += 1
    write_gguf(path, cfg, w, quantize=False)
    assert load_model(path, progress=False).key != first.key


@pytest.mark.parametrize("rope_form, shards, bf16", [("parameters", 1, False), ("theta", 3, False),
                                                      ("parameters", 2, True)])
@pytest.mark.slow
def test_hf_directory_against_transformers(tmp_path, rope_form, shards, bf16):
    import torch
    from transformers import Qwen2ForCausalLM

    cfg = tiny_config(hidden=44, heads=4, kv_heads=2, head_dim=10, theta=5e5)
    w = random_weights(cfg, seed=7)
    path = write_hf_dir(tmp_path / "hf", cfg, w, rope_form=rope_form, shards=shards, bf16=bf16)
    m = load_model(path, progress=False)
    assert m.config == cfg
    expected = bf16_round(w) if bf16 else w
    for k in w:
        assert np.array_equal(m.weights[k], expected[k]), k
    if bf16:
        return  # transformers would load bf16 as bf16; the values were compared above
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = Qwen2ForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    assert hf.config.rope_parameters["rope_theta"] == cfg.rope_theta
    ids = [1, 5, 9, 200, 33]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()
    got = InterpreterSession.from_weights(m.config, m.weights, n_ctx=32).step(ids, all_logits=True)
    assert np.abs(got - want).max() <= 1e-4


def test_hf_config_forms_agree(tmp_path):
    from nanocompile.frontend import Qwen2Config

    cfg = tiny_config(theta=123456.0)
    a = Qwen2Config.from_hf_dict(hf_config_dict(cfg, "parameters"))
    b = Qwen2Config.from_hf_dict(hf_config_dict(cfg, "theta"))
    assert a == b == cfg


@pytest.mark.c
def test_non_finite_weight_is_an_error_naming_the_tensor(tmp_path, isolated_cache):
    from nanocompile.engine.compiled import CompiledSession
    from nanocompile.errors import ModelError

    cfg = tiny_config()
    w = random_weights(cfg)
    w["model.layers.1.mlp.down_proj.weight"][3, 4] = np.nan
    path = write_gguf(tmp_path / "nan.gguf", cfg, w, quantize=False)
    m = load_model(path, progress=False)  # the config and tokenizer load; weights convert when used
    with pytest.raises(ModelError, match=r"nan.gguf: tensor 'blk.1.ffn_down.weight' has 1 NaN or Inf value\(s\), "
                                         r"the first at \[3, 4\]"):
        m.weights.materialize()
    with pytest.raises(ModelError, match="'blk.1.ffn_down.weight' has 1 NaN"):
        CompiledSession.from_weights(m.config, m.weights, n_ctx=8, weights_key=m.key)
    assert not list((isolated_cache / "packed").iterdir()), "nothing packed, no temporary left"
    hf = write_hf_dir(tmp_path / "hf", cfg, w)
    with pytest.raises(ModelError, match=r"hf: tensor 'model.layers.1.mlp.down_proj.weight' \(in model.safetensors\) "
                                         r"has 1 NaN"):
        load_model(hf, progress=False).weights.materialize()


def test_stored_form_of_a_gguf_tensor(tmp_path, isolated_cache):
    """What a precision packing the GGUF's own blocks reads: the bytes as stored, which
    dequantize to the float32 tensor."""
    import gguf

    cfg = tiny_config(hidden=64, head_dim=16, ffn=96)
    path = write_gguf(tmp_path / "q.gguf", cfg, random_weights(cfg), quantize=True)
    weights = load_model(path, progress=False).weights
    kind, raw = weights.raw("model.layers.1.mlp.down_proj.weight")
    assert kind == "Q8_0" and raw.shape == (64, 96 // 32 * 34)
    assert np.array_equal(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0),
                          weights.tensor("model.layers.1.mlp.down_proj.weight"))
    reader = gguf.GGUFReader(path)
    stored = next(t for t in reader.tensors if t.name == "blk.1.ffn_down.weight")
    assert np.array_equal(raw, stored.data)
    hf = load_model(write_hf_dir(tmp_path / "hf", cfg, random_weights(cfg)), progress=False)
    with pytest.raises(ModelError, match="no stored form other than float32"):
        hf.weights.raw("model.norm.weight")


def test_finite_check_runs_once_per_content(tmp_path, isolated_cache, monkeypatch):
    cfg = tiny_config()
    path = write_gguf(tmp_path / "t.gguf", cfg, random_weights(cfg), quantize=True)
    first = load_model(path, progress=False)
    assert not first.weights.known_finite
    first.weights.materialize()
    assert first.weights.known_finite
    calls = []
    real = np.isfinite
    monkeypatch.setattr(np, "isfinite", lambda *a, **k: calls.append(1) or real(*a, **k))
    second = load_model(path, progress=False)
    assert second.weights.known_finite
    second.weights.materialize()
    assert calls == [], "a later load converts without checking again"


def test_a_gguf_header_is_read_from_the_cache_until_the_file_changes(tmp_path, monkeypatch):
    """The parsed header (metadata, tensor table) is kept by the file's identity: the second read
    parses nothing and gives the same header, arrays read from the file when used; a file changed
    in any way is parsed again."""
    from nanocompile.models import gguf_file

    monkeypatch.setenv("NANOCOMPILE_CACHE", str(tmp_path / "cache"))
    cfg = tiny_config()
    path = write_gguf(tmp_path / "tiny.gguf", cfg, random_weights(cfg))
    first = gguf_file.read_gguf(path)
    parses = []
    real = gguf_file._Parser.parse
    monkeypatch.setattr(gguf_file._Parser, "parse", lambda self: parses.append(1) or real(self))
    again = gguf_file.read_gguf(path)
    assert parses == []
    assert again.tensors == first.tensors and (again.data_start, again.alignment, again.version) == (
        first.data_start, first.alignment, first.version)
    assert list(again.metadata) == list(first.metadata)
    for key, value in first.metadata.items():
        assert again.metadata[key].type == value.type
        assert list(again.metadata[key].value) == list(value.value) if value.type.startswith("ARRAY") else \
            again.metadata[key].value == value.value, key
    with open(path, "r+b") as f:  # the same bytes written again: the file changed
        head = f.read(64)
        f.seek(0)
        f.write(head)
    gguf_file.read_gguf(path)
    assert parses == [1]
