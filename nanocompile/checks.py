"""Checks on what goes into a session, shared by every backend: each refuses before anything
changes, so a rejected step leaves the state as it was."""
from __future__ import annotations

import numpy as np

from .errors import InputError
from .frontend.config import Qwen2Config
from .frontend.qwen2 import PRECISIONS, quantized_weights
from .quantize import Int8Weights


def check_tokens(tokens, vocab_size: int) -> np.ndarray:
    array = np.asarray(tokens)
    if array.ndim != 1 or array.size == 0:
        raise InputError("a step needs at least one token")
    if not np.issubdtype(array.dtype, np.integer):
        raise InputError(f"token ids must be integers, got {array.dtype}")
    bad = np.flatnonzero((array < 0) | (array >= vocab_size))
    if bad.size:
        i = int(bad[0])
        raise InputError(f"token id {int(array[i])} at position {i} is outside the vocabulary (0..{vocab_size - 1})")
    return array.astype(np.int32)


def check_n_ctx(n_ctx: int, cfg: Qwen2Config) -> int:
    if not isinstance(n_ctx, int) or n_ctx < 1:
        raise InputError(f"context size must be a positive integer, got {n_ctx!r}")
    if n_ctx > cfg.max_position_embeddings:
        raise InputError(f"context size {n_ctx} exceeds the model's maximum of {cfg.max_position_embeddings}")
    return n_ctx


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise InputError(f"precision {precision!r} is not supported (choose from {', '.join(PRECISIONS)})")
    return precision


def weights_in(precision: str, cfg: Qwen2Config, weights, q8_0=None):
    """The weights as a precision's graph reads them (int8: quantized as they are asked for, or
    split from the Q8_0 tensors a GGUF file stores)."""
    if precision != "int8" or isinstance(weights, Int8Weights):
        return weights
    quantized = quantized_weights(cfg)
    if all(name + ".qs" in weights for name in quantized):
        return weights  # already in int8's form
    return Int8Weights(weights, quantized, q8_0)
