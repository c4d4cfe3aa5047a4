"""Weights in the int8 precision's form: Q8_0's numbers, split into what the kernels read.

A [N, K] weight becomes `name.qs` int8 [N, Kp] and `name.d` float16 [N, Kp / 32], K padded with
zeros to whole blocks of 32 (zeros add nothing to a block's dot product). A Q8_0 tensor from a
GGUF file is split as stored, with no float32 round trip; any other tensor is quantized once by
the `gguf` library's Q8_0 quantizer, which reproduces ggml's reference quantizer bit for bit
(llama.cpp quantizes weights with it): per block d = max|w| / 127 as float16, q = round(w / d)
half away from zero.

The native precision (NativeWeights) is the same form, filled from the file's own blocks where
they are exactly int8's: a format with blocks of 32, one float16 scale each, no min and quants
within [-127, 127] after its offset (Q8_0, Q5_0, Q4_0) is split as stored, qs = q - offset and
d as the file has it, so the int8 kernels compute the file's own weights. The K formats, and
Q4_1/Q5_1 with their min, run as superblock_matmul's operands (superblock_form). Every other
matrix (codebook types such as IQ4_NL, float tensors, a source with no stored blocks) is
quantized to Q8_0 as int8 does, and named in one note.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import ModelError
from ..frontend.nn import padded
from ..ir.ops import QBLOCK
from .formats import BlockFormat, format_named, quant_range, sub_range, unpack

Q8_0_BLOCK_BYTES = 2 + QBLOCK  # a float16 scale, then 32 int8 values


def split_q8_0(raw: np.ndarray, rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 blocks as stored in GGUF (rows x k/32 blocks of 34 bytes) -> (qs int8 [rows, k],
    d float16 [rows, k/32])."""
    blocks = np.asarray(raw, np.uint8).reshape(rows, k // QBLOCK, Q8_0_BLOCK_BYTES)
    d = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16).reshape(rows, k // QBLOCK)
    qs = np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8).reshape(rows, k)
    return qs, d


