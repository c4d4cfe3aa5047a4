"""Checks on what goes into a session, shared by every backend: each refuses before anything
changes, so a rejected step leaves the state as it was."""
from __future__ import annotations

import numpy as np

from .errors import InputError
from .frontend.config import Qwen2Config
from .choices import AUTO, PRECISIONS
from .models.weights import WeightSource
from .quantize import Int8Weights, NativeWeights


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


def resolve_precision(precision: str, weights) -> str:
    """auto: native when the model file stores every matrix in a block format native runs as
    stored (a quantized GGUF: Q8_0, Q5_0, Q4_0 and the K formats), so nothing is requantized;
    f32 otherwise (a Hugging Face directory, a GGUF with float matrices). Any other precision
    as it is."""
    if precision != AUTO:
        return precision
    if not isinstance(weights, WeightSource):
        return "f32"
    native = NativeWeights.of_source(weights)  # no stored blocks (safetensors): every matrix falls back
    return "native" if native.blocks is not None and not native.fallbacks else "f32"


def weights_in(precision: str, weights):
    """The weights as a precision's graph reads them: for int8, in its form (Q8_0 tensors a GGUF
    file stores split as they are, the other matrices quantized as they are asked for); for
    native, int8's form with every tensor whose stored format is exact in it split as stored
    (quantize.NativeWeights); otherwise as given."""
    if precision not in ("int8", "native") or isinstance(weights, Int8Weights) \
            or any(name.endswith(".qs") for name in weights):
        return weights
    view = NativeWeights if precision == "native" else Int8Weights
    if isinstance(weights, WeightSource):
        return view.of_source(weights)
    return view(weights, {name for name, w in weights.items() if np.ndim(w) == 2})


def fallback_note(weights) -> str | None:
    """The one line a native view has to say about the tensors it requantizes (None: nothing)."""
    return weights.fallback_note() if isinstance(weights, NativeWeights) else None
