"""Cache files written atomically and checked before use.

A file is written under a temporary name that carries the writer's PID (.<name>.tmp-<pid>-<rand>),
flushed to disk, and renamed: a reader sees the whole file or none. Its sidecar <name>.meta.json
records what it was made from, the xxh3-128 of its bytes and the file's identity when it was
written (device, inode, size, modification and change times in nanoseconds); small records
(sidecars, index entries) carry the xxh3-64 of their own JSON. A file is used only if its
identity is still the one recorded, or, if anything about it changed, its every byte matches the
checksum (xxh3 at memory speed: 0.07 s for the default model's 491 MB here); `nanocompile cache
verify` hashes every byte of everything (docs/CACHE.md).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from pathlib import Path
from typing import Callable

import xxhash

from ..errors import NanocompileError

FORMAT = 1
CHECKSUM = "xxh3_128"
SIDECAR_SUFFIX = ".meta.json"
STALE_SECONDS = 3600  # a temporary file nobody has written to for an hour is abandoned

_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)-[0-9a-f]+$")
_OLD_TEMPORARY = re.compile(r"^(?P<name>.+)\.tmp(?P<pid>\d+)$")  # nanocompile's names before this cache


class CacheError(NanocompileError):
    """The cache cannot be used: its path is a file, or an entry cannot be written."""


def temporary_name(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def sidecar_path(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR_SUFFIX)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# AtomicFile writes the file in pieces of this size, at offsets that are multiples of it: each
# write covers whole, aligned 2 MiB ranges, and the page cache keeps the file in 2 MiB folios
# where the kernel and filesystem have them (Linux 6.x on ext4, xfs), and a mapping of the
# packed weights is in 2 MiB pages. Written tensor by tensor (writes of any size at any offset),
# a fresh file stayed in 4 KiB folios until evicted and came back in 2 MiB ones: which of the
# two a run got depended on the machine's history. In a busy hour the 4 KiB state's decode step
# took up to 1.1x as long; in a quiet one no difference showed (docs/results/phase14.md).
WRITE_PIECE = 8 << 20


class AtomicFile:
    """`with AtomicFile(dest) as out: out.write(...)`: dest appears complete, or not at all.
    The bytes are hashed as they are written (out.checksum, out.size) and reach the file in
    aligned pieces of WRITE_PIECE bytes (the last one shorter)."""

    def __init__(self, dest: Path):
        self.dest = dest
        self.tmp = temporary_name(dest)
        self.hasher = xxhash.xxh3_128()
        self.size = 0
        self._piece = bytearray()

    def __enter__(self) -> "AtomicFile":
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.tmp, "xb")
        return self

    def write(self, data) -> None:
        view = memoryview(data).cast("B")
        self.hasher.update(view)
        self.size += view.nbytes
        while view.nbytes:
            take = min(WRITE_PIECE - len(self._piece), view.nbytes)
            self._piece += view[:take]
            view = view[take:]
            if len(self._piece) == WRITE_PIECE:
                self.file.write(self._piece)
                self._piece.clear()

    def __exit__(self, kind, exc, tb) -> bool:
        try:
            if kind is None:
                self.file.write(self._piece)
                self.file.flush()
                os.fsync(self.file.fileno())
            self.file.close()
            if kind is None:
                os.replace(self.tmp, self.dest)
                fsync_dir(self.dest.parent)
        finally:
            self.tmp.unlink(missing_ok=True)
        return False

    @property
    def checksum(self) -> str:
        return self.hasher.hexdigest()


# small records: JSON that carries its own checksum ---------------------------------------------
def _canonical(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def write_record(path: Path, data: dict) -> None:
    text = json.dumps({"record": data, "xxh3_64": xxhash.xxh3_64_hexdigest(_canonical(data))}, sort_keys=True)
    with AtomicFile(path) as out:
        out.write(text.encode())


def read_record(path: Path) -> dict | None:
    """The record, or None if it is missing or damaged."""
    try:
        wrapper = json.loads(path.read_bytes())
        data = wrapper["record"]
        if not isinstance(data, dict) or wrapper["xxh3_64"] != xxhash.xxh3_64_hexdigest(_canonical(data)):
            return None
        return data
    except (OSError, ValueError, KeyError, TypeError):
        return None


# entries: a file and its sidecar ---------------------------------------------------------------
def write_entry(dest: Path, made_from: dict, write: Callable[[AtomicFile], None], **facts) -> dict:
    """Writes dest through write(out), then its sidecar; returns the sidecar's record. A full
    disk or a directory that cannot be written is an error naming the file; nothing is left."""
    try:
        with AtomicFile(dest) as out:
            write(out)
        # the identity after the rename (which sets the change time); the entry's lock, or equal
        # bytes from every writer, keep another version from being renamed over it meanwhile
        meta = {"format": FORMAT, "file": dest.name, "size": out.size, CHECKSUM: out.checksum,
                "identity": identity(os.stat(dest)), "made_from": made_from,
                "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **facts}
        write_record(sidecar_path(dest), meta)
    except OSError as e:
        raise CacheError(f"{dest}: cannot be written ({e.strerror or e}); free some space, or set "
                         f"NANOCOMPILE_CACHE to another directory") from None
    return meta


CHUNK = 8 << 20


def checksum_fd(fd: int) -> str:
    """xxh3-128 of an open file's bytes, read through a small buffer: the pages go to the page
    cache, not into this process's resident memory (a memory map would count them)."""
    hasher = xxhash.xxh3_128()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    offset = 0
    while n := os.preadv(fd, [view], offset):
        hasher.update(view[:n])
        offset += n
    return hasher.hexdigest()


