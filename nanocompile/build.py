"""Builds a generated source tree with CMake, and finds or builds the library for a config.

The library for the default architecture is built when the package is installed and ships in
the wheel (nanocompile/lib/). Any other config is generated and built on first use into the
cache, keyed by its fingerprint, through the same CMake path.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from importlib import resources
from pathlib import Path

from .codegen.render import render_tree
from .compiler import Module
from .errors import NanocompileError
from .generate import write_tree
from .models.cache import cache_dir


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
    only if it was built from exactly the sources this package generates for the module."""

    wanted = json.loads(render_tree(module)["manifest.json"])
    for manifest, directory in packaged_manifests():
        if manifest == wanted and library_file(directory, manifest).exists():
            return library_file(directory, manifest), manifest
    tree = cache_dir() / "libs" / module.fingerprint_hash[:20]
    build = tree / "build"
    manifest_path = tree / "manifest.json"
    if manifest_path.exists() and json.loads(manifest_path.read_text()) == wanted:
        lib = library_file(build, wanted)
        if lib.exists() and (tree / ".built").exists():
            return lib, wanted
    if progress:
        progress(f"compiling a library for this config in {tree}")
    (tree / ".built").unlink(missing_ok=True)
    write_tree(module, tree)
    cmake_build(tree, build, target=wanted["library"])
    (tree / ".built").write_text(wanted["source_sha256"])
    return library_file(build, wanted), wanted
