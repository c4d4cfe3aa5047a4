"""Where nanocompile keeps what it derives once: dequantized weights, the default model."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from ..errors import ModelError

FORMAT_VERSION = 1


def cache_dir() -> Path:
    """NANOCOMPILE_CACHE, else $XDG_CACHE_HOME/nanocompile, else ~/.cache/nanocompile."""
    if os.environ.get("NANOCOMPILE_CACHE"):
        return Path(os.environ["NANOCOMPILE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nanocompile"


def source_key(path: Path) -> str:
    """Identifies a model file, or a directory's files, by where they are, their sizes and their
    modification times: a file that changes gets a new key."""
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    text = "|".join(f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    return hashlib.sha256(f"{text}|{FORMAT_VERSION}".encode()).hexdigest()[:20]


def weights_entry(path: Path) -> Path:
    return cache_dir() / "weights" / source_key(path)


def save_weights(entry: Path, weights: dict[str, np.ndarray], meta: dict) -> None:
    """Writes the weights as one safetensors file, then meta.json last, so a half-written
    entry is never taken for a complete one."""
    from safetensors.numpy import save_file

    entry.mkdir(parents=True, exist_ok=True)
    tmp = entry / f"weights.safetensors.tmp{os.getpid()}"
    try:
        save_file({k: np.ascontiguousarray(v) for k, v in weights.items()}, str(tmp))
        os.replace(tmp, entry / "weights.safetensors")
        (entry / "meta.json").write_text(json.dumps(meta, sort_keys=True))
    except OSError as e:
        # a full disk or a read-only cache costs speed next time, not this run
        import warnings
        warnings.warn(f"could not cache dequantized weights in {entry}: {e}")
    finally:
        if tmp.exists():
            tmp.unlink()


def load_weights(entry: Path) -> tuple[dict[str, np.ndarray], dict] | None:
    from .safetensors_reader import read_safetensors

    meta_file = entry / "meta.json"
    if not meta_file.exists():
        return None
    try:
        meta = json.loads(meta_file.read_text())
        return read_safetensors(entry / "weights.safetensors"), meta
    except (OSError, ValueError, ModelError):
        return None  # a damaged entry is rebuilt
