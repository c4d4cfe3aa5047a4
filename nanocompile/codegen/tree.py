"""A generated source tree on disk: the rendered files (written only where their text changed, so
CMake rebuilds only what changed) and copies of runtime/ and cmake/ beside them."""
from __future__ import annotations

import shutil
from pathlib import Path

from .data import data_root
from .module import Module
from .render import render_tree


def write_tree(module: Module, out: Path) -> dict[str, Path]:
    """Writes every generated file (only those whose text changed) and the runtime; returns them."""
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, text in render_tree(module).items():
        path = out / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        written[name] = path
    root = data_root()
    for sub in ("runtime", "cmake"):
        dst = out / sub
        dst.mkdir(exist_ok=True)
        for src in sorted((root / sub).iterdir()):
            if src.is_file() and (not (dst / src.name).exists() or (dst / src.name).read_bytes() != src.read_bytes()):
                shutil.copyfile(src, dst / src.name)
    return written