def quantize_q8_0(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A float32 [N, K] weight -> (qs int8 [N, Kp], d float16 [N, Kp / 32]), by Q8_0's reference."""
    import gguf  # the model-loading side depends on it; the compiler core does not

    n, k = weight.shape
    kp = padded(k)
    w = np.zeros((n, kp), np.float32)
    w[:, :k] = weight
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    return split_q8_0(raw, n, kp)


class Int8Weights(Mapping):
    """The int8 precision's weights, made one base tensor at a time as they are asked for: from
    the stored Q8_0 blocks when the source has them (raw(name) -> (ggml type name, bytes)), else
    quantized from the float32 tensor. Matrices are quantized; vectors (norms, biases) stay
    float32."""

    form = "int8"      # the precision these weights are the form of (a packed file records it)
    narrow = ()        # no weight kept in fewer than 8 bits: int8's are requantized to Q8_0
    superblocks = ()   # nor in a K format's numbers

    def fallback_note(self) -> str | None:
        return None

    def __init__(self, float_weights: Mapping[str, np.ndarray], quantized: set[str], raw=None):
        self.float_weights = float_weights
        self.quantized = quantized
        self.raw = raw
        self._last: tuple[str, tuple] | None = None  # qs and d are asked for one after the other

    @property
    def where(self) -> str:
        """The source's file or directory, for messages."""
        return getattr(self.float_weights, "where", "weights")

    @classmethod
    def of_source(cls, source) -> "Int8Weights":
        """A model's WeightSource (models/weights.py) seen in int8's form."""
        quantized = {name for name, shape in source.shapes.items() if len(shape) == 2}
        return cls(source, quantized, getattr(source, "raw", None))

    def _float(self, name: str) -> np.ndarray:
        convert = getattr(self.float_weights, "tensor", None)  # without keeping it, if the source can
        return np.asarray(convert(name) if convert else self.float_weights[name], np.float32)

    def _stored(self, base: str):
        """(qs, d) from the source's stored Q8_0 blocks, or None."""
        if self.raw is None:
            return None
        try:
            kind, data = self.raw(base)
        except ModelError:  # a source with no stored form other than float32
            return None
        if kind != "Q8_0":
            return None
        n, k = self.float_weights.shapes[base]
        qs, d = split_q8_0(data, n, k)
        if (qs == -128).any():  # the kernels' sign trick needs |q| <= 127
            raise ModelError(f"tensor {base!r}: a Q8_0 value of -128, outside the [-127, 127] a Q8_0 quantizer "
                             f"writes and these kernels assume")
        return qs, d

    def _split(self, base: str) -> tuple[np.ndarray, np.ndarray]:
        if self._last is None or self._last[0] != base:
            self._last = (base, self._stored(base) or quantize_q8_0(self._float(base)))
        return self._last[1]

    def __getitem__(self, name: str) -> np.ndarray:
        base, _, part = name.rpartition(".")
        if base in self.quantized and part in ("qs", "d"):
            qs, d = self._split(base)
            return qs if part == "qs" else d
        if name in self.quantized:
            raise KeyError(f"{name} is stored as {name}.qs and {name}.d in int8")
        return self._float(name)

    def __iter__(self):
        for name in self.float_weights:
            if name in self.quantized:
                yield name + ".qs"
                yield name + ".d"
            else:
                yield name

    def __len__(self) -> int:
        return len(self.float_weights) + len(self.quantized)


def exact_in_int8(fmt: BlockFormat | None) -> bool:
    """Whether every block of fmt is a block of int8's form as it stands: 32 weights, one float16
    scale with no sub-scale, no min, and quants within [-127, 127] after the offset."""
    if fmt is None or fmt.block != QBLOCK or fmt.has_min or fmt.scale.sub or fmt.scale.negate:
        return False
    if fmt.field(fmt.scale.super).dtype != "f16":
        return False
    q = quant_range(fmt)
    return fmt.signed or (q.start >= -127 and q.stop - 1 <= 127)


NARROW_BITS = (4, 5, 6)  # the widths a weight Pack keeps unsigned bytes in (schedule/narrow.py)


def narrow_storage(fmt: BlockFormat | None) -> tuple[int, int] | None:
    """(bits, offset): the fewest bits of NARROW_BITS that hold every quant of fmt (after its
    offset) as an unsigned byte value + offset (Q4_0, Q4_K: 4; Q5_0, Q5_K: 5; Q6_K: 6), or None."""
    if fmt is None:
        return None
    q = quant_range(fmt)
    offset = max(0, -q.start)
    return next(((bits, offset) for bits in NARROW_BITS if q.stop - 1 + offset < 1 << bits), None)


def superblock_form(fmt: BlockFormat | None) -> bool:
    """Whether fmt runs as superblock_matmul's operands as stored (the K formats): sub-blocks of
    at most 32 weights inside blocks of several, quants within int8 after the offset, integer
    sub-scales (and sub-mins) within int8 under float16 super-scales, mins subtracted; or a block
    format with a float16 min (unit_sub_blocks)."""
    if fmt is not None and unit_sub_blocks(fmt):
        return True
    if fmt is None or not fmt.scale.sub or fmt.sub > QBLOCK or fmt.block % fmt.sub or fmt.scale.negate:
        return False
    q = quant_range(fmt)
    rules = [fmt.scale] + ([fmt.min] if fmt.min is not None else [])
    return q.start >= -127 and q.stop - 1 <= 127 and all(
        r.sub and not r.negate and fmt.field(r.super).dtype == "f16" and
        sub_range(r).start >= -128 and sub_range(r).stop - 1 <= 127 for r in rules)


def unit_sub_blocks(fmt: BlockFormat) -> bool:
    """Q4_1, Q5_1: blocks of 32 with a float16 scale d and a float16 min m added (d * q + m), no
    sub-scales, quants within [0, 127]. They run as superblock_matmul's operands with a super-block
    of one sub-block: sub-scale and sub-min 1 and dmin = -m, so d * 1 * q - dmin * 1 is the same
    value, and the min's term is the activations' block sum times dmin, as a K format's mins term."""
    q = quant_range(fmt)
    return (fmt.block == QBLOCK and fmt.sub == QBLOCK and fmt.min is not None and not fmt.scale.sub
            and not fmt.min.sub and not fmt.scale.negate and q.start >= 0 and q.stop - 1 <= 127
            and all(fmt.field(r.super).dtype == "f16" for r in (fmt.scale, fmt.min)))


def superblock_parts(fmt: BlockFormat) -> tuple[str, ...]:
    """The suffixes of a superblock-form matrix's weights, in superblock_matmul's operand order."""
    return ("qs", "sc", "d") + (("mn", "dmin") if fmt.has_min else ())


UNPACK_ROWS = 4096  # rows unpacked at a time: bounds the temporaries on the embedding


def split_exact(data: np.ndarray, fmt: BlockFormat, rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Stored blocks [rows, k / 32, nbytes] of a format exact_in_int8 -> (qs int8 [rows, k] =
    q - offset, d float16 [rows, k / 32] as stored)."""
    qs = np.empty((rows, k), np.int8)
    d = np.empty((rows, k // QBLOCK), np.float16)
    for start in range(0, rows, UNPACK_ROWS):
        part = slice(start, min(rows, start + UNPACK_ROWS))
        u = unpack(fmt, data[part])
        q = u.q.astype(np.int16) - np.int16(fmt.offset)
        qs[part] = q.reshape(-1, k)
        d[part] = u.values[fmt.scale.super].reshape(-1, k // QBLOCK)
    return qs, d


def split_superblocks(data: np.ndarray, fmt: BlockFormat, rows: int, k: int) -> dict[str, np.ndarray]:
    """Stored blocks [rows, k / block, nbytes] of a format in superblock_form -> its parts:
    qs int8 [rows, k] = q - offset, sc int8 [rows, k / sub] (the integer sub-scales), d float16
    [rows, k / block] (the super-scale as stored), and with a min mn and dmin shaped as sc and d."""
    subs, supers = k // fmt.sub, k // fmt.block
    parts = {"qs": np.empty((rows, k), np.int8), "sc": np.empty((rows, subs), np.int8),
             "d": np.empty((rows, supers), np.float16)}
    if fmt.has_min:
        parts["mn"], parts["dmin"] = np.empty((rows, subs), np.int8), np.empty((rows, supers), np.float16)
    for start in range(0, rows, UNPACK_ROWS):
        part = slice(start, min(rows, start + UNPACK_ROWS))
        u = unpack(fmt, data[part])
        parts["qs"][part] = (u.q.astype(np.int16) - np.int16(fmt.offset)).reshape(-1, k)
        parts["sc"][part] = u.sub_scale.reshape(-1, subs)
        parts["d"][part] = u.values[fmt.scale.super].reshape(-1, supers)
        if fmt.has_min:
            parts["mn"][part] = u.sub_min.reshape(-1, subs)
            dmin = u.values[fmt.min.super].reshape(-1, supers)
            parts["dmin"][part] = -dmin if fmt.min.negate else dmin  # a min added: subtracted negated, exactly
    return parts


class NativeWeights(Int8Weights):
    """The native precision's weights: int8's names and form, each matrix from its stored
    blocks when its format is exact in that form (exact_in_int8), else quantized as int8 does.
    `fallbacks` (tensor -> its type) is known before any tensor is made: the types are read
    from the file's tensor table."""

    form = "native"

    def __init__(self, float_weights: Mapping[str, np.ndarray], quantized: set[str], blocks=None):
        """blocks(name) -> models.weights.StoredBlocks, or None for a source without stored
        blocks (Hugging Face safetensors): then every matrix is quantized, as int8."""
        types = {}
        if blocks is not None:
            try:
                stored = getattr(float_weights, "stored_type", None) or (lambda name: float_weights.raw(name)[0])
                types = {name: stored(name) for name in sorted(quantized)}
            except ModelError:  # a source with no stored form other than float32
                blocks = None
        super().__init__(float_weights, quantized, float_weights.raw if blocks is not None else None)
        self.blocks = blocks
        self.types = types or {name: "F32" for name in sorted(quantized)}  # tensor -> its stored type
        # K formats run as stored: superblock_matmul's operands, and an embedding's gather
        # dequantizes its rows from the same parts (frontend.nn.gather_k)
        self.superblock_formats = {name: format_named(kind) for name, kind in self.types.items()
                                   if blocks is not None and superblock_form(format_named(kind))}
        self.fallbacks = {name: kind for name, kind in self.types.items() if name not in self.superblock_formats
                          and (blocks is None or not exact_in_int8(format_named(kind)))}
        check = getattr(float_weights, "check_convertible", None)
        for name in sorted(self.fallbacks) if check and blocks is not None else ():
            check(name)  # a type no library reads is refused before the note on what is requantized
        self._parts: tuple[str, dict] | None = None

    @classmethod
    def of_source(cls, source) -> "NativeWeights":
        quantized = {name for name, shape in source.shapes.items() if len(shape) == 2}
        return cls(source, quantized, getattr(source, "blocks", None))

    def _stored(self, base: str):
        if self.blocks is None or base in self.fallbacks:
            return None
        stored = self.blocks(base)
        n, k = self.float_weights.shapes[base]
        if stored.format.signed:  # Q8_0: split as int8 does, with its check of a -128
            return super()._stored(base)
        return split_exact(stored.data, stored.format, n, k)

    @property
    def superblocks(self) -> tuple:
        """(name, sub, block, mins) of each matrix kept in its K format's numbers (weight_specs)."""
        return tuple((name, fmt.sub, fmt.block, fmt.has_min) for name, fmt in sorted(self.superblock_formats.items()))

    def _superblock_parts(self, base: str) -> dict[str, np.ndarray]:
        if self._parts is None or self._parts[0] != base:
            stored = self.blocks(base)
            n, k = self.float_weights.shapes[base]
            self._parts = (base, split_superblocks(stored.data, stored.format, n, k))
        return self._parts[1]

    def __getitem__(self, name: str) -> np.ndarray:
        base, _, part = name.rpartition(".")
        if base in self.superblock_formats:
            parts = self._superblock_parts(base)
            if part not in parts:
                raise KeyError(f"{base} is stored as {', '.join(base + '.' + p for p in parts)} in native")
            return parts[part]
        return super().__getitem__(name)

    def __iter__(self):
        for name in super().__iter__():
            base, _, part = name.rpartition(".")
            if base not in self.superblock_formats:
                yield name
            elif part == "qs":
                yield from (f"{base}.{p}" for p in superblock_parts(self.superblock_formats[base]))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    @property
    def narrow(self) -> tuple[tuple[str, int, int], ...]:
        """(name.qs, bits, offset) of the int8 quants filled from stored blocks that fit fewer
        than 8 bits (narrow_storage)."""
        out = []
        for name, kind in sorted(self.types.items()):
            storage = narrow_storage(format_named(kind))
            if self.blocks is not None and name not in self.fallbacks and storage:
                out.append((f"{name}.qs",) + storage)
        return tuple(out)

    def fallback_note(self) -> str | None:
        """One line naming the matrices that are requantized to Q8_0 and their types, or None."""
        if not self.fallbacks:
            return None
        if self.blocks is None:
            return (f"native: {self.where} has no stored quantized blocks; every matrix is quantized to Q8_0, "
                    f"as --precision int8 does")
        by_type: dict[str, list[str]] = {}
        for name, kind in self.fallbacks.items():
            by_type.setdefault(kind, []).append(name)
        parts = [f"{kind}: {compress_names(names)}" for kind, names in sorted(by_type.items())]
        return (f"native: {len(self.fallbacks)} tensor(s) of a type with no exact native form are requantized "
                f"to Q8_0 ({'; '.join(parts)})")


class FormedArrays(Mapping):
    """Arrays already in a precision's form (name.qs, name.d, ...: a test's, or the interpreter's
    own), named as that form, so that a packed file records what it holds."""

    def __init__(self, arrays: Mapping[str, np.ndarray], form: str):
        self.arrays, self.form = arrays, form
        self.narrow = ()
        self.superblocks = superblocks_of_arrays(arrays) if form == "native" else ()

    def fallback_note(self) -> str | None:
        return None

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def __iter__(self):
        return iter(self.arrays)

    def __len__(self) -> int:
        return len(self.arrays)


def superblocks_of_arrays(arrays: Mapping[str, np.ndarray]) -> tuple:
    """(name, sub, block, mins) of the matrices given in a K format's parts (name.sc beside
    name.qs and name.d), read off their shapes."""
    out = []
    for name in sorted(n for n in arrays if n.endswith(".sc")):
        base = name[:-3]
        k = arrays[base + ".qs"].shape[1]
        out.append((base, k // arrays[name].shape[1], k // arrays[base + ".d"].shape[1], base + ".mn" in arrays))
    return tuple(out)


def compress_names(names: list[str]) -> str:
    """Layer tensors named once per kind with their layer numbers:
    model.layers.{0,2,5}.mlp.down_proj.weight."""
    groups: dict[tuple[str, str], list[int]] = {}
    singles = []
    for name in names:
        parts = name.split(".")
        if len(parts) > 3 and parts[1] == "layers" and parts[2].isdigit():
            groups.setdefault((".".join(parts[:2]), ".".join(parts[3:])), []).append(int(parts[2]))
        else:
            singles.append(name)
    out = [f"{head}.{{{','.join(map(str, sorted(layers)))}}}.{tail}" if len(layers) > 1 else
           f"{head}.{layers[0]}.{tail}" for (head, tail), layers in sorted(groups.items())]
    return ", ".join(out + sorted(singles))
