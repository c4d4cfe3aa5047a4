"""Everything in the cache, each entry checked in full and judged current, stale or orphaned:
what `nanocompile cache verify` prints and `nanocompile cache clean` removes.

Stale: made by another version of the packer, code generator or tokenizer builder, or from a
model file that is gone or changed; a warm-start record whose library is gone; old format: the
float32 copies (weights/) and unchecked files of nanocompile before this cache. Orphaned: a library
tree without an installed library (a killed build), a check result or tokenizer no index entry
leads to, a temporary file whose writer died.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from . import sources
from .files import abandoned, check_entry, read_record, sidecar_path, temporary_writer
from .locks import try_entry_lock


@dataclass(frozen=True)
class Current:
    """What this version of nanocompile makes, to tell current entries from stale ones."""
    generator: str
    packer: int
    default_model: str  # file name
    default_sha256: str
    tokenizer_builder: str  # models.tokenizer.builder_digest()
    warm_version: int       # engine.warm.RECORD_VERSION


@dataclass
class Entry:
    kind: str
    path: Path
    size: int
    problem: str | None = None  # fails its check
    stale: str | None = None  # no longer needed, and why

    @property
    def state(self) -> str:
        return "damaged" if self.problem else "stale" if self.stale else "ok"


def _bytes(path: Path) -> int:
    if path.is_dir() and not path.is_symlink():
        return sum(f.lstat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
    try:
        return path.lstat().st_size
    except FileNotFoundError:
        return 0


def _with_sidecar(path: Path) -> int:
    side = sidecar_path(path)
    return _bytes(path) + (_bytes(side) if side.exists() else 0)


def survey(root: Path, current: Current) -> list[Entry]:
    entries: list[Entry] = []
    entries += _temporaries(root)
    entries += _models(root / "models", current)
    packed = _packed(root / "packed", current)
    entries += packed
    libs = _libs(root / "libs", current)
    entries += libs
    live_sources = {(read_record(sidecar_path(e.path)) or {}).get("made_from", {}).get("source")
                    for e in packed if e.state == "ok"}
    records = _records(root, live_sources)
    entries += records
    live = live_sources | {(read_record(e.path) or {}).get("xxh3_128") for e in records
                           if e.kind == "index" and e.state == "ok"}
    entries += _tokenizers(root / "tokenizers", live, current)
    entries += _warm(root / "warm", current, {e.path for e in libs if e.state != "ok"})
    entries += _headers(root / "headers")
    if (root / "weights").is_dir():
        for d in sorted((root / "weights").iterdir()):
            entries.append(Entry("float32 copy", d, _bytes(d), stale="old format: dequantized float32 weights, "
                                                                       "no longer read"))
    return entries


def _files(d: Path):
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if temporary_writer(p) is None and not p.name.endswith(".meta.json"))


def _temporaries(root: Path) -> list[Entry]:
    from .files import cache_directories

    out = []
    for d in cache_directories(root):
        for p in sorted(d.iterdir()):
            if temporary_writer(p) is not None:
                stale = "left by a run that was killed" if abandoned(p) else None
                out.append(Entry("temporary", p, _bytes(p), stale=stale))
    return out


def _orphan_sidecars(d: Path) -> list[Entry]:
    if not d.is_dir():
        return []
    return [Entry("sidecar", p, _bytes(p), stale="its file is gone") for p in sorted(d.glob("*.meta.json"))
            if not p.with_name(p.name[:-len(".meta.json")]).exists()]


def _models(d: Path, current: Current) -> list[Entry]:
    out = _orphan_sidecars(d)
    for p in _files(d):
        e = Entry("default model", p, _with_sidecar(p), problem=check_entry(p, None, full=True))
        meta = read_record(sidecar_path(p)) or {}
        if p.name != current.default_model or meta.get("made_from", {}).get("sha256") != current.default_sha256:
            e.stale = "not this version's default model"
        out.append(e)
    return out


def _packed(d: Path, current: Current) -> list[Entry]:
    out = _orphan_sidecars(d)
    for p in _files(d):
        e = Entry("packed weights", p, _with_sidecar(p), problem=check_entry(p, None, full=True))
        meta = read_record(sidecar_path(p)) or {}
        made = meta.get("made_from", {})
        source = Path(meta.get("source_path", ""))
        if e.problem:
            pass
        elif made.get("packer") != current.packer or meta.get("generator") != current.generator:
            e.stale = f"made by another version ({meta.get('generator')}, packer {made.get('packer')})"
        elif not meta.get("source_path") or not source.exists():
            e.stale = f"its model {source} is gone"
        elif sources.content_hash(source) != made.get("source"):
            e.stale = f"its model {source} has changed"
        out.append(e)
    return out


def _libs(d: Path, current: Current) -> list[Entry]:
    out = []
    if not d.is_dir():
        return out
    for tree in sorted(p for p in d.iterdir() if p.is_dir() and temporary_writer(p) is None):
        lib = _library_file(tree)
        if not lib.exists():
            out.append(Entry("library", tree, _bytes(tree), stale="no installed library (an interrupted build, or "
                                                                   "an older nanocompile's)"))
            continue
        e = Entry("library", tree, _bytes(tree), problem=check_entry(lib, None, full=True))
        meta = read_record(sidecar_path(lib)) or {}
        if not e.problem and meta.get("generator") != current.generator:
            e.stale = f"made by another version ({meta.get('generator')})"
        out.append(e)
    return out


def _records(root: Path, live_sources: set) -> list[Entry]:
    """Index entries, and check results: kept while an index entry or a current packed file
    (a directory's hash is not in the index, its files' are) has that content."""
    out = []
    live_hashes = set(live_sources)
    for p in _files(root / "index"):
        record = read_record(p)
        e = Entry("index", p, _bytes(p), problem=None if record else "is damaged")
        if record:
            identity = record.get("identity", {})
            path = Path(identity.get("path", ""))
            try:
                changed = sources.file_identity(path) != identity
            except OSError:
                changed = True
            if changed:
                e.stale = f"{path} is gone or changed"
            else:
                live_hashes.add(record.get("xxh3_128"))
        out.append(e)
    for p in _files(root / "checked"):
        record = read_record(p)
        e = Entry("check", p, _bytes(p), problem=None if record is not None else "is damaged")
        if record is not None and p.stem not in live_hashes:
            e.stale = "no model file in the index, and no packed weights, has this content"
        out.append(e)
    return out


def _tokenizers(d: Path, live: set, current: Current) -> list[Entry]:
    """A GGUF file's tokenizer, kept while a model file of its content is known."""
    out = _orphan_sidecars(d)
    for p in _files(d):
        e = Entry("tokenizer", p, _with_sidecar(p), problem=check_entry(p, None, full=True))
        made = (read_record(sidecar_path(p)) or {}).get("made_from", {})
        if not e.problem and made.get("builder") != current.tokenizer_builder:
            e.stale = "built by another version of the tokenizer builder"
        elif not e.problem and made.get("source") not in live:
            e.stale = "no model file in the index has this content"
        out.append(e)
    return out


