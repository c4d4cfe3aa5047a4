"""Every number a model's config gives, checked before it is used: each key a GGUF file or a
config.json states is set, one at a time, to zero, a negative, a huge, a non-finite and a
wrong-type value, and must be refused with one line naming the key, the value and the rule
(a ModelError or ConfigError, never ZeroDivisionError, OverflowError or a config that runs).
The division rules are checked where no head size is given (the width is divided among the
heads then). In process, on the loaders themselves: the command line's handling of the same
errors is test_fuzz_loaders.py's."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from bench.support.tiny import hf_config_dict, random_weights, tiny_config, write_gguf

from nanocompile.errors import ModelError
from nanocompile.frontend.config import ConfigError, Qwen2Config
from nanocompile.models.gguf_file import Value, read_gguf
from nanocompile.models.gguf_model import GGUFModel

CFG = tiny_config(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96, layers=2, vocab=300)

# GGUF --------------------------------------------------------------------------------------------

A = "qwen2."
GGUF_INTEGERS = [A + k for k in ("block_count", "context_length", "embedding_length", "feed_forward_length",
                                 "attention.head_count", "attention.head_count_kv", "attention.key_length",
                                 "attention.value_length")]
GGUF_FLOATS = [A + "rope.freq_base", A + "attention.layer_norm_rms_epsilon"]
GGUF_TOKEN_IDS = ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"]

GGUF_BAD = {
    "zero": Value("UINT32", 0), "negative": Value("INT32", -4), "2^40": Value("UINT64", 1 << 40),
    "2^64-1": Value("UINT64", (1 << 64) - 1), "NaN": Value("FLOAT32", math.nan), "Inf": Value("FLOAT32", math.inf),
    "-Inf": Value("FLOAT64", -math.inf), "1e39": Value("FLOAT64", 1e39), "a string": Value("STRING", "64"),
    "true": Value("BOOL", True), "an array": Value("ARRAY[UINT32]", [64]),
}
# what is not wrong for a key: an id of 0 is the first token; a big integer is a valid rotary base
VALID = {**{k: {"zero"} for k in GGUF_TOKEN_IDS}, A + "rope.freq_base": {"2^40", "2^64-1"}}


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    path = write_gguf(tmp_path_factory.mktemp("config") / "tiny.gguf", CFG, random_weights(CFG, seed=3))
    return path, read_gguf(path)


def opened(gguf_file, changes: dict[str, Value | None]) -> GGUFModel:
    """The file's model with metadata keys replaced (None: removed), and its tokenizer read."""
    path, parsed = gguf_file
    metadata = {k: v for k, v in parsed.metadata.items() if k not in changes}
    metadata.update({k: v for k, v in changes.items() if v is not None})
    model = GGUFModel(path, dataclasses.replace(parsed, metadata=metadata))
    model.tokenizer_data()
    return model


def shows(message: str, value: Value) -> bool:
    """Whether the message names the value (an array by its type)."""
    return value.type.startswith("ARRAY") or names_value(message, value.value)


def gguf_cases():
    for key in GGUF_INTEGERS + GGUF_FLOATS + GGUF_TOKEN_IDS:
        for label, value in GGUF_BAD.items():
            if label not in VALID.get(key, ()):
                yield pytest.param(key, value, id=f"{key}={label}")


@pytest.mark.parametrize("key, value", list(gguf_cases()))
def test_each_gguf_config_number_is_checked_before_use(gguf_file, key, value):
    with pytest.raises(ModelError) as e:
        opened(gguf_file, {key: value})
    message = str(e.value)
    assert "\n" not in message and key in message and shows(message, value), message
    assert "expected" in message or "outside" in message, message  # the rule


@pytest.mark.parametrize("heads", [0, 3, 5, 128])
def test_the_width_must_divide_among_the_heads_when_no_head_size_is_given(gguf_file, heads):
    with pytest.raises(ModelError) as e:
        opened(gguf_file, {A + "attention.key_length": None, A + "attention.value_length": None,
                           A + "attention.head_count": Value("UINT32", heads),
                           A + "attention.head_count_kv": Value("UINT32", 1)})
    assert A + "attention.head_count" in str(e.value) and str(heads) in str(e.value), str(e.value)


def test_heads_must_be_a_multiple_of_the_key_value_heads(gguf_file):
    with pytest.raises(ModelError, match=r"'qwen2.attention.head_count' \(4\) is not a multiple of "
                                         r"'qwen2.attention.head_count_kv' \(3\)"):
        opened(gguf_file, {A + "attention.head_count_kv": Value("UINT32", 3)})


