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
    """The int8 precision's weights, made one base tensor at a time as they are asked for: from
    the stored Q8_0 blocks when the source has them (raw(name) -> (ggml type name, bytes)), else
    quantized from the float32 tensor. Matrices are quantized; vectors (norms, biases) stay
    float32."""

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
