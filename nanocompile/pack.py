"""The packed weights file a compiled library reads: a 4096-byte header (magic, version, the
layout hash), then every tensor at the offset the library was compiled with, in the layout its
kernels read (row-major, or blocked where a schedule packs it).

It is made straight from the model file: each tensor is converted from the source, encoded for
the library's precision, written and dropped, in file order, so neither a float32 copy of the
model nor the whole packed file is ever held in memory. The file is written atomically with a
sidecar recording what it was made from (the source's content hash, the layout, the precision,
this packer's version) and the xxh3-128 of its bytes (cache/files.py).

A precision is one encoder: (slot, source) -> the slot's bytes. f32 converts and reorders; a
quantized precision would encode from the same tensors (source.tensor), or, for the GGUF's own
types, from its blocks as stored (source.raw), with no float32 intermediate on disk.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Callable

import numpy as np

from .cache.files import write_entry
from .compiler import GENERATOR, HEADER_BYTES, ModelModule, WeightSlot
from .errors import ModelError
from .models.weights import WeightSource
from .schedule.pack import pack_array

MAGIC = b"NCWEIGHT"
VERSION = 1
PACKER = 2  # what pack_weights writes; a change makes every packed file in the cache stale


def header(module: ModelModule) -> bytes:
    head = MAGIC + struct.pack("<IIQ", VERSION, HEADER_BYTES, module.weights_bytes) + module.layout_hash.encode()
    return head + b"\0" * (HEADER_BYTES - len(head))


def encode_f32(slot: WeightSlot, source: WeightSource) -> np.ndarray:
    array = np.ascontiguousarray(source.tensor(slot.name), dtype=np.float32)
    if array.shape != slot.shape:
        raise ModelError(f"weight {slot.name!r} has shape {list(array.shape)}, the library expects {list(slot.shape)}")
    return pack_array(array, *slot.packed) if slot.packed else array


ENCODERS: dict[str, Callable[[WeightSlot, WeightSource], np.ndarray]] = {"f32": encode_f32}


def made_from(module: ModelModule, source_key: str | None) -> dict:
    """What a packed file is made from; a cached file is used only if its sidecar says exactly this."""
    return {"source": source_key, "layout": module.layout_hash, "precision": module.precision, "packer": PACKER}


def pack_weights(module: ModelModule, weights, dest: Path, progress=None, source_key: str | None = None) -> dict:
    """Writes dest from weights (a WeightSource, or a dict of arrays); returns its sidecar record."""
    source = WeightSource.from_arrays(weights)
    if module.precision not in ENCODERS:
        raise ModelError(f"no packer for precision {module.precision!r} (have: {', '.join(ENCODERS)})")
    encode = ENCODERS[module.precision]

    def write(out) -> None:
        out.write(header(module))
        for slot in sorted(module.weights, key=lambda s: s.offset):
            if slot.name not in source:
                raise ModelError(f"weight {slot.name!r} is missing")
            if slot.offset < out.size:
                raise ModelError(f"weight {slot.name!r} overlaps the one before it in the library's layout")
            out.write(bytes(slot.offset - out.size))
            data = encode(slot, source)
            if data.nbytes != slot.nbytes:
                raise ModelError(f"weight {slot.name!r} encodes to {data.nbytes} bytes, the library expects "
                                 f"{slot.nbytes}")
            out.write(data)
            del data
            if progress:
                progress(slot.nbytes)
        out.write(bytes(module.weights_bytes - out.size))

    return write_entry(dest, made_from(module, source_key), write, generator=GENERATOR,
                       source_path=source.where, finite=True)