def checksum_file(path: Path) -> str:
    with open(path, "rb") as f:
        return checksum_fd(f.fileno())


def identity(st: os.stat_result) -> list[int]:
    """What any change to a file changes: device, inode, size, modification and change times (a
    write, a copy, a rename onto it, even resetting the modification time, sets the change time)."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def check_entry(path: Path, made_from: dict | None, file=None, full: bool = False) -> str | None:
    """None if path is whole, made from made_from, and unchanged since it was written (its
    identity is the sidecar's) or else its bytes match the sidecar's checksum; otherwise what is
    wrong, in a few words. full: hash every byte whatever the identity says (cache verify).
    file: path already open, so what is checked is what the caller then reads, even if another
    process renames a new version over path meanwhile."""
    if not path.is_file():
        return "is missing"
    meta = read_record(sidecar_path(path))
    if meta is None:
        return "has no valid sidecar" if sidecar_path(path).exists() else "has no sidecar"
    if meta.get("format") != FORMAT:
        return f"has sidecar format {meta.get('format')}, expected {FORMAT}"
    if made_from is not None and meta.get("made_from") != made_from:
        return "was made from something else"
    if file is None:
        with open(path, "rb") as f:
            return _check_bytes(path, f.fileno(), meta, full)
    return _check_bytes(path, file.fileno(), meta, full)


def _check_bytes(path: Path, fd: int, meta: dict, full: bool) -> str | None:
    st = os.fstat(fd)
    if st.st_size != meta.get("size"):
        return f"is {st.st_size} bytes, its sidecar says {meta.get('size')}"
    if not full and meta.get("identity") == identity(st):
        return None  # not changed since it was written, and hashed then
    if checksum_fd(fd) != meta.get(CHECKSUM):
        return "does not match its checksum (damaged)"
    if meta.get("identity") != identity(st):  # hashed in full and whole: the next check need not
        try:
            write_record(sidecar_path(path), {**meta, "identity": identity(st)})
        except OSError:
            pass  # a cache that cannot be written: hashed again next time
    return None


def remove_entry(path: Path) -> None:
    sidecar_path(path).unlink(missing_ok=True)
    path.unlink(missing_ok=True)


# temporaries of killed runs --------------------------------------------------------------------
def pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def temporary_writer(path: Path) -> int | None:
    """The PID in a temporary file's name, or None if path is not a temporary file."""
    m = _TEMPORARY.match(path.name) or _OLD_TEMPORARY.match(path.name)
    return int(m.group("pid")) if m else None


def abandoned(path: Path) -> bool:
    pid = temporary_writer(path)
    if pid is None:
        return False
    try:
        idle = time.time() - path.lstat().st_mtime
    except FileNotFoundError:
        return False
    return not pid_alive(pid) or idle > STALE_SECONDS


def cache_directories(root: Path) -> list[Path]:
    """The directories that hold entries (and so may hold temporaries)."""
    dirs = [root] + [root / d for d in ("models", "packed", "libs", "index", "checked", "weights")]
    for parent in (root / "libs", root / "weights"):
        if parent.is_dir():
            dirs += [d for d in parent.iterdir() if d.is_dir()]
    return [d for d in dirs if d.is_dir()]


def sweep_temporaries(root: Path) -> list[Path]:
    """Removes temporary files whose writer died or stopped writing an hour ago."""
    removed = []
    for d in cache_directories(root):
        try:
            entries = list(d.iterdir())
        except OSError:
            continue
        for path in entries:
            if abandoned(path):
                try:
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path)
                    else:
                        path.unlink()
                    removed.append(path)
                except OSError:
                    pass  # another process removed it first, or the cache is read-only
    return removed
