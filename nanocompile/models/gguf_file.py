"""The GGUF container read strictly: header, metadata and tensor table, with every count, length,
type and offset checked against the file before it is used.

A damaged file is refused with what is wrong in the file's own terms (the key, the tensor, the
byte position, the expected and found values). The gguf library's GGUFReader parses the same
format, but it checks no bounds (a flipped length or count surfaces as an exception from deep
inside NumPy, or a long loop) and builds a NumPy view per array element: 8.6 s for the default
model's 151,936-token vocabulary. Its type tables are used here, and its dequantizers by
gguf_model.py.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelError

MAX_TENSORS = 1 << 16
MAX_KEYS = 1 << 16
MAX_DIMS = 4  # GGML_MAX_DIMS
HEADER_BYTES = 24  # magic, version, tensor count, key count

# GGUF value types: id -> (name, struct format); 8 is a string, 9 an array
SCALARS = {0: ("UINT8", "<B"), 1: ("INT8", "<b"), 2: ("UINT16", "<H"), 3: ("INT16", "<h"), 4: ("UINT32", "<I"),
           5: ("INT32", "<i"), 6: ("FLOAT32", "<f"), 7: ("BOOL", "<B"), 10: ("UINT64", "<Q"), 11: ("INT64", "<q"),
           12: ("FLOAT64", "<d")}
STRING, ARRAY = 8, 9
INTEGER_TYPES = {"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64"}
FLOAT_TYPES = {"FLOAT32", "FLOAT64"}


def type_name(type_id: int) -> str:
    if type_id == STRING:
        return "STRING"
    if type_id == ARRAY:
        return "ARRAY"
    return SCALARS[type_id][0] if type_id in SCALARS else f"unknown type {type_id}"


@dataclass(frozen=True)
class Value:
    """A metadata value and its GGUF type: 'UINT32', 'STRING', 'ARRAY[STRING]', ..."""
    type: str
    value: object


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # GGUF order: the fastest-varying axis first
    type_id: int
    type: str  # the ggml type's name: F32, Q8_0, ...
    offset: int  # from the start of the data section
    n_bytes: int
    start: int  # absolute position in the file

    @property
    def end(self) -> int:
        return self.start + self.n_bytes


@dataclass
class GGUFFile:
    path: Path
    version: int
    size: int
    metadata: dict[str, Value]
    tensors: list[TensorInfo]
    data_start: int
    alignment: int


def read_gguf(path: Path) -> GGUFFile:
    """Parses and checks path's header, metadata and tensor table (the tensor data is not read)."""
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise ModelError(f"{path}: {size} bytes is too short to be a GGUF file")
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _Parser(path, buf, size).parse()
    finally:
        buf.close()