def _warm(d: Path, current: Current, going: set[Path]) -> list[Entry]:
    """Warm-start records (engine/warm.py): kept while the library they name is there and is
    not itself damaged or stale (going: the library trees this survey finds so)."""
    out = []
    for p in _files(d):
        record = read_record(p)
        e = Entry("warm start", p, _bytes(p), problem=None if record else "is damaged")
        library = Path((record or {}).get("library", ""))
        if record and record.get("version") != current.warm_version:
            e.stale = "an older nanocompile's record"
        elif record and (not library.is_file() or library.parent in going):
            e.stale = f"its library {library} is gone, damaged or stale"
        out.append(e)
    return out


def _headers(d: Path) -> list[Entry]:
    """Parsed GGUF headers (models/gguf_file.py): kept while their file is there, unchanged."""
    from .files import identity

    out = []
    for p in _files(d):
        record = read_record(p)
        e = Entry("gguf header", p, _bytes(p), problem=None if record else "is damaged")
        if record:
            try:
                changed = identity(Path(record.get("path", "")).stat()) != record.get("identity")
            except OSError:
                changed = True
            if changed:
                e.stale = f"{record.get('path')} is gone or changed"
        out.append(e)
    return out


def _library_file(tree: Path) -> Path:
    """The installed library's path in a library tree (the name its builder locks)."""
    try:
        return tree / f"lib{json.loads((tree / 'manifest.json').read_text())['library']}.so"
    except (OSError, ValueError, KeyError, TypeError):
        return tree / "lib.so"


def remove(entry: Entry) -> str | None:
    """Removes an entry unless a process holds its lock; returns why not, or None."""
    target = entry.path
    lock_on = _library_file(target) if entry.kind == "library" else target
    with try_entry_lock(lock_on) as got:
        if not got and entry.kind in ("packed weights", "library", "default model"):
            return "in use by another process"
        try:
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
                sidecar_path(target).unlink(missing_ok=True)
        except OSError as e:
            return e.strerror
    return None
