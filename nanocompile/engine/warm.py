"""A warm start: the library compiled for an opened model found by a key of its inputs, without
running the compiler.

The key is a hash of everything that reaches the generated C: the config, the compiler's options
(graph precision, target level and the ISA flags it requires, prompt chunk, fusion and schedules,
the tuned schedules in use, which weights are kept in 4-6 bits or in a K format's numbers), the
generator version, and the compiler itself (its Python sources, templates, runtime and CMake
files). Under it the cache keeps a record of the library built for those inputs: where it is, its
prefix and fingerprint, and the packed weights' layout hash and size. A run with a record loads
that library, checks its embedded fingerprint against the record and its ISA against this CPU
(engine/library.py), and maps the packed weights by the layout hash; only a run without one (or
whose record points at a library that is gone or damaged) compiles.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..cache.files import check_entry, read_record, write_record
from ..cache.location import cache_root
from ..codegen.data import sources_digest
from ..codegen.options import resolve_options
from ..version import GENERATOR

# the packages whose code decides the generated C (with target.py and version.py beside them)
COMPILER_PACKAGES = ("ir", "frontend", "passes", "loopir", "schedule", "codegen", "compiler")
COMPILER_MODULES = ("target.py", "version.py")
RECORD_VERSION = 1

if TYPE_CHECKING:
    from ..codegen.module import Module

_compiler_digest: list[str] = []


def package_root() -> Path:
    return Path(__file__).resolve().parents[1]


def compiler_digest(root: Path | None = None) -> str:
    """A hash of the compiler's Python sources and of the templates, runtime and CMake files a
    library is built from (computed once per process for the installed package)."""
    if root is None and _compiler_digest:
        return _compiler_digest[0]
    base = root or package_root()
    h = hashlib.sha256()
    files = [base / m for m in COMPILER_MODULES]
    for package in COMPILER_PACKAGES:
        files += sorted((base / package).rglob("*.py"))
    for f in files:
        h.update(f"{f.relative_to(base)}\n".encode())
        h.update(f.read_bytes())
    h.update(sources_digest().encode() if root is None else b"")
    digest = h.hexdigest()[:32]
    if root is None:
        _compiler_digest.append(digest)
    return digest


def inputs(opened) -> dict:
    """What the key hashes: every input that reaches the generated C."""
    options, isa = resolve_options(opened.options)
    fields = {f.name: getattr(options, f.name) for f in dataclasses.fields(options) if f.name != "choose"}
    return {"config": dataclasses.asdict(opened.config), "options": fields, "isa": isa, "generator": GENERATOR,
            "compiler": compiler_digest()}


def warm_key(opened) -> str | None:
    """The key of an opened model's library; None when the options cannot be keyed (a test's own
    schedule chooser)."""
    if opened.options.choose is not None:
        return None
    text = json.dumps(inputs(opened), sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Built:
    """A compiled library as a run needs it, whether just built or found by its key."""
    library: Path
    prefix: str
    fingerprint: dict         # what the library must embed
    layout_hash: str          # the packed weights' layout
    weights_bytes: int
    kernels: int
    tuned_kernels: int        # schedules measured on this CPU in use
    stale_tuned_kernels: int  # measured against recipes that have changed since: not used
    made_from: dict | None    # a cached library's sidecar record; None: shipped in the installed package

    @classmethod
    def of(cls, module: "Module", library: Path, manifest: dict) -> "Built":
        from ..compiler.build import is_shipped, library_made_from  # a library was just found or built

        made_from = None if is_shipped(library) else library_made_from(manifest, module.fingerprint_hash)
        return cls(Path(library), manifest["prefix"], module.fingerprint, module.layout_hash, module.weights_bytes,
                   len(module.kernels), len(module.tuned_kernels), len(module.stale_tuned_kernels), made_from)

    def intact(self) -> bool:
        """The library is there, and a cached one matches its sidecar (bytes and what it was made from)."""
        if not self.library.is_file():
            return False
        return self.made_from is None or check_entry(self.library, self.made_from) is None


def _record_name(key: str) -> str:
    return f"warm/{key[:32]}.json"


def find(key: str | None) -> Built | None:
    """The library recorded under key, if its record is whole and the library is still there and
    intact; else None, and the caller compiles."""
    if key is None:
        return None
    for candidate in cache_root().candidates(_record_name(key)):
        record = read_record(candidate)
        if not record or record.get("version") != RECORD_VERSION or record.get("key") != key:
            continue
        try:
            fields = {f.name: record[f.name] for f in dataclasses.fields(Built)}
            built = Built(**{**fields, "library": Path(fields["library"])})
        except (KeyError, TypeError):
            continue
        if built.intact():
            return built
    return None


def remember(key: str | None, built: Built) -> None:
    """Records built under key for the next run (a cache that cannot be written only costs a compile)."""
    if key is None:
        return
    record = {**dataclasses.asdict(built), "library": str(built.library), "version": RECORD_VERSION, "key": key}
    try:
        write_record(cache_root().place(_record_name(key)), record)
    except OSError:
        pass
