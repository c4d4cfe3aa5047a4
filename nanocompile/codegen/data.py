"""Where the templates, the hand-written runtime and the CMake files are, and a digest of them."""
from __future__ import annotations

import hashlib
from pathlib import Path

DATA_DIRS = ("templates", "runtime", "cmake")


def data_root() -> Path:
    """Where templates/, runtime/ and cmake/ are: inside the installed package, or the source tree."""
    here = Path(__file__).resolve().parents[1]
    for root in (here, here.parent):
        if (root / "templates" / "model.c.j2").exists():
            return root
    raise FileNotFoundError(f"templates/model.c.j2 not found next to {here}")


_digest: list[str] = []  # computed once per process


def sources_digest() -> str:
    """A hash of every file a library is built from besides the generated kernels: a library
    (or a test's graph library) compiled from other runtime helpers or templates is another one."""
    if _digest:
        return _digest[0]
    h = hashlib.sha256()
    root = data_root()
    for d in DATA_DIRS:
        for f in sorted((root / d).rglob("*")):
            if f.is_file() and f.suffix != ".pyc":
                h.update(f"{d}/{f.relative_to(root / d)}\n".encode())
                h.update(f.read_bytes())
    _digest.append(h.hexdigest()[:20])
    return _digest[0]
