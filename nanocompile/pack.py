"""The packed weights file a compiled library reads: a 4096-byte header (magic, version, the
layout hash), then every tensor in float32 at the offset the library was compiled with, in the
layout its kernels read (row-major, or blocked where a schedule packs it)."""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ModelError
from .schedule.pack import pack_array
from .signature import Signature, weight_buffer

MAGIC = b"NCWEIGHT"
VERSION = 1
HEADER_BYTES = 4096
WEIGHT_ALIGN = 64
DTYPE_BYTES = {"f32": 4, "i8": 1, "f16": 2}
NP_DTYPES = {"f32": np.float32, "i8": np.int8, "f16": np.float16}


@dataclass(frozen=True)
class WeightSlot:
    name: str         # the frontend's name (transformers')
    cname: str        # its C identifier
    shape: tuple[int, ...]
    offset: int       # bytes from the start of the packed file
    nbytes: int
    packed: tuple = ()  # (row, block): stored in the blocked layout schedule.Pack reads; () row-major
    dtype: str = "f32"

    @property
    def buffer(self) -> str:
        return weight_buffer(self.cname)


def weight_layout(signature: Signature, packed: dict[str, tuple]) -> list[WeightSlot]:
    """Every weight of the signature at an aligned offset after the header, in its order, in the
    layout the schedules chose for its buffer."""
    slots, offset = [], HEADER_BYTES
    for w in signature.weights:
        nbytes = int(np.prod(w.shape)) * DTYPE_BYTES[w.dtype]
        slots.append(WeightSlot(w.name, w.cname, tuple(w.shape), offset, nbytes, packed.get(weight_buffer(w.cname), ()),
                                w.dtype))
        offset += (nbytes + WEIGHT_ALIGN - 1) // WEIGHT_ALIGN * WEIGHT_ALIGN
    return slots


def header(module) -> bytes:
    head = MAGIC + struct.pack("<IIQ", VERSION, HEADER_BYTES, module.weights_bytes) + module.layout_hash.encode()
    return head + b"\0" * (HEADER_BYTES - len(head))


def pack_weights(module, weights: dict[str, np.ndarray], dest: Path, progress=None) -> Path:
    """Writes the packed file atomically (a temporary name, then a rename)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(header(module))
            for slot in module.weights:
                if slot.name not in weights:
                    raise ModelError(f"weight {slot.name!r} is missing")
                array = np.ascontiguousarray(weights[slot.name], dtype=NP_DTYPES[slot.dtype])
                if array.shape != slot.shape:
                    raise ModelError(f"weight {slot.name!r} has shape {list(array.shape)}, the library "
                                     f"expects {list(slot.shape)}")
                if slot.packed:
                    array = pack_array(array, *slot.packed)
                f.seek(slot.offset)
                f.write(memoryview(array).cast("B"))
                if progress:
                    progress(slot.nbytes)
            f.truncate(module.weights_bytes)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dest
