"""Narrow weights: a weight Pack stores in 4, 5 or 6 bits a value instead of 8.

A GGUF's Q5_0 (and Q4_0) blocks hold integers in [-16, 15]; stored with offset 16 they are the
unsigned bytes [0, 31] that vpdpbusd multiplies (schedule/unsigned.py). Five bits of each are
enough: every 64 bytes of the 8-bit layout (one 16-lane dot product's weights) are kept as 40,

    32 bytes: byte j holds byte j's low nibble and byte j + 32's in its high nibble;
     8 bytes: bit i of this little-endian word is byte i's fifth bit (value 16),

so decode reads 22 bytes per 32 weights with their float16 scale, as the file does, instead of 34.
nc_dot4u5_16 rebuilds the 64 bytes (two masks, a shift, a masked add of 16) and multiplies them as
nc_dot4u_16 does; the result is the same int32 sum, bit for bit. The index a Dot keeps is the
8-bit layout's: a 64-byte unit u lives at 40 * u, which the C renders as index * 5 / 8. An 8-lane
dot product reads 32 bytes, half a unit (the nibbles' low or high halves, and the matching half
of the fifth bits): the C passes nc_dot4u5h_8 the unit's address and the half as a literal where
the index's terms are multiples of 64 (nc_dot4u5_8 finds both from the 8-bit index), so the same
layout serves AVX2 and AVX-VNNI as AVX-512 (the rebuilt bytes, at most 63, are multiplied exactly
by vpmaddubsw where there is no VNNI).

Bytes within [0, 15] keep the 32 nibble bytes alone (4 bits); bytes within [0, 63] keep them and
16 bytes of high bit pairs, byte i holding bytes i, i + 16, i + 32 and i + 48's in its bits 0-1,
2-3, 4-5 and 6-7 (6 bits: one shift per 128-bit lane rebuilds a quarter of the unit). A unit is
8 * bits bytes, at index * bits / 8, in all three. With offset 0 the stored bytes are the int8
values themselves (already within [0, 2**bits - 1]): read unsigned, with nothing to subtract.
"""
from __future__ import annotations

import numpy as np

from ..loopir.affine import linear
from ..loopir.ir import Cast, Dot, Kernel, Lane, Load, Loop, NarrowByte
from ..loopir.traverse import statements_in_loops, walk
from .directives import ScheduleError

UNIT = 64         # bytes of the 8-bit layout kept together (one 16-lane dot product reads a unit)
BITS = (4, 5, 6)  # the narrow widths a Pack keeps
LANES = (8, 16)   # the dot products that read narrow weights: a half unit (AVX2, AVX-VNNI) or a whole one


def unit_bytes(bits: int) -> int:
    """Bytes a unit takes in `bits` bits: 32, 40 or 48."""
    return UNIT * bits // 8


def _weight(d: Dot, param: str):
    """The operand of d that loads param, if one does (b first: unsigned_reads puts it there)."""
    return next((ld for ld in (d.b, d.a) if isinstance(ld, Load) and ld.param == param), None)


def narrow_reads(k: Kernel, param: str, body: tuple, bits: int, offset: int) -> tuple:
    """body with the dot products reading param marked `bits`-bit (param on their unsigned side)
    and its other reads rebuilt one byte at a time (a gather of an embedding row): with an offset,
    the unsigned bytes schedule/unsigned.py corrects; with none, the int8 values themselves. A read
    in vector lanes outside a dot product, and a dot product outside 8 or 16 lanes or not at the
    start of its 32 or 64 bytes, is refused."""
    for s, around in statements_in_loops(body):
        if isinstance(s, Loop):  # its statements come on their own
            continue
        dots = [n for n in walk(s) if isinstance(n, Dot) and _weight(n, param) is not None]
        others = [n for n in walk(s) if isinstance(n, Load) and n.param == param
                  and not any(n is _weight(d, param) for d in dots)]
        if others and any(lp.lanes for lp in around):
            raise ScheduleError(f"{k.name}: {param} in {bits} bits is read in vector lanes outside a dot product")
        lanes = next((lp.lanes for lp in around if lp.lanes), 0)
        if dots and lanes not in LANES:
            raise ScheduleError(f"{k.name}: {param} in {bits} bits is read by dot products in 8 or 16 lanes only")
        for d in dots:
            terms, const = linear(_weight(d, param).index)
            lane, read = terms.pop(Lane(), 0), d.width * lanes  # the bytes one dot product reads
            if (offset and not d.b_offset) or lane != d.width or const % read or any(c % read for c in terms.values()):
                raise ScheduleError(f"{k.name}: a dot product reads {param} in {bits} bits away from the start of "
                                    f"its {read} bytes")
    return tuple(_narrowed(s, param, bits, offset) for s in body)


def _narrowed(n, param: str, bits: int, offset: int):
    """n with param's Dots reading it in `bits` bits (as b) and its other reads rebuilt."""
    if isinstance(n, Dot) and _weight(n, param) is not None:
        w = _weight(n, param)
        x = n.a if w is n.b else n.b  # the product commutes: w the unsigned side
        return Dot(_narrowed(n.acc, param, bits, offset), x, w, n.width, n.b_offset, bits)
    if offset and isinstance(n, Cast) and n.dtype == "u8" and isinstance(n.a, Load) and n.a.param == param:
        return NarrowByte(n.a, bits)  # the stored byte, rebuilt
    if not offset and isinstance(n, Load) and n.param == param:
        return Cast("i8", NarrowByte(n, bits))  # the stored byte is the value
    kids = n.children()
    return n.with_children([_narrowed(c, param, bits, offset) for c in kids]) if kids else n


def narrow_bytes(stored: np.ndarray, bits: int = 5) -> np.ndarray:
    """Unsigned bytes of the 8-bit layout (each within [0, 2**bits - 1], a whole number of units)
    in `bits` bits."""
    if bits not in BITS:
        raise ValueError(f"bytes are kept in {', '.join(map(str, BITS))} bits; not {bits}")
    units = np.ascontiguousarray(stored, dtype=np.uint8).reshape(-1, UNIT)
    if units.size and units.max() >= 1 << bits:
        raise ValueError(f"a stored byte of {int(units.max())} does not fit in {bits} bits")
    nibbles = (units[:, :32] & 15) | ((units[:, 32:] & 15) << 4)
    parts = [nibbles.astype(np.uint8)]
    if bits == 5:
        parts.append(np.packbits((units >> 4) & 1, axis=1, bitorder="little"))
    elif bits == 6:
        high = units >> 4
        parts.append(high[:, :16] | high[:, 16:32] << 2 | high[:, 32:48] << 4 | high[:, 48:] << 6)
    return np.concatenate(parts, axis=1).reshape(-1)


def widen_bytes(narrow: np.ndarray, bits: int = 5) -> np.ndarray:
    """narrow_bytes undone: what nc_dot4u4, nc_dot4u5 and nc_dot4u6 rebuild."""
    if bits not in BITS:
        raise ValueError(f"bytes are kept in {', '.join(map(str, BITS))} bits; not {bits}")
    units = np.ascontiguousarray(narrow, dtype=np.uint8).reshape(-1, unit_bytes(bits))
    low = np.concatenate([units[:, :32] & 15, units[:, :32] >> 4], axis=1)
    if bits == 4:
        return low.astype(np.uint8).reshape(-1)
    if bits == 5:
        high = np.unpackbits(units[:, 32:], axis=1, bitorder="little")
    else:
        high = np.concatenate([(units[:, 32:] >> shift) & 3 for shift in (0, 2, 4, 6)], axis=1)
    return (low | (high << 4)).astype(np.uint8).reshape(-1)
