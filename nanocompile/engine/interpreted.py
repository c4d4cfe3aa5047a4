"""The interpreted session: the NumPy interpreter runs the opened model's graph, the reference
the compiled library is checked against. It keeps the KV cache and the position and refuses,
before anything changes, tokens outside the vocabulary and steps that would overflow the
context, so a rejected step leaves the state as it was (as the compiled session does).
"""
from __future__ import annotations

import copy
import functools

import numpy as np

from ..cache.notes import note
from ..codegen.options import DEFAULT_CHUNK
from ..errors import ContextFullError, InputError
from ..frontend.qwen2 import build_qwen2, cache_names
from ..ir import interpreter
from ..target import detect_march, has_fma
from .checks import check_n_ctx, check_tokens
from .open import Opened, fallback_note, open_model


def library_order(march: str | None = None) -> str:
    """The interpreter order a compiled library for march (default: this CPU's) agrees with bit
    for bit: its matmul sums are fused multiply-adds where the target has FMA."""
    return "compiled_fma" if has_fma(march or detect_march()[0]) else "compiled"


class InterpreterSession:
    """Runs Qwen2 with the NumPy interpreter: the reference backend."""

    backend_name = "interp"
    rows_exact = False  # NumPy's matrix products round a row differently in a step of many rows
    max_chunk = DEFAULT_CHUNK  # the prompt is fed in chunks of this many tokens, as the compiled library runs it

    def __init__(self, opened: Opened, n_ctx: int = 4096, order: str | None = None):
        """order: the interpreter's (interpreter.ORDERS); by default, for int8 and native, the
        compiled library's order on this CPU (library_order), since quantized activations would
        turn BLAS's other rounding into other int8 values; for f32, NumPy's. Every weight is
        converted (and checked) here, before the first step."""
        self.config = opened.config
        self.n_ctx = check_n_ctx(n_ctx, opened.config)
        self.precision = opened.precision
        said = fallback_note(opened.weights)
        if said:
            note(said)
        self.weights = dict(opened.weights)
        graph = opened.graph
        self.order = order or (library_order() if graph == "int8" else "numpy")
        self._run = functools.partial(interpreter.run, order=self.order)
        blocks = opened.options.superblocks
        self._graphs = {False: build_qwen2(opened.config, "last", graph, blocks),
                        True: build_qwen2(opened.config, "all", graph, blocks)}
        self.reset()

    @classmethod
    def from_weights(cls, config, weights, n_ctx: int = 4096, precision: str = "f32",
                     order: str | None = None) -> "InterpreterSession":
        """A session on weights and their config, opened here (open.open_model)."""
        return cls(open_model(weights, precision, config=config), n_ctx, order)

    @property
    def weights_bytes(self) -> int:
        """The weights' bytes in the form the graph reads (float32, or int8's and native's parts)."""
        return sum(int(np.asarray(w).nbytes) for w in self.weights.values())

    def sequences(self, n: int) -> list["InterpreterSession"]:
        """n sequences on these weights: this session and n - 1 more, each with its own cache,
        for step_batch (the compiled library's slots)."""
        if not 1 <= n <= self.max_chunk:
            raise InputError(f"sequences: {n} is outside 1..{self.max_chunk}")
        out = [self]
        for _ in range(n - 1):
            other = copy.copy(self)
            other.reset()
            out.append(other)
        return out

    def step_batch(self, parts: list[tuple]) -> list[np.ndarray]:
        """What a batched step means: each sequence's rows run as its own step. parts: (session, ids)
        or (session, ids, all_logits); per sequence its step's logits (every row's by default).
        The compiled library runs the sequences' rows together and gives these same numbers (in
        its order of operations; loopir/segments.py)."""
        if not parts:
            raise InputError("step_batch: no sequences")
        if len({id(part[0]) for part in parts}) != len(parts):
            raise InputError("step_batch: a sequence is given twice")
        ids = [check_tokens(part[1], self.config.vocab_size) for part in parts]
        if sum(x.size for x in ids) > self.max_chunk:
            raise InputError(f"step_batch: {sum(x.size for x in ids)} rows; a batched step takes at most "
                             f"{self.max_chunk}")
        for part, x in zip(parts, ids):
            if part[0].past + x.size > part[0].n_ctx:
                raise ContextFullError(f"context is full: {part[0].past} cached + {x.size} new tokens exceed "
                                       f"n_ctx = {part[0].n_ctx}")
        return [part[0].step(x, all_logits=bool(part[2]) if len(part) > 2 else True) for part, x in zip(parts, ids)]

    def reset(self) -> None:
        cfg = self.config
        empty = np.zeros((cfg.num_key_value_heads, 0, cfg.head_dim), np.float32)
        self.cache = {name: empty for name in cache_names(cfg)}
        self.past = 0
        self._history: list[int] = []

    @property
    def tokens(self) -> list[int]:
        """The tokens in the KV cache, in order."""
        return self._history[:self.past]

    def truncate(self, n_past: int) -> None:
        """Forgets the cached tokens from position n_past on; those before it stay."""
        if not 0 <= n_past <= self.past:
            raise InputError(f"truncate: {n_past} is outside 0..{self.past} (the tokens cached)")
        self.cache = {name: c[:, :n_past] for name, c in self.cache.items()}
        self.past = n_past
        del self._history[n_past:]

    def step(self, tokens, all_logits: bool = False) -> np.ndarray:
        """Runs new tokens after the cached ones; returns logits [vocab] (or [seq, vocab])."""
        ids = check_tokens(tokens, self.config.vocab_size)
        if self.past + ids.size > self.n_ctx:
            raise ContextFullError(f"context is full: {self.past} cached + {ids.size} new tokens exceed "
                                   f"n_ctx = {self.n_ctx}")
        graph = self._graphs[all_logits]
        env = {"seq": int(ids.size), "past": self.past}
        out = self._run(graph, env, {"tokens": ids, **self.cache}, self.weights)
        self._history[self.past:] = ids.tolist()
        self.cache = {name: out[name] for name in self.cache}
        self.past += int(ids.size)
        logits = out["logits"]
        return logits if all_logits else logits[0]
