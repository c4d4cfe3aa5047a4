"""Model sources: a GGUF file, a Hugging Face directory, or the default model.

load_model() gives a LoadedModel: the Qwen2Config, float32 weights in transformers' naming
and layout, and the tokenizer with its chat template.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ModelError
from ..frontend.config import Qwen2Config
from . import cache, default_model

DEFAULT = "default"


@dataclass
class LoadedModel:
    config: Qwen2Config
    weights: dict[str, np.ndarray]
    tokenizer: object  # nanocompile.tokenizer.Tokenizer, or None
    source: str
    name: str
    stats: dict = field(default_factory=dict)  # load timings, cache hit
    key: str | None = None  # identifies the source file(s), for caches derived from them

    @property
    def n_params(self) -> int:
        return sum(int(w.size) for w in self.weights.values())


def _progress_factory(enabled: bool):
    if not enabled:
        return None

    def make(total: int, desc: str):
        from tqdm import tqdm
        return tqdm(total=total, desc=desc, unit="B", unit_scale=True, leave=False)

    return make


def load_model(spec: str | Path = DEFAULT, progress: bool = True, check_finite: bool = False) -> LoadedModel:
    """spec: 'default', a .gguf file, or a Hugging Face model directory."""
    bars = _progress_factory(progress)
    start = time.perf_counter()
    if str(spec) == DEFAULT:
        path = default_model.default_model_path(cache.cache_dir(), bars)
    else:
        path = Path(spec).expanduser()
        if not path.exists():
            raise ModelError(f"{path}: no such file or directory")
    if path.is_dir():
        model = _load_hf_dir(path)
    else:
        model = _load_gguf(path, bars)
    model.key = cache.source_key(path)
    if check_finite:
        check_weights_finite(model.weights, model.source)
    model.stats["load_seconds"] = time.perf_counter() - start
    return model


def _load_hf_dir(path: Path) -> LoadedModel:
    from ..tokenizer import Tokenizer
    from . import hf_dir

    cfg = hf_dir.read_config(path)
    weights = hf_dir.read_weights(path, cfg)
    return LoadedModel(cfg, weights, Tokenizer.from_hf_dir(path), str(path), path.name, {"cache": "none"})


def _load_gguf(path: Path, bars) -> LoadedModel:
    from ..tokenizer import Tokenizer
    from .gguf_model import GGUFModel, GGUFTokenizerData, check_header

    check_header(path)
    entry = cache.weights_entry(path)
    hit = cache.load_weights(entry)
    if hit is not None:
        weights, meta = hit
        cfg = Qwen2Config(**meta["config"])
        tok = meta.get("tokenizer")
        tokenizer = Tokenizer.from_gguf_data(GGUFTokenizerData(**tok)) if tok else None
        return LoadedModel(cfg, weights, tokenizer, str(path), path.name, {"cache": "hit"})

    gguf = GGUFModel(path)
    bar = bars(sum(int(t.n_bytes) for t in gguf.reader.tensors), "dequantizing") if bars else None
    try:
        weights = gguf.dequantize(bar.update if bar else None)
    finally:
        if bar:
            bar.close()
    tok_data = gguf.tokenizer_data()
    tokenizer = Tokenizer.from_gguf_data(tok_data) if tok_data else None
    meta = {"config": json.loads(gguf.config.to_json()), "source": str(path),
            "tensor_types": gguf.tensor_types(), "tokenizer": tok_data.__dict__ if tok_data else None}
    cache.save_weights(entry, weights, meta)
    return LoadedModel(gguf.config, weights, tokenizer, str(path), path.name, {"cache": "miss"})


def stored_q8_0(model: LoadedModel) -> dict:
    """The model's Q8_0 tensors as stored in its GGUF file (name -> (bytes, shape)); none for a
    Hugging Face directory. The int8 precision reads them without a float32 round trip."""
    path = Path(model.source)
    if not path.is_file():
        return {}
    from .gguf_model import GGUFModel
    return GGUFModel(path).raw_tensors("Q8_0")


def check_weights_finite(weights: dict[str, np.ndarray], source: str) -> None:
    for name, w in weights.items():
        if not np.isfinite(w).all():
            bad = int(np.size(w) - np.isfinite(w).sum())
            raise ModelError(f"{source}: tensor {name!r} has {bad} NaN or Inf value(s)")
