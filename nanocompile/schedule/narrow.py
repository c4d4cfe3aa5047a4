"""Five-bit weights: a weight Pack stores in 5 bits a value instead of 8.

A GGUF's Q5_0 (and Q4_0) blocks hold integers in [-16, 15]; stored with offset 16 they are the
unsigned bytes [0, 31] that vpdpbusd multiplies (schedule/unsigned.py). Five bits of each are
enough: every 64 bytes of the 8-bit layout (one 16-lane dot product's weights) are kept as 40,

    32 bytes: byte j holds byte j's low nibble and byte j + 32's in its high nibble;
     8 bytes: bit i of this little-endian word is byte i's fifth bit (value 16),

so decode reads 22 bytes per 32 weights with their float16 scale, as the file does, instead of 34.
nc_dot4u5_16 rebuilds the 64 bytes (two masks, a shift, a masked add of 16) and multiplies them as
nc_dot4u_16 does; the result is the same int32 sum, bit for bit. The index a Dot keeps is the
8-bit layout's: a 64-byte unit u lives at 40 * u, which the C renders as index * 5 / 8.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..loopir.affine import linear
from ..loopir.ir import Cast, Dot, Kernel, Lane, Load, Loop, NarrowByte
from ..loopir.traverse import rewrite_in_loops, statements_in_loops, walk
from .directives import ScheduleError

UNIT = 64         # bytes of the 8-bit layout one 16-lane dot product reads
UNIT_STORED = 40  # the same in 5 bits
LANES = 16


def narrow_reads(k: Kernel, param: str, body: tuple) -> tuple:
    """body with the dot products reading param (already unsigned) marked 5-bit and its other
    reads (unsigned bytes, schedule/unsigned.py) rebuilt one byte at a time (a gather of an
    embedding row); a read in vector lanes outside a dot product, and a dot product outside 16
    lanes or not at a whole unit, is refused."""
    for s, around in statements_in_loops(body):
        if isinstance(s, Loop):  # its statements come on their own
            continue
        dots = [n for n in walk(s) if isinstance(n, Dot) and isinstance(n.b, Load) and n.b.param == param]
        others = [n for n in walk(s) if isinstance(n, Load) and n.param == param and not any(n is d.b for d in dots)]
        if others and any(lp.lanes for lp in around):
            raise ScheduleError(f"{k.name}: {param} in 5 bits is read in vector lanes outside a dot product")
        if dots and not any(lp.lanes == LANES for lp in around):
            raise ScheduleError(f"{k.name}: {param} in 5 bits is read by dot products in {LANES} lanes only")
        for d in dots:
            terms, const = linear(d.b.index)
            lane = terms.pop(Lane(), 0)
            if not d.b_offset or lane != d.width or const % UNIT or any(c % UNIT for c in terms.values()):
                raise ScheduleError(f"{k.name}: a dot product reads {param} in 5 bits away from the start of a "
                                    f"{UNIT}-byte unit")

    def mark(n, around):
        if isinstance(n, Dot) and isinstance(n.b, Load) and n.b.param == param:
            return dataclasses.replace(n, b_bits=5)
        if isinstance(n, Cast) and n.dtype == "u8" and isinstance(n.a, Load) and n.a.param == param:
            return NarrowByte(n.a)  # the stored byte, rebuilt
        return None

    return rewrite_in_loops(body, mark)


def narrow_bytes(stored: np.ndarray) -> np.ndarray:
    """Unsigned bytes of the 8-bit layout (each within [0, 31], a whole number of units) in 5 bits."""
    units = np.ascontiguousarray(stored, dtype=np.uint8).reshape(-1, UNIT)
    if units.size and units.max() > 31:
        raise ValueError(f"a stored byte of {int(units.max())} does not fit in 5 bits")
    nibbles = (units[:, :32] & 15) | ((units[:, 32:] & 15) << 4)
    fifth = np.packbits((units >> 4) & 1, axis=1, bitorder="little")
    return np.concatenate([nibbles.astype(np.uint8), fifth], axis=1).reshape(-1)


def widen_bytes(narrow: np.ndarray) -> np.ndarray:
    """narrow_bytes undone: what nc_dot4u5 rebuilds."""
    units = np.ascontiguousarray(narrow, dtype=np.uint8).reshape(-1, UNIT_STORED)
    low = np.concatenate([units[:, :32] & 15, units[:, :32] >> 4], axis=1)
    fifth = np.unpackbits(units[:, 32:], axis=1, bitorder="little")
    return (low | (fifth << 4)).astype(np.uint8).reshape(-1)
