"""Where the cache is, whether this process can write to it, and where new entries go if not.

A cache directory that cannot be written (a read-only mount, another user's directory) is still
read: entries in it that pass their checks are used, and what must be made goes to a temporary
directory that lives as long as the process (slower: nothing is kept for the next run), with a
note. A cache path that is a file is an error.
"""
from __future__ import annotations

import atexit
import errno
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .files import CacheError, pid_alive, sweep_temporaries
from .notes import note

ENV = "NANOCOMPILE_CACHE"
SCRATCH_PREFIX = "nanocompile-cache-"
READ_ONLY_ERRORS = (errno.EACCES, errno.EROFS, errno.EPERM)


def configured_dir() -> Path:
    """NANOCOMPILE_CACHE, else $XDG_CACHE_HOME/nanocompile, else ~/.cache/nanocompile."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nanocompile"


@dataclass
class CacheRoot:
    path: Path  # where entries are looked up
    scratch: Path | None = None  # where new entries go when path cannot be written

    @property
    def writable(self) -> bool:
        return self.scratch is None

    @property
    def write_dir(self) -> Path:
        return self.path if self.scratch is None else self.scratch

    def place(self, relative: str | Path) -> Path:
        """Where a new entry at this relative path is written."""
        return self.write_dir / relative

    def candidates(self, relative: str | Path) -> list[Path]:
        """Where an existing entry may be: the cache, then this process's scratch directory."""
        return [self.path / relative] + ([self.scratch / relative] if self.scratch else [])


_roots: dict[str, CacheRoot] = {}


def cache_root() -> CacheRoot:
    """The cache for the current NANOCOMPILE_CACHE, opened once per process (which also sweeps
    temporary files that killed runs left behind)."""
    path = configured_dir()
    key = str(path)
    if key not in _roots:
        _roots[key] = _open(path)
    return _roots[key]


def cache_dir() -> Path:
    return cache_root().path


def _open(path: Path) -> CacheRoot:
    if path.exists() and not path.is_dir():
        raise CacheError(f"{path}: the cache path is a file, not a directory (set {ENV} to a directory)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except (NotADirectoryError, FileExistsError):
        raise CacheError(f"{path}: the cache path is inside a file, not a directory (set {ENV} to a directory)") \
            from None
    except OSError as e:
        if e.errno not in READ_ONLY_ERRORS:
            raise CacheError(f"{path}: cannot use the cache directory ({e.strerror})") from None
        scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))
        atexit.register(shutil.rmtree, scratch, ignore_errors=True)
        where = "is read-only" if e.errno == errno.EROFS else "cannot be written"
        note(f"the cache {path} {where} ({e.strerror}); using what it holds, and making the rest in "
             f"{scratch} for this run only (slower)")
        sweep_scratch_dirs()
        return CacheRoot(path, scratch)
    removed = sweep_temporaries(path)
    if removed:
        note(f"removed {len(removed)} temporary file(s) that killed runs left in {path}")
    sweep_scratch_dirs()
    return CacheRoot(path)


def sweep_scratch_dirs() -> None:
    """Removes scratch directories of processes that died without removing theirs."""
    for d in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*"):
        pid = d.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)
