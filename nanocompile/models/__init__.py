"""Model sources: a GGUF file, a Hugging Face directory, or the default model.

load_model() gives a LoadedModel: the Qwen2Config, the weights (float32 in transformers' naming
and layout, converted from the file one tensor at a time when asked: models/weights.py), the
tokenizer with its chat template, and the file's content hash, which keys what the cache derives
from it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ..cache import sources
from ..errors import ModelError
from ..frontend.config import Qwen2Config
from . import default_model
from .weights import WeightSource

DEFAULT = "default"


@dataclass
class LoadedModel:
    config: Qwen2Config
    weights: WeightSource
    tokenizer: object  # models.tokenizer.Tokenizer, or None
    source: str
    name: str
    stats: dict = field(default_factory=dict)  # load timings
    key: str | None = None  # the source's content hash (xxh3-128), for what the cache derives from it
    tensor_types: dict[str, int] = field(default_factory=dict)  # in the file: F32, Q8_0, ... -> count

    @property
    def n_params(self) -> int:
        return self.weights.n_params


def _progress_factory(enabled: bool):
    if not enabled:
        return None

    def make(total: int, desc: str):
        from tqdm import tqdm
        return tqdm(total=total, desc=desc, unit="B", unit_scale=True, leave=False)

    return make


def load_model(spec: str | Path = DEFAULT, progress: bool = True) -> LoadedModel:
    """spec: 'default', a .gguf file, or a Hugging Face model directory. The file is checked and
    its config and tokenizer read; weights are converted when first used, and checked for NaN
    and Inf then (once per file content: the result is kept in the cache)."""
    start = time.perf_counter()
    if str(spec) == DEFAULT:
        path = default_model.default_model_path(_progress_factory(progress))
    else:
        path = Path(spec).expanduser()
        if not path.exists():
            raise ModelError(f"{path}: no such file or directory")
    model = _load_hf_dir(path) if path.is_dir() else _load_gguf(path)
    model.stats["load_seconds"] = time.perf_counter() - start
    return model


def _load_hf_dir(path: Path) -> LoadedModel:
    from . import hf_dir
    from .tokenizer import Tokenizer

    cfg = hf_dir.read_config(path)
    hf_dir.tensor_tables(path, cfg)  # every header checked before the directory is hashed
    key = sources.content_hash(path)
    weights = hf_dir.weight_source(path, cfg, key)
    return LoadedModel(cfg, weights, Tokenizer.from_hf_dir(path), str(path), path.name, key=key)


def _load_gguf(path: Path) -> LoadedModel:
    from .gguf_model import GGUFModel

    gguf = GGUFModel(path)
    key = sources.content_hash(path)
    tokenizer = _gguf_tokenizer(gguf, key)
    weights = WeightSource({n: tuple(reversed(t.dims)) for n, t in gguf.tensors.items()}, gguf.convert, str(path),
                           key, lambda name: repr(gguf.gguf_name(name)), raw=gguf.raw,
                           types={n: t.type for n, t in gguf.tensors.items()}, convertible=gguf.check_convertible)
    return LoadedModel(gguf.config, weights, tokenizer, str(path), path.name, key=key,
                       tensor_types=gguf.tensor_types())


def _gguf_tokenizer(gguf, key: str):
    """The file's tokenizer: read back from the cache when this content was seen before, else
    built from the file's vocabulary, checked, and kept for the next run (building it from 151,936
    tokens and merges takes longer than the rest of a warm start: 0.27 s against 0.24 s to read it
    back). The cached file is the tokenizers library's own JSON; the sidecar holds the rest."""
    from ..cache.files import CacheError, check_entry, read_record, sidecar_path, write_entry
    from ..cache.location import cache_root
    from .tokenizer import Tokenizer, builder_digest

    name, made_from = f"tokenizers/{key[:32]}.json", {"source": key, "builder": builder_digest()}
    for candidate in cache_root().candidates(name):
        if check_entry(candidate, made_from) is None:
            facts = (read_record(sidecar_path(candidate)) or {}).get("tokenizer")
            if isinstance(facts, dict):
                return Tokenizer.from_cached(candidate, facts)
    data = gguf.tokenizer_data()
    if data is None:
        return None
    try:
        tokenizer = Tokenizer.from_gguf_data(data)
    except ModelError as e:
        raise ModelError(f"{gguf.path}: {e}") from None
    text = tokenizer.backend_json().encode()
    try:
        write_entry(cache_root().place(name), made_from, lambda out: out.write(text), tokenizer=tokenizer.facts)
    except (CacheError, OSError):
        pass  # built again next time
    return tokenizer


def check_weights_finite(weights, source: str) -> None:
    """Raises ModelError naming the first tensor with a NaN or Inf (every tensor is converted)."""
    WeightSource.from_arrays(weights, source).materialize()
