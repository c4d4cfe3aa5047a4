"""Reads safetensors files into NumPy arrays, bfloat16 included, without copying f32 data.

The safetensors package's NumPy front end has no bfloat16, which is how Qwen2 checkpoints
are published, so the header is read here (8-byte length, JSON, then raw little-endian
data). Every header entry is checked before any data is touched: its JSON types, its dtype,
its shape against its byte range, the range inside the file and not overlapping another; each
tensor is then a view of a memory map (converted to float32 if it is not float32).
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelError

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}
MAX_HEADER = 100 * 1024 * 1024
MAX_DIMS = 8


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte positions in the file
    end: int


def _json_kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_table(path: Path) -> dict[str, TensorEntry]:
    """The file's tensors, every entry checked against the file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelError(f"{path}: too short to be a safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise ModelError(f"{path}: header length {n} is impossible for a file of {size} bytes")
        raw = f.read(n)
    try:
        table = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelError(f"{path}: header is not valid JSON ({e})") from None
    if not isinstance(table, dict):
        raise ModelError(f"{path}: header is {_json_kind(table)}, expected a JSON object")
    table.pop("__metadata__", None)
    start = 8 + n
    out = {}
    for name, info in table.items():
        out[name] = _entry(path, name, info, start, size)
    by_start = sorted(out.values(), key=lambda e: (e.start, e.end))
    for a, b in zip(by_start, by_start[1:]):
        if b.start < a.end:
            raise ModelError(f"{path}: tensor {b.name!r} (bytes {b.start}..{b.end}) overlaps tensor {a.name!r} "
                             f"(bytes {a.start}..{a.end})")
    return out


def _entry(path: Path, name: str, info, start: int, size: int) -> TensorEntry:
    where = f"{path}: tensor {name!r}"
    if not isinstance(info, dict):
        raise ModelError(f"{where}: header entry is {_json_kind(info)}, expected an object")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in info:
            raise ModelError(f"{where}: header entry has no {key!r}")
    dtype_name, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype_name, str):
        raise ModelError(f"{where}: 'dtype' is {_json_kind(dtype_name)}, expected a string")
    if dtype_name not in _DTYPES:
        raise ModelError(f"{where}: dtype {dtype_name} is not supported (supported: {', '.join(_DTYPES)})")
    if not (isinstance(shape, list) and len(shape) <= MAX_DIMS and all(_is_int(d) and d >= 0 for d in shape)):
        raise ModelError(f"{where}: 'shape' is {json.dumps(shape)[:80]}, expected a list of at most {MAX_DIMS} "
                         f"non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)):
        raise ModelError(f"{where}: 'data_offsets' is {json.dumps(offsets)[:80]}, expected two integers")
    begin, end = offsets
    if not 0 <= begin <= end:
        raise ModelError(f"{where}: 'data_offsets' [{begin}, {end}] is not an increasing pair of byte offsets")
    count = 1
    for d in shape:
        count *= d
    itemsize = np.dtype(_DTYPES[dtype_name]).itemsize
    if count * itemsize != end - begin:
        raise ModelError(f"{where}: shape {shape} of {dtype_name} needs {count * itemsize} bytes, but "
                         f"'data_offsets' [{begin}, {end}] span {end - begin}")
    if start + end > size:
        raise ModelError(f"{where}: lies outside the file (ends at byte {start + end}, file has {size})")
    return TensorEntry(name, dtype_name, tuple(shape), start + begin, start + end)


def read_tensor(path: Path, entry: TensorEntry) -> np.ndarray:
    """One tensor as float32, from a memory map of its bytes (a view if it is float32)."""
    dtype = np.dtype(_DTYPES[entry.dtype])
    if entry.end == entry.start:
        return np.zeros(entry.shape, np.float32)
    array = np.memmap(path, dtype=np.uint8, mode="r", offset=entry.start, shape=(entry.end - entry.start,))
    array = array.view(dtype).reshape(entry.shape)
    if entry.dtype == "BF16":
        # bfloat16 is the top half of a float32
        return (array.astype(np.uint32) << 16).view(np.float32)
    if entry.dtype != "F32":
        return array.astype(np.float32)
    return array


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor in the file as float32 (f32 tensors are memory-mapped, others converted)."""
    return {name: read_tensor(path, entry) for name, entry in read_table(path).items()}
