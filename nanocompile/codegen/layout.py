"""Where each weight lives in the packed weights file a library reads: its offset, bytes,
dtype and the blocked layout its kernels read it in. The compiler fixes this; pack.py writes it."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.signature import Signature, weight_buffer

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
    packed: tuple = ()  # (row, block[, group[, offset[, bits]]]): the layout schedule.Pack reads; () row-major
    dtype: str = "f32"

    @property
    def buffer(self) -> str:
        return weight_buffer(self.cname)


def weight_layout(signature: Signature, packed: dict[str, tuple]) -> list[WeightSlot]:
    """Every weight of the signature at an aligned offset after the header, in its order, in the
    layout the schedules chose for its buffer."""
    slots, offset = [], HEADER_BYTES
    for w in signature.weights:
        layout = packed.get(weight_buffer(w.cname), ())
        nbytes = int(np.prod(w.shape)) * DTYPE_BYTES[w.dtype]
        if len(layout) == 5:  # (row, block, group, offset, bits): bits of each byte kept (schedule/narrow.py)
            nbytes = nbytes * layout[4] // 8
        slots.append(WeightSlot(w.name, w.cname, tuple(w.shape), offset, nbytes, layout, w.dtype))
        offset += (nbytes + WEIGHT_ALIGN - 1) // WEIGHT_ALIGN * WEIGHT_ALIGN
    return slots
