"""One lock per cache entry being made, so two processes preparing the same model or building
the same library wait for each other instead of doing the work twice (`filelock`: flock(2) on
Linux, released by the kernel when a process dies)."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import xxhash
from filelock import FileLock, Timeout

from .location import cache_root
from .notes import note


def lock_path(entry: Path) -> Path:
    return cache_root().place("locks") / f"{entry.name[:60]}-{xxhash.xxh3_64_hexdigest(str(entry).encode())}.lock"


def _file_lock(entry: Path) -> FileLock:
    path = lock_path(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path), thread_local=False)


@contextmanager
def entry_lock(entry: Path, what: str):
    """Holds entry's lock; says so once if another process holds it first."""
    lock = _file_lock(entry)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        note(f"waiting for another nanocompile process that is preparing {what}")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


@contextmanager
def try_entry_lock(entry: Path):
    """Holds entry's lock if no other process does; yields whether it got it."""
    lock = _file_lock(entry)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()
