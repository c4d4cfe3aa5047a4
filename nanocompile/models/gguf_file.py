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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from ..cache.files import identity, read_record, write_record
from ..cache.location import cache_root
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


_LENGTH = struct.Struct("<Q")


class FileArray(Sequence):
    """A metadata array as the file holds it, read when first used: its bounds are checked when the
    file is parsed, its strings' text when they are decoded (the vocabulary's 151,936 tokens and
    merges are needed only to build a tokenizer, which a warm start finds in the cache)."""

    def __init__(self, path: Path, elem: int, start: int, end: int, count: int, what: str):
        self.path, self.elem, self.start, self.end, self.count, self.what = path, elem, start, end, count, what
        self._items: list | None = None

    def _read(self) -> list:
        if self._items is None:
            with open(self.path, "rb") as f:
                f.seek(self.start)
                raw = f.read(self.end - self.start)
            if len(raw) != self.end - self.start:
                raise ModelError(f"{self.path}: the file ends inside {self.what} (changed since it was read?)")
            self._items = self._strings(raw) if self.elem == STRING else self._numbers(raw)
        return self._items

    def _strings(self, raw: bytes) -> list[str]:
        pos, items = 0, []
        for j in range(self.count):
            (n,) = _LENGTH.unpack_from(raw, pos)
            pos += 8
            try:
                items.append(raw[pos:pos + n].decode("utf-8"))
            except UnicodeDecodeError as e:
                raise ModelError(f"{self.path}: element {j} of {self.what} at byte {self.start + pos} is not UTF-8 "
                                 f"text (byte {e.start} of {n})") from None
            pos += n
        return items

    def _numbers(self, raw: bytes) -> list:
        name, fmt = SCALARS[self.elem]
        array = np.frombuffer(raw, dtype=np.dtype(fmt), count=self.count)
        return [bool(x) for x in array] if name == "BOOL" else array.tolist()

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i):
        return self._read()[i]

    def __iter__(self):
        return iter(self._read())

    def __eq__(self, other) -> bool:
        return list(self) == list(other) if isinstance(other, (list, tuple, FileArray)) else NotImplemented

    def __repr__(self) -> str:
        return f"FileArray({self.count} of {type_name(self.elem)})"


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
    """Parses and checks path's header, metadata and tensor table (the tensor data is not read).
    A file parsed before and unchanged since (its identity: device, inode, size, modification and
    change times) is read from the cache's record of it instead (0.05 s of parsing saved for the
    default model, most of it walking the 300,000 strings of its vocabulary)."""
    st = path.stat()
    if st.st_size < HEADER_BYTES:
        raise ModelError(f"{path}: {st.st_size} bytes is too short to be a GGUF file")
    cached = _cached_header(path, st)
    if cached is not None:
        return cached
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        parsed = _Parser(path, buf, st.st_size).parse()
    finally:
        buf.close()
    _remember_header(parsed, st)
    return parsed


# parsed headers, kept in the cache by file identity ---------------------------------------------

HEADER_RECORD = 1  # the form of a kept header; a record of another form is parsed again


def _header_name(path: Path) -> str:
    return f"headers/{xxhash.xxh3_64_hexdigest(str(path.resolve()).encode())}.json"


def _cached_header(path: Path, st) -> GGUFFile | None:
    for candidate in cache_root().candidates(_header_name(path)):
        r = read_record(candidate)
        if not r or r.get("form") != HEADER_RECORD or r.get("identity") != identity(st) or \
                r.get("path") != str(path.resolve()):
            continue
        try:
            metadata = {}
            for key, kind, value in r["metadata"]:
                if isinstance(value, dict):  # an array: where it is in the file
                    elem, start, end, count = value["array"]
                    value = FileArray(path, elem, start, end, count, f"metadata key {key!r}")
                metadata[key] = Value(kind, value)
            tensors = [TensorInfo(n, tuple(d), i, k, o, b, s) for n, d, i, k, o, b, s in r["tensors"]]
            return GGUFFile(path, r["version"], st.st_size, metadata, tensors, r["data_start"], r["alignment"])
        except (KeyError, TypeError, ValueError):
            continue
    return None


