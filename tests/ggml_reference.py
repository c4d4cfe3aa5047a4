"""ggml's own C reference for the block formats: dequantize_row_<type> and
quantize_row_<type>_ref from libggml-base, the library llama-cpp-python ships (the test extra).
The gguf library has no dequantizer for Q8_K and quantizes no K format; this is the code
llama.cpp itself runs for both."""
from __future__ import annotations

import ctypes
import importlib.util
from functools import lru_cache
from pathlib import Path

import numpy as np


@lru_cache(maxsize=None)
def ggml_base() -> ctypes.CDLL | None:
    """libggml-base from the installed llama_cpp package, or None if it is not installed."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    for directory in spec.submodule_search_locations:
        found = sorted((Path(directory) / "lib").glob("libggml-base.so*"))
        if found:
            return ctypes.CDLL(str(found[0]))
    return None


def _c_name(type_name: str) -> str:
    return type_name[0].lower() + type_name[1:]  # Q4_K -> q4_K, as ggml spells its functions


def _function(name: str):
    fn = getattr(ggml_base(), name)
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    return fn


def ggml_dequantize(type_name: str, raw: np.ndarray, block: int) -> np.ndarray:
    """dequantize_row_<type> over every block of raw ([..., nbytes] uint8)."""
    raw = np.ascontiguousarray(raw, np.uint8)
    n = raw.size // raw.shape[-1] * block
    out = np.empty(n, np.float32)
    _function(f"dequantize_row_{_c_name(type_name)}")(raw.ctypes.data, out.ctypes.data, n)
    return out


def ggml_quantize(type_name: str, values: np.ndarray, nbytes: int, block: int) -> np.ndarray:
    """quantize_row_<type>_ref: float32 values (a multiple of block) -> uint8 [n_blocks, nbytes]."""
    values = np.ascontiguousarray(values, np.float32).ravel()
    out = np.zeros((values.size // block, nbytes), np.uint8)
    _function(f"quantize_row_{_c_name(type_name)}_ref")(values.ctypes.data, out.ctypes.data, values.size)
    return out
