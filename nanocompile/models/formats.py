"""GGML block formats described as data, and the NumPy functions that read and write them.

A quantized tensor is a sequence of blocks of `block` weights in `nbytes` bytes. Weight j of a
block is

    w_j = scale[s] * (q_j - offset) - min[s]        s = j // sub

q_j is an integer of `bits` bits (unsigned; Q8_0 and Q8_K store int8, described as signed=True
with offset 0). scale[s] and min[s] are float32 values, each the product of a stored float
super-scale (float16 d/dmin, float32 for Q8_K) and a small integer sub-scale read from the
block's bits; the product is exact in float32 (checked when a format is registered: an 11-bit
float16 significand times an integer below 2**13 fits float32's 24 bits, and float16's range
times such integers stays inside float32's normal range, subnormal float16 values included).
Formats without sub-scales use 1, so scale[s] is the stored value itself.

Every bit of a block is described: a `Field` is a byte range of the block; a `BitPart` takes
`width` bits from one byte of a field, shifted right by `shift`, and puts them at bit `lshift`
of the integer being assembled. Each quant position j has its tuple of BitParts, each sub-scale
and sub-min too (`ScaleRule`). `tables(fmt)` turns a description into NumPy index tables once (when first used; tests/test_formats.py
builds every format's, so a description that contradicts itself fails there);
unpack, dequantize and pack read only those tables, so adding a format is adding a description
(docs/FORMATS.md).

The arithmetic of dequantize is the `gguf` library's (and ggml's C reference's): the product
scale[s] * (q_j - offset) rounded to float32, then min[s] subtracted and rounded again.
Q4_1/Q5_1 store the min that ggml adds (w = d*q + m); here min = -m, and x - (-m) is x + m in
IEEE arithmetic, bit for bit. For every format with a float16 super-scale the product itself is
exact (`product_is_exact`: 11 bits times |k_s * (q_j - offset)| <= 2**12 fit 24), so w_j is the
float32 nearest the exact value, rounded once: a kernel that computes the product in any order,
or fuses the subtraction into an FMA, gets the same bits. Q8_K (float32 d times q) rounds its
product once and has no min: also one rounding.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from ..errors import ModelError

QK_K = 256  # the K formats' super-block

# The dtypes a Field can have: "u8" fields are bit containers read through BitParts; the others
# hold values kept as stored (super-scales, and Q8_K's per-16 sums).
VALUE_DTYPES = {"f16": np.float16, "f32": np.float32, "i16": np.int16}
FLOAT_DTYPES = ("f16", "f32")
FLOAT16_SIGNIFICAND_BITS = 11
FLOAT32_SIGNIFICAND_BITS = 24


@dataclass(frozen=True)
class Field:
    name: str
    offset: int  # bytes from the start of the block
    count: int  # elements
    dtype: str  # "u8" (bits, read through BitParts), "f16", "f32" or "i16" (values as stored)

    @property
    def nbytes(self) -> int:
        return self.count * (1 if self.dtype == "u8" else np.dtype(VALUE_DTYPES[self.dtype]).itemsize)


@dataclass(frozen=True)
class BitPart:
    """Bits (byte >> shift) & (2**width - 1) of a u8 field, placed at bit lshift of an integer."""
    field: str
    byte: int  # index within the field
    shift: int
    width: int
    lshift: int = 0


Parts = tuple[BitPart, ...]


@dataclass(frozen=True)
class ScaleRule:
    """factor[s] = sign * float32(super) * k_s, with k_s the integer read from sub[s]: `bits` bits,
    two's complement if signed, minus offset. No sub parts: k_s = 1. sign is -1 if negate."""
    super: str  # a float field with one element
    sub: tuple[Parts, ...] = ()
    bits: int = 0
    signed: bool = False
    offset: int = 0
    negate: bool = False


