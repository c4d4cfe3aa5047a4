"""Builds a generated source tree with CMake, and finds or builds the library for a config.

The library for the default architecture is built when the package is installed and ships in
the wheel (nanocompile/lib/). Any other config is generated and built on first use into the
cache, keyed by its fingerprint, through the same CMake path, and installed beside its sources
(libs/<fingerprint>/lib<name>.so) atomically with a sidecar (cache/files.py).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from importlib import resources
from pathlib import Path

from .cache.files import CacheError, check_entry, write_entry
from .cache.location import cache_root
from .cache.locks import entry_lock
from .cache.notes import note
from .codegen.render import render_tree
from .compiler import Module
from .version import GENERATOR
from .errors import NanocompileError
from .generate import write_tree


class BuildError(NanocompileError):
    pass


def cmake_executable() -> str:
    exe = shutil.which("cmake")
    if exe is None:
        try:
            import cmake  # the PyPI package ships a binary
            exe = str(Path(cmake.CMAKE_BIN_DIR) / "cmake")
        except ImportError:
            raise BuildError("cmake is needed to compile a model for this config: pip install cmake") from None
    return exe


def cmake_build(tree: Path, build: Path, options: dict | None = None, target: str | None = None,
                quiet: bool = True) -> str:
    """Configures and builds; returns what the compiler printed (warnings included)."""
    cmake = cmake_executable()
    configure = [cmake, "-S", str(tree), "-B", str(build)]
    configure += [f"-D{k}={v}" for k, v in (options or {}).items()]
    steps = [configure, [cmake, "--build", str(build), "-j", str(os.cpu_count() or 1)]
             + (["--target", target] if target else [])]
    log = ""
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=quiet, text=True)
        log += (r.stdout or "") + (r.stderr or "")
        if r.returncode != 0:
            detail = (r.stdout or "")[-3000:] + (r.stderr or "")[-3000:] if quiet else ""
            raise BuildError(f"{' '.join(cmd[:2])} failed in {build}:\n{detail}")
    return log


def packaged_manifests() -> list[tuple[dict, Path]]:
    """(manifest, directory) of each library shipped in the installed package."""
    try:
        lib_dir = Path(str(resources.files("nanocompile") / "lib"))
    except (ModuleNotFoundError, TypeError):
        return []
    if not lib_dir.is_dir():
        return []
    out = []
    for f in sorted(lib_dir.glob("*.json")):
        out.append((json.loads(f.read_text()), lib_dir))
    return out


def library_file(directory: Path, manifest: dict) -> Path:
    return directory / f"lib{manifest['library']}.so"


def find_or_build(module: Module, progress=None) -> tuple[Path, dict]:
    """The compiled library for this module: shipped, cached, or built now. A library is used
    only if it was built from exactly the sources this package generates for the module, and a
    cached one only if its bytes match its sidecar; two processes needing the same library
    build it once (the second waits)."""

    wanted = json.loads(render_tree(module)["manifest.json"])
    for manifest, directory in packaged_manifests():
        if manifest == wanted and library_file(directory, manifest).exists():
            return library_file(directory, manifest), manifest
    root = cache_root()
    relative = f"libs/{module.fingerprint_hash[:20]}/{library_file(Path(), wanted).name}"
    made_from = {"source_sha256": wanted["source_sha256"], "fingerprint": module.fingerprint_hash}
    for candidate in root.candidates(relative):
        if check_entry(candidate, made_from) is None:
            return candidate, wanted
    lib = root.place(relative)
    tree = lib.parent
    with entry_lock(lib, f"the library {tree.name}"):
        problem = check_entry(lib, made_from)
        if problem is None:
            return lib, wanted
        if problem != "is missing":
            note(f"{lib} {problem}; building it again")
        if progress:
            progress(f"compiling a library for this config in {tree}")
        try:
            write_tree(module, tree)
        except OSError as e:
            raise CacheError(f"{tree}: cannot be written ({e.strerror}); set NANOCOMPILE_CACHE to another "
                             f"directory") from None
        cmake_build(tree, tree / "build", target=wanted["library"])
        built = library_file(tree / "build", wanted).read_bytes()
        write_entry(lib, made_from, lambda out: out.write(built), generator=GENERATOR,
                    fingerprint=module.fingerprint)
    return lib, wanted
