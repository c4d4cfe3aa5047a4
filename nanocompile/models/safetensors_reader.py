"""Reads safetensors files into NumPy arrays, bfloat16 included, without copying f32 data.

The safetensors package's NumPy front end has no bfloat16, which is how Qwen2 checkpoints
are published, so the header is read here (8-byte length, JSON, then raw little-endian
data) and each tensor is a view of a memory map, checked against the file's size first.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from ..errors import ModelError

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}
MAX_HEADER = 100 * 1024 * 1024


def read_header(path: Path) -> tuple[dict, int]:
    """Returns the tensor table and the offset where data begins."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelError(f"{path}: too short to be a safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise ModelError(f"{path}: header length {n} is impossible for a file of {size} bytes")
        try:
            table = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelError(f"{path}: header is not valid JSON ({e})") from None
    if not isinstance(table, dict):
        raise ModelError(f"{path}: header is not a JSON object")
    table.pop("__metadata__", None)
    return table, 8 + n


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor in the file as float32 (f32 tensors are memory-mapped, others converted)."""
    table, start = read_header(path)
    size = path.stat().st_size
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, info in table.items():
        try:
            dtype_name, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ModelError(f"{path}: tensor {name!r} has a malformed header entry") from None
        if dtype_name not in _DTYPES:
            raise ModelError(f"{path}: tensor {name!r} has dtype {dtype_name}, which is not supported "
                             f"(supported: {', '.join(_DTYPES)})")
        dtype = np.dtype(_DTYPES[dtype_name])
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if any((not isinstance(d, int)) or d < 0 for d in shape) or count * dtype.itemsize != end - begin:
            raise ModelError(f"{path}: tensor {name!r} has shape {shape} but {end - begin} bytes of {dtype_name}")
        if not (0 <= begin <= end and start + end <= size):
            raise ModelError(f"{path}: tensor {name!r} lies outside the file (ends at byte {start + end}, "
                             f"file has {size})")
        data = raw[start + begin:start + end].view(dtype).reshape(shape)
        if dtype_name == "BF16":
            # bfloat16 is the top half of a float32
            data = (data.astype(np.uint32) << 16).view(np.float32)
        elif dtype_name != "F32":
            data = data.astype(np.float32)
        out[name] = data
    return out
