"""The packed weights file a compiled library reads: a 4096-byte header (magic, version, the
layout hash), then every tensor at the offset the library was compiled with, in the layout its
kernels read (row-major, or blocked where a schedule packs it).

It is made straight from the model file: each tensor is converted from the source, encoded for
the library's precision, written and dropped, in file order, so neither a float32 copy of the
model nor the whole packed file is ever held in memory. The file is written atomically with a
sidecar recording what it was made from (the source's content hash, the layout, the precision,
this packer's version) and the xxh3-128 of its bytes (cache/files.py).

The weights arrive in the form their precision's graph reads (open.weight_form, built once by
the open step): f32 converts each tensor; int8 splits a GGUF's Q8_0 blocks as stored and
quantizes every other matrix once from its float32 form, with no float32 intermediate on disk.
native runs int8's library on the file's own blocks; the form's name is recorded in the sidecar
(and the cache names the file after it), so int8's and native's weights never share a file.

In the cache a packed file is found by the source's content hash, the layout hash and the form,
all known before anything is compiled (engine/warm.py), and checked in full before it is mapped.
"""
from __future__ import annotations

import mmap
import struct
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..cache.files import check_entry, write_entry
from ..cache.location import cache_root
from ..cache.locks import entry_lock
from ..cache.notes import note
from ..errors import ModelError
from ..models.weights import WeightSource
from ..version import GENERATOR
from .progress import note_above, progress_bar

if TYPE_CHECKING:
    from ..codegen.layout import WeightSlot
    from ..codegen.module import Module

MAGIC = b"NCWEIGHT"
VERSION = 1
PACKER = 3  # what pack_weights writes; a change makes every packed file in the cache stale


def header(weights_bytes: int, layout_hash: str) -> bytes:
    from ..codegen.layout import HEADER_BYTES

    head = MAGIC + struct.pack("<IIQ", VERSION, HEADER_BYTES, weights_bytes) + layout_hash.encode()
    return head + b"\0" * (HEADER_BYTES - len(head))


def _laid_out(slot: "WeightSlot", array: np.ndarray) -> np.ndarray:
    """The array as the slot stores it: its dtype, its shape checked, blocked if packed. (The
    layout code is imported where a file is written: finding one in the cache does not need it.)"""
    from ..codegen.layout import NP_DTYPES
    from ..schedule.blocking import pack_array

    array = np.ascontiguousarray(array, dtype=NP_DTYPES[slot.dtype])
    if array.shape != slot.shape:
        raise ModelError(f"weight {slot.name!r} has shape {list(array.shape)}, the library expects {list(slot.shape)}")
    return pack_array(array, *slot.packed) if slot.packed else array


def form_of(weights) -> str:
    """The precision weights are the form of (models.quantize's views name theirs; arrays: f32)."""
    return getattr(weights, "form", "f32")


def made_from(layout_hash: str, source_key: str | None, form: str) -> dict:
    """What a packed file is made from; a cached file is used only if its sidecar says exactly this."""
    return {"source": source_key, "layout": layout_hash, "precision": form, "packer": PACKER}


def pack_weights(module: "Module", weights, dest: Path, progress=None, source_key: str | None = None,
                 say=note) -> dict:
    """Writes dest from weights in their precision's form (open.weight_form: a WeightSource for
    f32, an int8 or native view, or arrays), one tensor at a time; returns the sidecar record.
    say: where the form's one-line note goes (native's requantized tensors: once per packing,
    the file is cached)."""
    said = getattr(weights, "fallback_note", lambda: None)()
    if said:
        say(said)
    fetch = weights.tensor if isinstance(weights, WeightSource) else weights.__getitem__  # tensor(): not kept

    def write(out) -> None:
        out.write(header(module.weights_bytes, module.layout_hash))
        for slot in sorted(module.weights, key=lambda s: s.offset):
            if slot.name not in weights:
                raise ModelError(f"weight {slot.name!r} is missing (the weights are in {form_of(weights)}'s form, "
                                 f"the library reads {module.precision}'s)")
            if slot.offset < out.size:
                raise ModelError(f"weight {slot.name!r} overlaps the one before it in the library's layout")
            out.write(bytes(slot.offset - out.size))
            data = _laid_out(slot, fetch(slot.name))
            if data.nbytes != slot.nbytes:
                raise ModelError(f"weight {slot.name!r} encodes to {data.nbytes} bytes, the library expects "
                                 f"{slot.nbytes}")
            out.write(data)
            del data
            if progress:
                progress(slot.nbytes)
        out.write(bytes(module.weights_bytes - out.size))

    return write_entry(dest, made_from(module.layout_hash, source_key, form_of(weights)), write, generator=GENERATOR,
                       source_path=getattr(weights, "where", "weights"), finite=True)


def packed_name(layout_hash: str, source_key: str, form: str, graph: str) -> str:
    """The cache's name for a source's weights in a layout; the form is named where it is not the
    graph's own (native's weights for int8's library)."""
    suffix = f"-{form}" if form != graph else ""
    return f"packed/{source_key[:20]}-{layout_hash[:16]}{suffix}.bin"


def map_weights(path: Path, file=None) -> np.ndarray:
    """The packed file mapped read-only as bytes, the mapping marked for 2 MiB pages: where the
    file is not in the page cache yet, the kernel reads it in 2 MiB folios and maps them whole
    (Linux 6.x on ext4, xfs; elsewhere the mark does nothing): the state a file written by
    cache/files.AtomicFile is in from the start (docs/results/phase14.md for what it gains)."""
    with (open(path, "rb") if file is None else file) as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mapping.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(mapping, dtype=np.uint8)


def _map_checked(path: Path, want: dict) -> tuple[np.ndarray | None, str]:
    """path mapped, if it passes its check (the mapping is of the file that was checked); else
    None and why not."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return None, "is missing"
    except OSError as e:
        return None, f"cannot be read ({e.strerror})"
    with f:
        problem = check_entry(path, want, file=f)
        if problem:
            return None, problem
        return map_weights(path, f), ""


def open_packed(layout_hash: str, weights_bytes: int, graph: str, weights, source_key: str, module,
                progress: bool = False) -> tuple[Path, np.ndarray, bool]:
    """A source's packed weights in a layout from the cache, checked; packed from the source
    (under a lock, so concurrent runs pack once) if missing or damaged, with a note if damaged.
    module() gives the Module to pack for, asked only then (a warm start compiles nothing
    otherwise). Returns the file, its mapping, and whether it was packed now."""
    form = form_of(weights)
    want = made_from(layout_hash, source_key, form)
    root = cache_root()
    name = packed_name(layout_hash, source_key, form, graph)
    for candidate in root.candidates(name):
        mapped, _ = _map_checked(candidate, want)
        if mapped is not None:
            return candidate, mapped, False
    dest = root.place(name)
    with entry_lock(dest, f"the packed weights {dest.name}"):
        mapped, problem = _map_checked(dest, want)
        if mapped is not None:
            return dest, mapped, False
        if problem != "is missing":
            note(f"{dest} {problem}; packing it again")
        target = module()
        bar = progress_bar(weights_bytes, "packing weights") if progress else None
        try:
            pack_weights(target, weights, dest, bar.update if bar else None, source_key=source_key,
                         say=partial(note_above, bar) if bar else note)
        finally:
            if bar:
                bar.close()
    return dest, map_weights(dest), True