def test_the_intact_file_and_its_edges_are_accepted(gguf_file):
    """Not vacuous: the unchanged metadata gives the config written, and the bounds' own values pass."""
    stored = dataclasses.replace(CFG, rms_norm_eps=float(np.float32(CFG.rms_norm_eps)))  # GGUF keeps float32
    assert opened(gguf_file, {}).config == stored
    edges = {A + "rope.freq_base": Value("FLOAT32", 1.0), A + "attention.layer_norm_rms_epsilon": Value("FLOAT32", 1.0),
             A + "context_length": Value("UINT32", (1 << 31) - 1), "tokenizer.ggml.bos_token_id": Value("UINT32", 0)}
    cfg = opened(gguf_file, edges).config
    assert (cfg.rope_theta, cfg.rms_norm_eps, cfg.max_position_embeddings) == (1.0, 1.0, (1 << 31) - 1)
    no_head_size = opened(gguf_file, {A + "attention.key_length": None, A + "attention.value_length": None}).config
    assert no_head_size.head_dim == 16


# config.json ------------------------------------------------------------------------------------

HF_INTEGERS = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "vocab_size", "head_dim", "max_position_embeddings"]
HF_FLOATS = ["rope_theta", "rms_norm_eps"]
HF_BAD = {"zero": 0, "negative": -64, "2^40": 1 << 40, "2^64": 1 << 64, "NaN": math.nan, "Infinity": math.inf,
          "-Infinity": -math.inf, "1e39": 1e39, "a fraction": 64.5, "a string": "64", "true": True, "a list": [64],
          "an object": {"v": 64}}


def hf_dict(**changes) -> dict:
    d = hf_config_dict(CFG, rope_form="top")
    for k, v in changes.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    return d


# 64.5 is a valid number for a float key, and a big integer a valid rotary base
HF_VALID = {"rms_norm_eps": set(), "rope_theta": {"2^40", "2^64", "a fraction"}}


def hf_cases():
    for key in HF_INTEGERS + HF_FLOATS:
        for label, value in HF_BAD.items():
            if label not in HF_VALID.get(key, ()):
                yield pytest.param(key, value, id=f"{key}={label}")


def names_value(message: str, value) -> bool:
    if isinstance(value, (list, dict)):
        return "a list" in message or "an object" in message
    forms = {json.dumps(value), repr(value), str(value)}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        forms |= {repr(float(value)), f"{value:g}"}  # a number for a float key is read as a float
    return any(form in message for form in forms)


@pytest.mark.parametrize("key, value", list(hf_cases()))
def test_each_config_json_number_is_checked_before_use(key, value):
    with pytest.raises(ConfigError) as e:
        Qwen2Config.from_hf_dict(hf_dict(**{key: value}))
    message = str(e.value)
    assert "\n" not in message and key in message and names_value(message, value), message


@pytest.mark.parametrize("heads", [0, -4, 3, 128])
def test_config_json_heads_without_a_head_dim_are_checked_before_dividing(heads):
    """The reported case: num_attention_heads 0 and no head_dim was a ZeroDivisionError."""
    with pytest.raises(ConfigError) as e:
        Qwen2Config.from_hf_dict(hf_dict(head_dim=None, num_attention_heads=heads, num_key_value_heads=1))
    assert "num_attention_heads" in str(e.value) and str(heads) in str(e.value), str(e.value)


def test_config_json_intact_and_without_head_dim():
    assert Qwen2Config.from_hf_dict(hf_dict()) == CFG
    assert Qwen2Config.from_hf_dict(hf_dict(head_dim=None)).head_dim == 16


@pytest.mark.parametrize("value", [-1, 300, 1 << 40, True, 5.5, {"x": 1}, [2, "x", -3]])
def test_end_of_text_ids_outside_the_vocabulary_are_refused(tmp_path, value):
    from nanocompile.models.tokenizer import Tokenizer

    from tokenizers import Tokenizer as Backend, models

    backend = Backend(models.WordLevel({f"t{i}": i for i in range(300)}, unk_token="t0"))
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": value}))
    with pytest.raises(ModelError) as e:
        Tokenizer.from_hf_dir(tmp_path)
    assert "generation_config.json: eos_token_id is" in str(e.value) and "0 to 299" in str(e.value), str(e.value)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 299]}))
    assert Tokenizer.from_hf_dir(tmp_path).eos_ids[:2] == [0, 299]