class _Parser:
    def __init__(self, path: Path, buf, size: int):
        self.path, self.buf, self.size, self.pos = path, buf, size, 0

    def fail(self, message: str):
        raise ModelError(f"{self.path}: {message}")

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            self.fail(f"the file ends at byte {self.size}, inside {what} ({n} bytes needed at byte {self.pos})")

    def unpack(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def string(self, what: str) -> str:
        n = self.unpack("<Q", f"the length of {what}")
        self.need(n, what)
        raw = self.buf[self.pos:self.pos + n]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self.fail(f"{what} at byte {self.pos} is not UTF-8 text (byte {e.start} of {n})")
        self.pos += n
        return text

    def parse(self) -> GGUFFile:
        magic = bytes(self.buf[:4])
        if magic != b"GGUF":
            self.fail(f"not a GGUF file (starts with {magic!r}, expected b'GGUF')")
        self.pos = 4
        version = self.unpack("<I", "the version")
        if version not in (2, 3):
            self.fail(f"GGUF version {version} is not supported (2 or 3)")
        n_tensors = self.unpack("<Q", "the tensor count")
        n_keys = self.unpack("<Q", "the metadata key count")
        if n_tensors > MAX_TENSORS:
            self.fail(f"header claims {n_tensors} tensors, more than the {MAX_TENSORS} allowed")
        if n_keys > MAX_KEYS:
            self.fail(f"header claims {n_keys} metadata keys, more than the {MAX_KEYS} allowed")
        # the smallest key is 13 bytes (length, type, one byte of value), the smallest tensor entry 32
        if 13 * n_keys + 32 * n_tensors > self.size - self.pos:
            self.fail(f"header claims {n_keys} metadata keys and {n_tensors} tensors, which cannot fit in "
                      f"{self.size} bytes")
        metadata: dict[str, Value] = {}
        for i in range(n_keys):
            key = self.string(f"the name of metadata key {i} of {n_keys}")
            if key in metadata:
                self.fail(f"metadata key {key!r} appears twice")
            type_id = self.unpack("<I", f"the type of metadata key {key!r}")
            metadata[key] = self.value(type_id, f"metadata key {key!r}")
        self.align = alignment = self.alignment(metadata)
        infos = [self.tensor_info(i, n_tensors) for i in range(n_tensors)]
        data_start = -(-self.pos // alignment) * alignment
        tensors = self.place(infos, data_start)
        return GGUFFile(self.path, version, self.size, metadata, tensors, data_start, alignment)

    def value(self, type_id: int, what: str) -> Value:
        if type_id == STRING:
            return Value("STRING", self.string(f"the value of {what}"))
        if type_id == ARRAY:
            return self.array(what)
        if type_id not in SCALARS:
            self.fail(f"{what} has value type {type_id}, which GGUF does not define")
        name, fmt = SCALARS[type_id]
        v = self.unpack(fmt, f"the value of {what}")
        if name == "BOOL":
            if v not in (0, 1):
                self.fail(f"{what} is a BOOL with byte value {v} (expected 0 or 1)")
            v = bool(v)
        return Value(name, v)

    def array(self, what: str) -> Value:
        elem = self.unpack("<I", f"the element type of {what}")
        count = self.unpack("<Q", f"the element count of {what}")
        if elem == ARRAY:
            self.fail(f"{what} is an array of arrays, which is not supported")
        if elem != STRING and elem not in SCALARS:
            self.fail(f"{what} is an array of value type {elem}, which GGUF does not define")
        smallest = 8 if elem == STRING else struct.calcsize(SCALARS[elem][1])
        if count * smallest > self.size - self.pos:
            self.fail(f"{what} claims {count} elements, which cannot fit in the {self.size - self.pos} bytes left")
        if elem == STRING:
            items = [self.string(f"element {j} of {what}") for j in range(count)]
            return Value("ARRAY[STRING]", items)
        name, fmt = SCALARS[elem]
        array = np.frombuffer(self.buf, dtype=np.dtype(fmt), count=count, offset=self.pos)
        self.pos += count * smallest
        if name == "BOOL":
            if count and array.max() > 1:
                self.fail(f"{what} is an array of BOOL with a byte value {int(array.max())} (expected 0 or 1)")
            items = [bool(x) for x in array]
        else:
            items = array.tolist()
        return Value(f"ARRAY[{name}]", items)

    def alignment(self, metadata: dict[str, Value]) -> int:
        found = metadata.get("general.alignment")
        if found is None:
            return 32
        if found.type != "UINT32":
            self.fail(f"metadata key 'general.alignment' has type {found.type}, expected UINT32")
        if found.value == 0 or found.value & (found.value - 1):
            self.fail(f"metadata key 'general.alignment' is {found.value}, expected a power of two")
        return found.value

    def tensor_info(self, i: int, n_tensors: int) -> dict:
        name = self.string(f"the name of tensor {i} of {n_tensors}")
        what = f"tensor {name!r}"
        n_dims = self.unpack("<I", f"the dimension count of {what}")
        if not 1 <= n_dims <= MAX_DIMS:
            self.fail(f"{what} has {n_dims} dimensions (expected 1 to {MAX_DIMS})")
        dims = tuple(self.unpack("<Q", f"dimension {d} of {what}") for d in range(n_dims))
        if 0 in dims:
            self.fail(f"{what} has a zero dimension: {list(dims)}")
        type_id = self.unpack("<I", f"the type of {what}")
        offset = self.unpack("<Q", f"the data offset of {what}")
        return {"name": name, "dims": dims, "type_id": type_id, "offset": offset}

    def place(self, infos: list[dict], data_start: int) -> list[TensorInfo]:
        """Sizes each tensor from its type and shape and checks it lies in the data section,
        aligned, without overlapping another."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        if data_start > self.size:
            self.fail(f"the data section would start at byte {data_start}, past the end of the file "
                      f"({self.size} bytes)")
        seen: set[str] = set()
        out = []
        for t in infos:
            name, dims, type_id, offset = t["name"], t["dims"], t["type_id"], t["offset"]
            if name in seen:
                self.fail(f"tensor {name!r} appears twice")
            seen.add(name)
            try:
                qtype = GGMLQuantizationType(type_id)
                block, type_size = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                self.fail(f"tensor {name!r} has type {type_id}, which is not a ggml tensor type")
            if dims[0] % block:
                self.fail(f"tensor {name!r} has {dims[0]} values per row, not a multiple of the {block}-value "
                          f"blocks of {qtype.name}")
            n_bytes = int(np.prod(dims, dtype=object)) // block * type_size
            if offset % self.align:
                self.fail(f"tensor {name!r} has data offset {offset}, not a multiple of the alignment "
                          f"{self.align}")
            start = data_start + offset
            if start + n_bytes > self.size:
                self.fail(f"tensor {name!r} ends at byte {start + n_bytes} but the file has {self.size} bytes "
                          f"(truncated?): {qtype.name} {list(dims)} is {n_bytes} bytes from byte {start}")
            out.append(TensorInfo(name, dims, type_id, qtype.name, offset, n_bytes, start))
        by_start = sorted(out, key=lambda t: (t.start, t.end))
        for a, b in zip(by_start, by_start[1:]):
            if b.start < a.end:
                self.fail(f"tensor {b.name!r} (bytes {b.start}..{b.end}) overlaps tensor {a.name!r} "
                          f"(bytes {a.start}..{a.end})")
        return out
