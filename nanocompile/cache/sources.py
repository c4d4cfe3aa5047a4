"""What a model file is, by content: the xxh3-128 of its bytes, computed once per file version.

Hashing the default model (491 MB) takes about 0.05 s from the page cache and a disk read
otherwise, so it is not redone on every run: index/ keeps, per file path, the file's identity
(device, inode, size, modification and change times in nanoseconds) and its hash; a file whose
identity changed is hashed again. A directory's hash combines its files' hashes. Facts that
depend only on the content (all weights finite) are kept in checked/<hash>.json.
"""
from __future__ import annotations

from pathlib import Path

import xxhash

from .files import checksum_file, read_record, write_record
from .location import cache_root


def file_identity(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path.resolve()), "device": st.st_dev, "inode": st.st_ino, "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def _index_name(path: Path) -> str:
    return f"index/{xxhash.xxh3_64_hexdigest(str(path.resolve()).encode())}.json"


def file_hash(path: Path) -> str:
    identity = file_identity(path)
    for candidate in cache_root().candidates(_index_name(path)):
        record = read_record(candidate)
        if record and record.get("identity") == identity:
            return record["xxh3_128"]
    digest = checksum_file(path)
    if file_identity(path) == identity:  # unchanged while it was read
        remember(path, digest, identity)
    return digest


def remember(path: Path, digest: str, identity: dict | None = None) -> None:
    """Records path's hash (known to its writer, as for the assembled default model)."""
    try:
        write_record(cache_root().place(_index_name(path)), {"identity": identity or file_identity(path),
                                                             "xxh3_128": digest})
    except OSError:
        pass  # the hash is computed again next time


def content_hash(path: Path) -> str:
    """A file's hash, or a directory's: its regular files' names and hashes, in name order."""
    if not path.is_dir():
        return file_hash(path)
    parts = [f"{f.name}\0{file_hash(f)}\n" for f in sorted(path.iterdir()) if f.is_file()]
    return xxhash.xxh3_128_hexdigest("".join(parts).encode())


def checked(digest: str) -> dict:
    for candidate in cache_root().candidates(f"checked/{digest}.json"):
        record = read_record(candidate)
        if record is not None:
            return record
    return {}


def record_checked(digest: str, **facts) -> None:
    try:
        write_record(cache_root().place(f"checked/{digest}.json"), {**checked(digest), **facts})
    except OSError:
        pass  # checked again next time
