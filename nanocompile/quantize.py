"""Weights in the int8 precision's form: Q8_0's numbers, split into what the kernels read.

A [N, K] weight becomes `name.qs` int8 [N, Kp] and `name.d` float16 [N, Kp / 32], K padded with
zeros to whole blocks of 32 (zeros add nothing to a block's dot product). A Q8_0 tensor from a
GGUF file is split as stored, with no float32 round trip; any other tensor is quantized once by
the `gguf` library's Q8_0 quantizer, which reproduces ggml's reference quantizer bit for bit
(llama.cpp quantizes weights with it): per block d = max|w| / 127 as float16, q = round(w / d)
half away from zero.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .errors import ModelError
from .frontend.nn import padded
from .ir.ops import QBLOCK

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
    """The int8 precision's weights, made from float32 weights (or GGUF Q8_0 tensors, given in
    `q8_0` as name -> (raw blocks, (rows, k))) one tensor at a time, as the packer asks."""

    def __init__(self, float_weights: Mapping[str, np.ndarray], quantized: set[str],
                 q8_0: Mapping[str, np.ndarray] | None = None):
        self.float_weights = float_weights
        self.quantized = quantized
        self.q8_0 = q8_0 or {}
        self._last: tuple[str, tuple] | None = None  # qs and d are asked for one after the other

    def _split(self, base: str) -> tuple[np.ndarray, np.ndarray]:
        if self._last is None or self._last[0] != base:
            if base in self.q8_0:
                raw, (n, k) = self.q8_0[base]
                parts = split_q8_0(raw, n, k)
                if (parts[0] == -128).any():  # the kernels' sign trick needs |q| <= 127
                    raise ModelError(f"tensor {base!r}: a Q8_0 value of -128, outside the [-127, 127] a Q8_0 "
                                     f"quantizer writes and these kernels assume")
            else:
                parts = quantize_q8_0(np.asarray(self.float_weights[base], np.float32))
            self._last = (base, parts)
        return self._last[1]

    def __getitem__(self, name: str) -> np.ndarray:
        base, _, part = name.rpartition(".")
        if base in self.quantized and part in ("qs", "d"):
            qs, d = self._split(base)
            return qs if part == "qs" else d
        if name in self.quantized:
            raise KeyError(f"{name} is stored as {name}.qs and {name}.d in int8")
        return self.float_weights[name]

    def __iter__(self):
        for name in dict.fromkeys([*self.float_weights, *self.q8_0]):
            if name in self.quantized:
                yield name + ".qs"
                yield name + ".d"
            else:
                yield name

    def __len__(self) -> int:
        return sum(1 for _ in self)
