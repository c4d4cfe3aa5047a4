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
from concurrent.futures import ThreadPoolExecutor, wait
from importlib import resources
from pathlib import Path
from typing import Callable

from ..cache.files import CacheError, check_entry, write_entry
from ..cache.location import cache_root
from ..cache.locks import entry_lock
from ..cache.notes import note
from ..codegen.module import Module
from ..codegen.render import render_tree
from ..codegen.tree import write_tree
from ..errors import NanocompileError
from ..version import GENERATOR


class BuildError(NanocompileError):
    pass


# set (to anything but 0): compiling C is refused, naming what would have been built. For a machine
# that must only run libraries built beforehand (`nanocompile compile`), and for the test suite's
# fast tier, whose tests must not reach a compiler (tests/tiers.py)
NO_BUILD = "NANOCOMPILE_NO_BUILD"


def refuse_if_turned_off(what: str) -> None:
    if os.environ.get(NO_BUILD, "0") not in ("", "0"):
        raise BuildError(f"{what}: compiling C is turned off here ({NO_BUILD} is set)")


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
    refuse_if_turned_off(f"building {tree}")
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


def packaged_dir() -> Path | None:
    """Where the installed package keeps the libraries it ships (None: a source tree, none)."""
    try:
        lib_dir = Path(str(resources.files("nanocompile") / "lib"))
    except (ModuleNotFoundError, TypeError):
        return None
    return lib_dir if lib_dir.is_dir() else None


def is_shipped(library: Path) -> bool:
    return packaged_dir() is not None and Path(library).parent == packaged_dir()


def packaged_manifests() -> list[tuple[dict, Path]]:
    """(manifest, directory) of each library shipped in the installed package."""
    lib_dir = packaged_dir()
    if lib_dir is None:
        return []
    out = []
    for f in sorted(lib_dir.glob("*.json")):
        out.append((json.loads(f.read_text()), lib_dir))
    return out


def library_file(directory: Path, manifest: dict) -> Path:
    return directory / f"lib{manifest['library']}.so"


def library_made_from(manifest: dict, fingerprint_hash: str) -> dict:
    """What a cached library's sidecar says it was built from: exactly these generated sources,
    for this fingerprint."""
    return {"source_sha256": manifest["source_sha256"], "fingerprint": fingerprint_hash}


def find_or_build(module: Module, progress=None, meanwhile: Callable[[], None] | None = None) -> tuple[Path, dict]:
    """The compiled library for this module: shipped, cached, or built now. A library is used
    only if it was built from exactly the sources this package generates for the module, and a
    cached one only if its bytes match its sidecar; two processes needing the same library
    build it once (the second waits). meanwhile, if given, runs once on this thread: while the C
    compiler runs when the library is built now (a first run packs the weights then), else
    after the library is found."""
    meanwhile = meanwhile or (lambda: None)
    wanted = json.loads(render_tree(module)["manifest.json"])
    for manifest, directory in packaged_manifests():
        if manifest == wanted and library_file(directory, manifest).exists():
            meanwhile()
            return library_file(directory, manifest), manifest
    root = cache_root()
    relative = f"libs/{module.fingerprint_hash[:20]}/{library_file(Path(), wanted).name}"
    made_from = library_made_from(wanted, module.fingerprint_hash)
    for candidate in root.candidates(relative):
        if check_entry(candidate, made_from) is None:
            meanwhile()
            return candidate, wanted
    refuse_if_turned_off(f"building a library for {module.prefix.rstrip('_')}")  # before its tree is made
    lib = root.place(relative)
    tree = lib.parent
    with entry_lock(lib, f"the library {tree.name}"):
        problem = check_entry(lib, made_from)
        if problem is None:
            found = True
        else:
            found = False
            if problem != "is missing":
                note(f"{lib} {problem}; building it again")
            if progress:
                progress(f"compiling a library for this config in {tree}")
            try:
                write_tree(module, tree)
            except OSError as e:
                raise CacheError(f"{tree}: cannot be written ({e.strerror}); set NANOCOMPILE_CACHE to another "
                                 f"directory") from None

            def build_and_install():  # installed even if meanwhile fails: the library is good
                cmake_build(tree, tree / "build", target=wanted["library"])
                built = library_file(tree / "build", wanted).read_bytes()
                write_entry(lib, made_from, lambda out: out.write(built), generator=GENERATOR,
                            fingerprint=module.fingerprint)

            build_while(build_and_install, meanwhile)
    if found:  # another process built it while this one waited
        meanwhile()
    return lib, wanted


def build_while(build: Callable[[], None], meanwhile: Callable[[], None]) -> None:
    """build() on a thread of its own while meanwhile() runs on this one: the C compiler spends
    most of a first run on one translation unit, so the weights are packed on the other core.
    Both have finished when this returns; meanwhile's error is raised first, then build's."""
    with ThreadPoolExecutor(1, thread_name_prefix="nanocompile-build") as pool:
        building = pool.submit(build)
        try:
            meanwhile()
        except BaseException:
            wait([building])  # no compiler left running behind the error
            raise
        building.result()
