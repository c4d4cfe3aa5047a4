"""Checks on what goes into a session, shared by every backend: each refuses before anything
changes, so a rejected step leaves the state as it was."""
from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..frontend.config import Qwen2Config
from .precision import AUTO, PRECISIONS


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


def check_n_ctx(n_ctx: int, cfg: Qwen2Config, source: str | None = None) -> int:
    """source: the model's file or directory, named in the message when the model sets the limit."""
    if not isinstance(n_ctx, int) or n_ctx < 1:
        raise InputError(f"context size must be a positive integer, got {n_ctx!r}")
    if n_ctx > cfg.max_position_embeddings:
        where = f" ({source})" if source else ""
        raise InputError(f"context size {n_ctx} exceeds the model's maximum of {cfg.max_position_embeddings}{where}")
    return n_ctx


def check_precision(precision: str, auto: bool = False) -> str:
    """precision if it is one of PRECISIONS (or, with auto, "auto"); else a one-line error."""
    if precision not in PRECISIONS and not (auto and precision == AUTO):
        choices = ((AUTO,) if auto else ()) + PRECISIONS
        raise InputError(f"precision {precision!r} is not supported (choose from {', '.join(choices)})")
    return precision
