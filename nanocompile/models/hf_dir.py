"""Reads a Hugging Face model directory: config.json, safetensors (sharded too), tokenizer.

Every shard's header is read and checked against config.json before any weight is touched;
the weights are then read one tensor at a time (a WeightSource).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import ModelError
from ..frontend.config import ConfigError, Qwen2Config, weight_shapes
from .safetensors_reader import TensorEntry, read_table, read_tensor
from .weights import WeightSource

INDEX = "model.safetensors.index.json"


def read_config(path: Path) -> Qwen2Config:
    file = path / "config.json"
    if not file.is_file():
        raise ModelError(f"{path}: no config.json (is this a Hugging Face model directory?)")
    try:
        raw = json.loads(file.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelError(f"{file}: not valid JSON ({e})") from None
    except OSError as e:
        raise ModelError(f"{file}: cannot be read ({e.strerror})") from None
    if not isinstance(raw, dict):
        raise ModelError(f"{file}: expected a JSON object, found {type(raw).__name__}")
    try:
        return Qwen2Config.from_hf_dict(raw, str(file))
    except ConfigError as e:
        raise ModelError(str(e)) from None


def shard_files(path: Path) -> list[Path]:
    index = path / INDEX
    if index.exists():
        try:
            data = json.loads(index.read_bytes())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelError(f"{index}: not valid JSON ({e})") from None
        if not isinstance(data, dict) or "weight_map" not in data:
            raise ModelError(f"{index}: has no 'weight_map'")
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ModelError(f"{index}: 'weight_map' must map tensor names to shard file names")
        files = sorted(set(weight_map.values()))
        for f in files:
            if Path(f).name != f or f in ("", ".", ".."):
                raise ModelError(f"{index}: shard {f!r} is not a file name in the directory")
            if not (path / f).is_file():
                raise ModelError(f"{index}: names shard {f!r}, which does not exist")
        return [path / f for f in files]
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    raise ModelError(f"{path}: no model.safetensors or {INDEX}")


def tensor_tables(path: Path, cfg: Qwen2Config) -> dict[str, tuple[Path, TensorEntry]]:
    """Where each of the config's tensors is, checked: no tensor unexpected, repeated, of another
    shape, or missing."""
    tables = [(file, read_table(file)) for file in shard_files(path)]
    n_tensors = sum(len(t) for _, t in tables)
    if cfg.num_hidden_layers > n_tensors:
        raise ModelError(f"{path / 'config.json'}: num_hidden_layers is {cfg.num_hidden_layers}, but the "
                         f"safetensors files hold only {n_tensors} tensors")
    expected = weight_shapes(cfg)
    found: dict[str, tuple[Path, TensorEntry]] = {}
    for file, table in tables:
        for name, entry in table.items():
            if cfg.tie_word_embeddings and name == "lm_head.weight":
                continue  # some tied checkpoints store the shared matrix twice
            if name not in expected:
                raise ModelError(f"{file}: unexpected tensor {name!r} for this qwen2 config")
            if name in found:
                raise ModelError(f"{file}: tensor {name!r} appears in more than one shard")
            if entry.shape != expected[name]:
                raise ModelError(f"{file}: tensor {name!r} has shape {list(entry.shape)}, but config.json "
                                 f"says {list(expected[name])}")
            found[name] = (file, entry)
    missing = [n for n in expected if n not in found]
    if missing:
        raise ModelError(f"{path}: {len(missing)} tensor(s) missing, first {missing[0]!r}")
    return found


def weight_source(path: Path, cfg: Qwen2Config, content_key: str | None = None) -> WeightSource:
    where = tensor_tables(path, cfg)

    def convert(name: str) -> np.ndarray:
        file, entry = where[name]
        return read_tensor(file, entry)

    return WeightSource({n: e.shape for n, (_, e) in where.items()}, convert, str(path), content_key,
                        lambda name: f"{name!r} (in {where[name][0].name})")


def read_weights(path: Path, cfg: Qwen2Config) -> dict[str, np.ndarray]:
    """Every weight, as float32 arrays (f32 ones memory-mapped)."""
    return dict(weight_source(path, cfg).materialize())
