"""Reads a Hugging Face model directory: config.json, safetensors (sharded too), tokenizer."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import ModelError
from ..frontend.config import ConfigError, Qwen2Config, weight_shapes
from .safetensors_reader import read_safetensors


def read_config(path: Path) -> Qwen2Config:
    file = path / "config.json"
    if not file.exists():
        raise ModelError(f"{path}: no config.json (is this a Hugging Face model directory?)")
    try:
        raw = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelError(f"{file}: not valid JSON ({e})") from None
    try:
        return Qwen2Config.from_hf_dict(raw, str(file))
    except ConfigError as e:
        raise ModelError(str(e)) from None


def shard_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ModelError(f"{index}: malformed index ({e})") from None
        files = sorted(set(weight_map.values()))
        for f in files:
            if not (path / f).exists():
                raise ModelError(f"{index}: names shard {f!r}, which does not exist")
        return [path / f for f in files]
    single = path / "model.safetensors"
    if single.exists():
        return [single]
    raise ModelError(f"{path}: no model.safetensors or model.safetensors.index.json")


def read_weights(path: Path, cfg: Qwen2Config) -> dict[str, np.ndarray]:
    expected = weight_shapes(cfg)
    weights: dict[str, np.ndarray] = {}
    for file in shard_files(path):
        for name, array in read_safetensors(file).items():
            if cfg.tie_word_embeddings and name == "lm_head.weight":
                continue  # some tied checkpoints store the shared matrix twice
            if name not in expected:
                raise ModelError(f"{file}: unexpected tensor {name!r} for this qwen2 config")
            if name in weights:
                raise ModelError(f"{file}: tensor {name!r} appears in more than one shard")
            if tuple(array.shape) != expected[name]:
                raise ModelError(f"{file}: tensor {name!r} has shape {list(array.shape)}, but config.json "
                                 f"says {list(expected[name])}")
            weights[name] = array
    missing = [n for n in expected if n not in weights]
    if missing:
        raise ModelError(f"{path}: {len(missing)} tensor(s) missing, first {missing[0]!r}")
    return weights
