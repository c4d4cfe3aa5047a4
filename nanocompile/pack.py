"""The packed weights file a compiled library reads: a 4096-byte header (magic, version, the
layout hash), then every tensor at the offset the library was compiled with, in the layout its
kernels read (row-major, or blocked where a schedule packs it).

It is made straight from the model file: each tensor is converted from the source, encoded for
the library's precision, written and dropped, in file order, so neither a float32 copy of the
model nor the whole packed file is ever held in memory. The file is written atomically with a
sidecar recording what it was made from (the source's content hash, the layout, the precision,
this packer's version) and the xxh3-128 of its bytes (cache/files.py).

Each precision sees the source in its own form (checks.weights_in): f32 converts each tensor;
int8 splits a GGUF's Q8_0 blocks as stored (source.raw) and quantizes every other matrix once
from its float32 form, with no float32 intermediate on disk. native runs int8's library, so its
module's precision is int8's; the precision the file is packed for is passed on its own and
recorded in the sidecar (and the cache names the file after it), so the two never share a file.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from .cache.files import write_entry
from .cache.notes import note
from .checks import fallback_note, weights_in
from .choices import GRAPH_OF, PRECISIONS
from .errors import ModelError
from .layout import HEADER_BYTES, NP_DTYPES, WeightSlot
from .models.weights import WeightSource
from .schedule.pack import pack_array
from .version import GENERATOR

MAGIC = b"NCWEIGHT"
VERSION = 1
PACKER = 3  # what pack_weights writes; a change makes every packed file in the cache stale


def header(module) -> bytes:
    head = MAGIC + struct.pack("<IIQ", VERSION, HEADER_BYTES, module.weights_bytes) + module.layout_hash.encode()
    return head + b"\0" * (HEADER_BYTES - len(head))


def _laid_out(slot: WeightSlot, array: np.ndarray) -> np.ndarray:
    """The array as the slot stores it: its dtype, its shape checked, blocked if packed."""
    array = np.ascontiguousarray(array, dtype=NP_DTYPES[slot.dtype])
    if array.shape != slot.shape:
        raise ModelError(f"weight {slot.name!r} has shape {list(array.shape)}, the library expects {list(slot.shape)}")
    return pack_array(array, *slot.packed) if slot.packed else array


def weights_precision(module, precision: str | None) -> str:
    """The precision weights are packed for: precision if given (native for int8's library),
    else the module's; refused if the module's library does not run it."""
    precision = precision or module.precision
    if precision not in PRECISIONS:
        raise ModelError(f"no packer for precision {precision!r} (have: {', '.join(PRECISIONS)})")
    if GRAPH_OF[precision] != module.precision:
        raise ModelError(f"weights for precision {precision} do not fit a library compiled for {module.precision}")
    return precision


def made_from(module, source_key: str | None, precision: str | None = None) -> dict:
    """What a packed file is made from; a cached file is used only if its sidecar says exactly this.
    precision: the weights' (native for int8's library), by default the module's."""
    return {"source": source_key, "layout": module.layout_hash, "precision": weights_precision(module, precision),
            "packer": PACKER}


def pack_weights(module, weights, dest: Path, progress=None, source_key: str | None = None,
                 precision: str | None = None, say=note) -> dict:
    """Writes dest from weights (a model's WeightSource, a mapping of float32 arrays, or one
    already in the precision's form), one tensor at a time; returns the sidecar record.
    precision: the weights' form (native for int8's library), by default the module's; say: where
    a one-line note goes (native's requantized tensors: once per packing, the file is cached)."""
    precision = weights_precision(module, precision)
    source = weights_in(precision, weights)  # the library's names, in its form
    said = fallback_note(source)
    if said:
        say(said)
    fetch = source.tensor if isinstance(source, WeightSource) else source.__getitem__  # tensor(): not kept

    def write(out) -> None:
        out.write(header(module))
        for slot in sorted(module.weights, key=lambda s: s.offset):
            if slot.name not in source:
                raise ModelError(f"weight {slot.name!r} is missing")
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

    return write_entry(dest, made_from(module, source_key, precision), write, generator=GENERATOR,
                       source_path=getattr(source, "where", "weights"), finite=True)