def _remember_header(f: GGUFFile, st) -> None:
    def value(v):
        return {"array": [v.elem, v.start, v.end, v.count]} if isinstance(v, FileArray) else v

    record = {"form": HEADER_RECORD, "path": str(f.path.resolve()), "identity": identity(st), "version": f.version,
              "data_start": f.data_start, "alignment": f.alignment,
              "metadata": [[k, m.type, value(m.value)] for k, m in f.metadata.items()],
              "tensors": [[t.name, list(t.dims), t.type_id, t.type, t.offset, t.n_bytes, t.start] for t in f.tensors]}
    try:
        write_record(cache_root().place(_header_name(f.path)), record)
    except OSError:
        pass  # parsed again next time


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
        self.align = self.alignment(metadata)
        table_start = self.pos
        try:
            infos = [self.tensor_info(i, n_tensors) for i in range(n_tensors)]
            data_start = self.data_start()
            tensors, problem = self.place(infos, data_start)
        except ModelError as e:  # a wrong count reads tensor data as entries, or stops short of them
            self.check_count(n_tensors, table_start)
            raise e from None
        if problem:
            self.check_count(n_tensors, table_start)
            self.fail(problem)
        return GGUFFile(self.path, version, self.size, metadata, tensors, data_start, self.align)

    def data_start(self) -> int:
        """The data section begins at the first aligned byte after the tensor table."""
        return -(-self.pos // self.align) * self.align

    def check_count(self, claimed: int, table_start: int) -> None:
        """Fails naming both counts if the tensor table holds another number of entries than the
        header claims: the first count whose entries lay out the data section exactly."""
        self.pos, entries = table_start, []
        while len(entries) < MAX_TENSORS:
            try:
                entries.append((self.tensor_info(len(entries), claimed), self.data_start()))
            except ModelError:
                break
        for n in range(1, len(entries) + 1):
            if n == claimed:
                continue
            try:
                _, problem = self.place([info for info, _ in entries[:n]], entries[n - 1][1])
            except ModelError:
                continue
            if problem is None:
                self.fail(f"the header claims {claimed} tensors, but the tensor table holds {n} (their data "
                          f"fills the file exactly)")

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
        start = self.pos
        if elem == STRING:
            self.skip_strings(count, what)
            return Value("ARRAY[STRING]", FileArray(self.path, elem, start, self.pos, count, what))
        name, fmt = SCALARS[elem]
        self.pos += count * smallest
        if name == "BOOL" and count:
            array = np.frombuffer(self.buf, dtype=np.uint8, count=count, offset=start)
            if array.max() > 1:
                self.fail(f"{what} is an array of BOOL with a byte value {int(array.max())} (expected 0 or 1)")
        return Value(f"ARRAY[{name}]", FileArray(self.path, elem, start, self.pos, count, what))

    def skip_strings(self, count: int, what: str) -> None:
        """Past count strings, their lengths checked against the file; their text is decoded when read."""
        buf, start, size = self.buf, self.pos, self.size
        pos = start
        for j in range(count):
            if size - pos < 8:
                self.pos = pos
                self.need(8, f"the length of element {j} of {what}")
            (n,) = _LENGTH.unpack_from(buf, pos)
            pos += 8
            if n > size - pos:
                self.pos = pos
                self.need(n, f"element {j} of {what}")
            pos += n
        self.pos = pos

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

    def place(self, infos: list[dict], data_start: int) -> tuple[list[TensorInfo], str | None]:
        """Sizes each tensor from its type and shape (failing on what no layout can fix), and
        returns them with the first fault of the layout, if any: a tensor outside the file or
        misaligned, two that overlap, or bytes of the data section that no tensor explains beyond
        the alignment padding after each."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        if data_start > self.size:
            return [], (f"the data section would start at byte {data_start}, past the end of the file "
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
            out.append(TensorInfo(name, dims, type_id, qtype.name, offset, n_bytes, data_start + offset))
        return out, self.layout_problem(out, data_start)

    def layout_problem(self, tensors: list[TensorInfo], data_start: int) -> str | None:
        for t in tensors:
            if t.offset % self.align:
                return f"tensor {t.name!r} has data offset {t.offset}, not a multiple of the alignment {self.align}"
            if t.end > self.size:
                return (f"tensor {t.name!r} ends at byte {t.end} but the file has {self.size} bytes (truncated?): "
                        f"{t.type} {list(t.dims)} is {t.n_bytes} bytes from byte {t.start}")
        by_start = sorted(tensors, key=lambda t: (t.start, t.end))
        for a, b in zip(by_start, by_start[1:]):
            if b.start < a.end:
                return (f"tensor {b.name!r} (bytes {b.start}..{b.end}) overlaps tensor {a.name!r} "
                        f"(bytes {a.start}..{a.end})")
        # every byte of the data section is a tensor's or the padding after one (less than the alignment)
        ends = [data_start] + [t.end for t in by_start]
        starts = [t.start for t in by_start] + [self.size]
        for i, (end, start) in enumerate(zip(ends, starts)):
            if start - end >= self.align:
                where = (f"after tensor {by_start[i - 1].name!r}" if i else "before the first tensor")
                upto = f"before tensor {by_start[i].name!r}" if i < len(by_start) else "up to the end of the file"
                return (f"the data section has {start - end} bytes {where} (bytes {end}..{start}, {upto}) that no "
                        f"tensor in the table explains (the alignment padding is less than {self.align} bytes)")
        return None