@dataclass(frozen=True)
class BlockFormat:
    name: str
    ggml_type: int
    block: int  # weights per block
    nbytes: int  # bytes per block
    bits: int  # bits per quant
    offset: int  # subtracted from every quant
    sub: int  # weights per sub-block (one scale, one min each)
    signed: bool  # quants are two's complement (int8)
    fields: tuple[Field, ...]
    quant: tuple[Parts, ...]  # per position j
    scale: ScaleRule
    min: ScaleRule | None = None

    @property
    def has_min(self) -> bool:
        return self.min is not None

    @property
    def n_sub(self) -> int:
        return self.block // self.sub

    def field(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)

    def __repr__(self) -> str:  # the full description (hundreds of bit parts) would drown a message
        return f"BlockFormat({self.name}, type {self.ggml_type}, {self.block} weights in {self.nbytes} bytes)"


@dataclass
class Unpacked:
    """Blocks read into their parts, one row per block."""
    q: np.ndarray  # [n, block] uint8 (int8 if the format is signed), before the offset
    scale: np.ndarray  # [n, n_sub] float32
    min: np.ndarray | None  # [n, n_sub] float32, or None
    sub_scale: np.ndarray  # [n, n_sub] int16: k_s of the scale rule (ones if it has no sub parts)
    sub_min: np.ndarray | None  # [n, n_sub] int16, or None
    values: dict[str, np.ndarray] = field(default_factory=dict)  # value fields as stored, [n, count]


# --- describing layouts ---------------------------------------------------------------------

