"""A generation session: the KV cache, the position, and checks on what goes in.

A backend runs the graph (the interpreter here; the compiled library later). The session
keeps the cache and refuses, before anything changes, tokens outside the vocabulary and
steps that would overflow the context, so a rejected step leaves the state as it was.
"""
from __future__ import annotations

import numpy as np

from . import interpreter
from .checks import check_n_ctx, check_tokens
from .errors import ContextFullError, InputError
from .frontend.config import Qwen2Config
from .frontend.qwen2 import build_qwen2, cache_names
from .library import CompiledSession


class InterpreterSession:
    """Runs Qwen2 with the NumPy interpreter: the reference backend."""

    backend_name = "interp"

    def __init__(self, config: Qwen2Config, weights: dict[str, np.ndarray], n_ctx: int = 4096):
        self.config = config
        self.n_ctx = check_n_ctx(n_ctx, config)
        self.weights = weights
        self._run = interpreter.run
        self._graphs = {False: build_qwen2(config, logits="last"), True: build_qwen2(config, logits="all")}
        self.reset()

    def reset(self) -> None:
        cfg = self.config
        empty = np.zeros((cfg.num_key_value_heads, 0, cfg.head_dim), np.float32)
        self.cache = {name: empty for name in cache_names(cfg)}
        self.past = 0

    def step(self, tokens, all_logits: bool = False) -> np.ndarray:
        """Runs new tokens after the cached ones; returns logits [vocab] (or [seq, vocab])."""
        ids = check_tokens(tokens, self.config.vocab_size)
        if self.past + ids.size > self.n_ctx:
            raise ContextFullError(f"context is full: {self.past} cached + {ids.size} new tokens exceed "
                                   f"n_ctx = {self.n_ctx}")
        graph = self._graphs[all_logits]
        env = {"seq": int(ids.size), "past": self.past}
        out = self._run(graph, env, {"tokens": ids, **self.cache}, self.weights)
        self.cache = {name: out[name] for name in self.cache}
        self.past += int(ids.size)
        logits = out["logits"]
        return logits if all_logits else logits[0]


BACKENDS = ("compiled", "interp")


def open_session(model, backend: str = "compiled", n_ctx: int = 4096, threads: int = 1, progress: bool = False,
                 tuned: bool = True):
    """A session on a LoadedModel: the compiled library (default) or the NumPy interpreter.
    tuned=False: the recipes' schedules even where `nanocompile tune` measured others."""
    if backend == "interp":
        return InterpreterSession(model.config, model.weights, n_ctx=n_ctx)
    if backend == "compiled":
        return CompiledSession(model.config, model.weights, n_ctx=n_ctx, threads=threads,
                               weights_key=model.key, progress=progress, tuned=tuned)
    raise InputError(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")