def interleaved(field_name: str, j: int, stride: int, width: int, lshift: int = 0) -> BitPart:
    """Position j in ggml's usual packing of `width`-bit pieces: `stride` consecutive positions
    take consecutive bytes at the same shift, the next `stride` the next shift of the same
    bytes, and so on until the bytes are full (8 // width shifts)."""
    per_byte = 8 // width
    return BitPart(field_name, (j // (stride * per_byte)) * stride + j % stride, width * ((j // stride) % per_byte),
                   width, lshift)


def k4_scale(s: int) -> Parts:
    """Sub-block s's 6-bit scale in Q4_K/Q5_K's 12 bytes (ggml's get_scale_min_k4)."""
    if s < 4:
        return (BitPart("scales", s, 0, 6),)
    return (BitPart("scales", s + 4, 0, 4), BitPart("scales", s - 4, 6, 2, 4))


def k4_min(s: int) -> Parts:
    """Sub-block s's 6-bit min in Q4_K/Q5_K's 12 bytes (ggml's get_scale_min_k4)."""
    if s < 4:
        return (BitPart("scales", s + 4, 0, 6),)
    return (BitPart("scales", s + 4, 4, 4), BitPart("scales", s, 6, 2, 4))


def k3_scale(s: int) -> Parts:
    """Sub-block s's 6-bit scale in Q3_K's 12 bytes: 4 low bits in bytes 0-7, 2 high in 8-11."""
    return (BitPart("scales", s % 8, 4 * (s // 8), 4), BitPart("scales", 8 + s % 4, 2 * (s // 4), 2, 4))


def _positions(n: int, parts) -> tuple[Parts, ...]:
    return tuple(tuple(parts(j)) for j in range(n))


Q4_0 = BlockFormat(
    "Q4_0", 2, block=32, nbytes=18, bits=4, offset=8, sub=32, signed=False,
    fields=(Field("d", 0, 1, "f16"), Field("qs", 2, 16, "u8")),
    quant=_positions(32, lambda j: [interleaved("qs", j, 16, 4)]),
    scale=ScaleRule("d"))

Q4_1 = BlockFormat(
    "Q4_1", 3, block=32, nbytes=20, bits=4, offset=0, sub=32, signed=False,
    fields=(Field("d", 0, 1, "f16"), Field("m", 2, 1, "f16"), Field("qs", 4, 16, "u8")),
    quant=_positions(32, lambda j: [interleaved("qs", j, 16, 4)]),
    scale=ScaleRule("d"), min=ScaleRule("m", negate=True))

Q5_0 = BlockFormat(
    "Q5_0", 6, block=32, nbytes=22, bits=5, offset=16, sub=32, signed=False,
    fields=(Field("d", 0, 1, "f16"), Field("qh", 2, 4, "u8"), Field("qs", 6, 16, "u8")),
    quant=_positions(32, lambda j: [interleaved("qs", j, 16, 4), interleaved("qh", j, 1, 1, lshift=4)]),
    scale=ScaleRule("d"))

Q5_1 = BlockFormat(
    "Q5_1", 7, block=32, nbytes=24, bits=5, offset=0, sub=32, signed=False,
    fields=(Field("d", 0, 1, "f16"), Field("m", 2, 1, "f16"), Field("qh", 4, 4, "u8"), Field("qs", 8, 16, "u8")),
    quant=_positions(32, lambda j: [interleaved("qs", j, 16, 4), interleaved("qh", j, 1, 1, lshift=4)]),
    scale=ScaleRule("d"), min=ScaleRule("m", negate=True))

Q8_0 = BlockFormat(
    "Q8_0", 8, block=32, nbytes=34, bits=8, offset=0, sub=32, signed=True,
    fields=(Field("d", 0, 1, "f16"), Field("qs", 2, 32, "u8")),
    quant=_positions(32, lambda j: [interleaved("qs", j, 1, 8)]),
    scale=ScaleRule("d"))

Q2_K = BlockFormat(
    "Q2_K", 10, block=QK_K, nbytes=84, bits=2, offset=0, sub=16, signed=False,
    fields=(Field("scales", 0, 16, "u8"), Field("qs", 16, 64, "u8"), Field("d", 80, 1, "f16"),
            Field("dmin", 82, 1, "f16")),
    quant=_positions(QK_K, lambda j: [interleaved("qs", j, 32, 2)]),
    scale=ScaleRule("d", _positions(16, lambda s: [BitPart("scales", s, 0, 4)]), bits=4),
    min=ScaleRule("dmin", _positions(16, lambda s: [BitPart("scales", s, 4, 4)]), bits=4))

Q3_K = BlockFormat(
    "Q3_K", 11, block=QK_K, nbytes=110, bits=3, offset=4, sub=16, signed=False,
    fields=(Field("hmask", 0, 32, "u8"), Field("qs", 32, 64, "u8"), Field("scales", 96, 12, "u8"),
            Field("d", 108, 1, "f16")),
    # ggml subtracts 4 where the high bit is 0: q - 4 with q = low | high << 2 is the same number
    quant=_positions(QK_K, lambda j: [interleaved("qs", j, 32, 2), interleaved("hmask", j, 32, 1, lshift=2)]),
    scale=ScaleRule("d", _positions(16, k3_scale), bits=6, offset=32))

Q4_K = BlockFormat(
    "Q4_K", 12, block=QK_K, nbytes=144, bits=4, offset=0, sub=32, signed=False,
    fields=(Field("d", 0, 1, "f16"), Field("dmin", 2, 1, "f16"), Field("scales", 4, 12, "u8"),
            Field("qs", 16, 128, "u8")),
    quant=_positions(QK_K, lambda j: [interleaved("qs", j, 32, 4)]),
    scale=ScaleRule("d", _positions(8, k4_scale), bits=6),
    min=ScaleRule("dmin", _positions(8, k4_min), bits=6))

Q5_K = BlockFormat(
    "Q5_K", 13, block=QK_K, nbytes=176, bits=5, offset=0, sub=32, signed=False,
    fields=(Field("d", 0, 1, "f16"), Field("dmin", 2, 1, "f16"), Field("scales", 4, 12, "u8"),
            Field("qh", 16, 32, "u8"), Field("qs", 48, 128, "u8")),
    quant=_positions(QK_K, lambda j: [interleaved("qs", j, 32, 4), interleaved("qh", j, 32, 1, lshift=4)]),
    scale=ScaleRule("d", _positions(8, k4_scale), bits=6),
    min=ScaleRule("dmin", _positions(8, k4_min), bits=6))

Q6_K = BlockFormat(
    "Q6_K", 14, block=QK_K, nbytes=210, bits=6, offset=32, sub=16, signed=False,
    fields=(Field("ql", 0, 128, "u8"), Field("qh", 128, 64, "u8"), Field("scales", 192, 16, "u8"),
            Field("d", 208, 1, "f16")),
    quant=_positions(QK_K, lambda j: [interleaved("ql", j, 64, 4), interleaved("qh", j, 32, 2, lshift=4)]),
    scale=ScaleRule("d", _positions(16, lambda s: [interleaved("scales", s, 1, 8)]), bits=8, signed=True))

# The K formats' activation type: float32 d, and the sums of each 16 quants (kept as stored;
# dequantization does not read them)
Q8_K = BlockFormat(
    "Q8_K", 15, block=QK_K, nbytes=292, bits=8, offset=0, sub=QK_K, signed=True,
    fields=(Field("d", 0, 1, "f32"), Field("qs", 4, QK_K, "u8"), Field("bsums", 4 + QK_K, 16, "i16")),
    quant=_positions(QK_K, lambda j: [interleaved("qs", j, 1, 8)]),
    scale=ScaleRule("d"))


# --- checking a description and turning it into tables ---------------------------------------

class FormatDescriptionError(ValueError):
    """A description that contradicts itself (a programming error, raised at import)."""


@dataclass(frozen=True, eq=False)
class PartTable:
    """For each of n integers, P bit parts (unused parts have mask 0): absolute byte in the
    block, right shift, mask, left shift. Arrays [P, n]."""
    byte: np.ndarray
    shift: np.ndarray
    mask: np.ndarray
    lshift: np.ndarray

    @property
    def n(self) -> int:
        return self.byte.shape[1]


@dataclass(frozen=True, eq=False)
class Tables:
    quant: PartTable
    scale_sub: PartTable | None
    min_sub: PartTable | None
    # pack: for each block byte and bit, the column of the stacked integers (q, scale subs, min
    # subs, then one column of zeros) and the bit within it
    source_column: np.ndarray  # [nbytes, 8]
    source_bit: np.ndarray  # [nbytes, 8]
    value_fields: tuple[Field, ...]


def _part_table(fmt: BlockFormat, parts_per_int: tuple[Parts, ...]) -> PartTable:
    width = max(len(p) for p in parts_per_int)
    table = np.zeros((4, width, len(parts_per_int)), np.int64)
    for i, parts in enumerate(parts_per_int):
        for p, part in enumerate(parts):
            table[:, p, i] = (fmt.field(part.field).offset + part.byte, part.shift, (1 << part.width) - 1,
                              part.lshift)
    byte, shift, mask, lshift = table
    return PartTable(byte.astype(np.intp), shift.astype(np.uint8), mask.astype(np.uint8), lshift.astype(np.uint8))


def _stacked_ints(fmt: BlockFormat) -> list[tuple[tuple[Parts, ...], int]]:
    """The integers pack writes, in the order of its stacked columns, with their bit widths."""
    out = [(fmt.quant, fmt.bits)]
    for rule in (fmt.scale, fmt.min):
        if rule is not None and rule.sub:
            out.append((rule.sub, rule.bits))
    return out


def _check(fmt: BlockFormat) -> None:
    def fail(message: str):
        raise FormatDescriptionError(f"{fmt.name}: {message}")

    if len(fmt.quant) != fmt.block or fmt.block % fmt.sub:
        fail(f"{len(fmt.quant)} quant positions for blocks of {fmt.block} in sub-blocks of {fmt.sub}")
    ends = sorted((f.offset, f.offset + f.nbytes) for f in fmt.fields)
    if ends[0][0] != 0 or ends[-1][1] != fmt.nbytes or any(a[1] != b[0] for a, b in zip(ends, ends[1:])):
        fail(f"fields {ends} do not tile the {fmt.nbytes}-byte block")
    names = {f.name: f for f in fmt.fields}
    for ints, bits in _stacked_ints(fmt):
        if not 1 <= bits <= 8:  # unpack assembles them in uint8
            fail(f"{bits}-bit integers: quants and sub-scales of 1 to 8 bits are supported")
        for parts in ints:
            if sum(p.width for p in parts) != bits or any(p.lshift + p.width > bits for p in parts):
                fail(f"bit parts {parts} do not make a {bits}-bit integer")
            for p in parts:
                f = names.get(p.field)
                if f is None or f.dtype != "u8" or not 0 <= p.byte < f.count or p.shift + p.width > 8:
                    fail(f"bit part {p} is outside a u8 field")
    for rule in (fmt.scale, fmt.min):
        if rule is None:
            continue
        f = names.get(rule.super)
        if f is None or f.dtype not in FLOAT_DTYPES or f.count != 1:
            fail(f"scale {rule.super!r} is not a single float field")
        if rule.sub and len(rule.sub) != fmt.n_sub:
            fail(f"{len(rule.sub)} sub-scales for {fmt.n_sub} sub-blocks")
        if rule.sub:
            largest = max(abs(k) for k in sub_range(rule))
            # super * k is exact when both significands fit float32's 24 bits together; the
            # exponents never limit it: float16's range (subnormals too) times k < 2**13 is
            # inside float32's normal range
            if f.dtype != "f16" or FLOAT16_SIGNIFICAND_BITS + largest.bit_length() > FLOAT32_SIGNIFICAND_BITS:
                fail(f"{rule.super} * sub-scale (up to {largest}) is not exact in float32")


def quant_range(fmt: BlockFormat) -> range:
    """The values q_j - offset takes."""
    low, high = (-(1 << (fmt.bits - 1)), 1 << (fmt.bits - 1)) if fmt.signed else (0, 1 << fmt.bits)
    return range(low - fmt.offset, high - fmt.offset)


def product_is_exact(fmt: BlockFormat) -> bool:
    """Whether scale[s] * (q_j - offset) is exact in float32 for every block (see the module's
    docstring): the super-scale's significand and the integer k_s * (q_j - offset) fit 24 bits."""
    largest_k = max(abs(k) for k in sub_range(fmt.scale)) if fmt.scale.sub else 1
    largest_q = max(abs(q) for q in quant_range(fmt))
    super_bits = FLOAT16_SIGNIFICAND_BITS if fmt.field(fmt.scale.super).dtype == "f16" else FLOAT32_SIGNIFICAND_BITS
    # every |k * (q - offset)| <= n has at most (n - 1).bit_length() significant bits (n itself
    # too when it is a power of two, as Q6_K's 128 * 32 is)
    return super_bits + (largest_k * largest_q - 1).bit_length() <= FLOAT32_SIGNIFICAND_BITS


def sub_range(rule: ScaleRule) -> range:
    low = -(1 << (rule.bits - 1)) if rule.signed else 0
    high = (1 << (rule.bits - 1)) if rule.signed else (1 << rule.bits)
    return range(low - rule.offset, high - rule.offset)


def _scatter(fmt: BlockFormat) -> tuple[np.ndarray, np.ndarray]:
    """For every bit of the block, which stacked integer column and bit it comes from; every
    bit of every u8 field must come from exactly one."""
    stacked = _stacked_ints(fmt)
    zero_column = sum(len(ints) for ints, _ in stacked)
    column = np.full((fmt.nbytes, 8), -1, np.int64)
    bit = np.zeros((fmt.nbytes, 8), np.int64)
    base = 0
    for ints, _ in stacked:
        for i, parts in enumerate(ints):
            for p in parts:
                byte = fmt.field(p.field).offset + p.byte
                for t in range(p.width):
                    if column[byte, p.shift + t] >= 0:
                        raise FormatDescriptionError(f"{fmt.name}: bit {p.shift + t} of byte {byte} is used twice")
                    column[byte, p.shift + t], bit[byte, p.shift + t] = base + i, p.lshift + t
        base += len(ints)
    for f in fmt.fields:
        rows = column[f.offset:f.offset + f.nbytes]
        if f.dtype == "u8" and (rows < 0).any():
            raise FormatDescriptionError(f"{fmt.name}: field {f.name} has bits no part reads")
        rows[:] = np.where(rows < 0, zero_column, rows)
    return column.astype(np.intp), bit.astype(np.uint8)


@lru_cache(maxsize=None)
def tables(fmt: BlockFormat) -> Tables:
    """The index tables unpack, dequantize and pack run on (checked, made once per format)."""
    _check(fmt)
    column, bit = _scatter(fmt)
    subs = [_part_table(fmt, rule.sub) if rule is not None and rule.sub else None for rule in (fmt.scale, fmt.min)]
    return Tables(_part_table(fmt, fmt.quant), subs[0], subs[1], column, bit,
                  tuple(f for f in fmt.fields if f.dtype != "u8"))


FORMATS: dict[int, BlockFormat] = {f.ggml_type: f for f in (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K,
                                                             Q6_K, Q8_K)}
BY_NAME: dict[str, BlockFormat] = {f.name: f for f in FORMATS.values()}


def format_of(ggml_type: int) -> BlockFormat | None:
    return FORMATS.get(ggml_type)


def format_named(name: str) -> BlockFormat | None:
    """By ggml type name ('Q4_K'), as gguf_file.TensorInfo.type spells it."""
    return BY_NAME.get(name)


# --- reading and writing blocks --------------------------------------------------------------

def as_blocks(fmt: BlockFormat, raw: np.ndarray) -> np.ndarray:
    """raw bytes [..., nbytes] (or rows of whole blocks) as uint8 [n_blocks, nbytes]."""
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raise TypeError(f"{fmt.name} blocks must be uint8 bytes, not {raw.dtype}")
    if raw.size % fmt.nbytes or (raw.ndim and raw.shape[-1] % fmt.nbytes):
        raise ValueError(f"{raw.shape} bytes are not whole {fmt.name} blocks of {fmt.nbytes} bytes")
    return raw.reshape(-1, fmt.nbytes)


def _gather(blocks: np.ndarray, table: PartTable) -> np.ndarray:
    """The integers a part table describes: uint8 [n_blocks, table.n]."""
    out = None
    for byte, shift, mask, lshift in zip(table.byte, table.shift, table.mask, table.lshift):
        piece = np.take(blocks, byte, axis=1)
        if shift.any():  # whole bytes (Q8_0, Q6_K's scales) skip the no-op steps: 3x faster
            piece >>= shift
        if (mask != 0xFF).any():
            piece &= mask
        if lshift.any():
            piece <<= lshift
        if out is None:
            out = piece
        else:
            out |= piece
    return out


def _sub_ints(blocks: np.ndarray, rule: ScaleRule, table: PartTable | None, n_sub: int) -> np.ndarray:
    """k_s for every block and sub-block, int16 [n_blocks, n_sub]."""
    if table is None:
        return np.ones((blocks.shape[0], n_sub), np.int16)
    k = _gather(blocks, table).astype(np.int16)
    if rule.signed:
        k = np.where(k >= 1 << (rule.bits - 1), k - (1 << rule.bits), k).astype(np.int16)
    return k - np.int16(rule.offset)


def _value(blocks: np.ndarray, f: Field) -> np.ndarray:
    return np.ascontiguousarray(blocks[:, f.offset:f.offset + f.nbytes]).view(VALUE_DTYPES[f.dtype])


def _factor(values: dict[str, np.ndarray], rule: ScaleRule, k: np.ndarray) -> np.ndarray:
    """sign * float32(super) * k: exact (see _check), so the order of the product is free."""
    factor = values[rule.super].astype(np.float32) * k.astype(np.float32)
    return -factor if rule.negate else factor


def unpack(fmt: BlockFormat, raw: np.ndarray) -> Unpacked:
    blocks = as_blocks(fmt, raw)
    t = tables(fmt)
    values = {f.name: _value(blocks, f) for f in t.value_fields}
    q = _gather(blocks, t.quant)
    sub_scale = _sub_ints(blocks, fmt.scale, t.scale_sub, fmt.n_sub)
    sub_min = _sub_ints(blocks, fmt.min, t.min_sub, fmt.n_sub) if fmt.min is not None else None
    with np.errstate(invalid="ignore", over="ignore"):  # a non-finite scale: check_finite_scales says where
        scale = _factor(values, fmt.scale, sub_scale)
        mins = _factor(values, fmt.min, sub_min) if fmt.min is not None else None
    return Unpacked(q.view(np.int8) if fmt.signed else q, scale, mins, sub_scale, sub_min, values)


DEQUANTIZE_CHUNK = 1 << 15  # blocks at a time: bounds the temporaries on a large tensor


def dequantize(fmt: BlockFormat, raw: np.ndarray) -> np.ndarray:
    """float32 [n_blocks * block]: scale * (q - offset), rounded, minus min, rounded."""
    blocks = as_blocks(fmt, raw)
    out = np.empty((blocks.shape[0], fmt.n_sub, fmt.sub), np.float32)
    for start in range(0, blocks.shape[0], DEQUANTIZE_CHUNK):
        chunk = slice(start, start + DEQUANTIZE_CHUNK)
        out[chunk] = _dequantize_blocks(fmt, blocks[chunk])
    return out.reshape(-1)


def _dequantize_blocks(fmt: BlockFormat, blocks: np.ndarray) -> np.ndarray:
    u = unpack(fmt, blocks)
    w = u.q.astype(np.float32).reshape(-1, fmt.n_sub, fmt.sub)
    if fmt.offset:
        w -= np.float32(fmt.offset)  # exact: small integers
    with np.errstate(invalid="ignore", over="ignore"):
        w *= u.scale[:, :, None]
        if u.min is not None:
            w -= u.min[:, :, None]
    return w


def _raw_sub(rule: ScaleRule, k: np.ndarray) -> np.ndarray:
    """k_s back to its stored bits."""
    return ((k.astype(np.int32) + rule.offset) & ((1 << rule.bits) - 1)).astype(np.uint8)


def pack(fmt: BlockFormat, u: Unpacked) -> np.ndarray:
    """The inverse of unpack: uint8 [n_blocks, nbytes] from q, the integer sub-scales and mins,
    and the value fields (scale and min themselves are not read)."""
    t = tables(fmt)
    q = np.asarray(u.q)
    bits = q.view(np.uint8) if fmt.signed else q.astype(np.uint8)
    if not fmt.signed and (q.min() < 0 or q.max() >= 1 << fmt.bits):
        raise ValueError(f"{fmt.name} quants must be in [0, {(1 << fmt.bits) - 1}]")
    columns = [bits]
    for rule, k in ((fmt.scale, u.sub_scale), (fmt.min, u.sub_min)):
        if rule is not None and rule.sub:
            columns.append(_raw_sub(rule, np.asarray(k)))
    columns.append(np.zeros((bits.shape[0], 1), np.uint8))
    stacked = np.concatenate(columns, axis=1)
    out = np.zeros((bits.shape[0], fmt.nbytes), np.uint8)
    for k in range(8):
        out |= ((stacked[:, t.source_column[:, k]] >> t.source_bit[:, k]) & 1) << np.uint8(k)
    for f in t.value_fields:
        value = np.ascontiguousarray(u.values[f.name], VALUE_DTYPES[f.dtype]).reshape(-1, f.count)
        out[:, f.offset:f.offset + f.nbytes] = value.view(np.uint8)
    return out


def check_finite_scales(fmt: BlockFormat, raw: np.ndarray, tensor_name: str) -> None:
    """ModelError naming the tensor, the first block and its value if a stored float scale (d,
    dmin, m) is NaN or infinite. raw: [..., nbytes] or rows of whole blocks; the block is named
    by its row and place in the row when raw has rows."""
    raw = np.asarray(raw)
    blocks = as_blocks(fmt, raw)
    lead, per_row = raw.shape[:-1], raw.shape[-1] // fmt.nbytes
    shape = (*lead, per_row) if per_row > 1 or not lead else lead
    scales = [(f.name, _value(blocks, f)[:, 0]) for f in fmt.fields if f.dtype in FLOAT_DTYPES]
    bad = np.zeros(blocks.shape[0], bool)
    for _, value in scales:
        bad |= ~np.isfinite(value)
    if not bad.any():
        return
    first = int(np.flatnonzero(bad)[0])
    name, value = next((n, v[first]) for n, v in scales if not np.isfinite(v[first]))
    index = [int(i) for i in np.unravel_index(first, shape)]
    where = f"row {index[0]}, block {index[1]}" if len(index) == 2 else f"block {index if len(index) > 1 else first}"
    raise ModelError(f"tensor {tensor_name}: {where} ({fmt.name}) has {name} = {value}; {int(bad.sum())} block(s) "
                     f"have a non-finite scale")
