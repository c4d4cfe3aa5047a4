"""A generation session: the KV cache, the position, and checks on what goes in.

A backend runs the graph (the interpreter here; the compiled library later). The session
keeps the cache and refuses, before anything changes, tokens outside the vocabulary and
steps that would overflow the context, so a rejected step leaves the state as it was.
"""
from __future__ import annotations

import functools

import numpy as np

from . import interpreter
from .cache.notes import note
from .checks import check_n_ctx, check_precision, check_tokens, fallback_note, weights_in
from .choices import GRAPH_OF
from .compiler import DEFAULT_CHUNK
from .errors import ContextFullError, InputError
from .frontend.config import Qwen2Config
from .frontend.qwen2 import build_qwen2, cache_names
from .library import CompiledSession
from .quantize import superblock_weights
from .target import detect_march, has_fma


def library_order(march: str | None = None) -> str:
    """The interpreter order a compiled library for march (default: this CPU's) agrees with bit
    for bit: its matmul sums are fused multiply-adds where the target has FMA."""
    return "compiled_fma" if has_fma(march or detect_march()[0]) else "compiled"


class InterpreterSession:
    """Runs Qwen2 with the NumPy interpreter: the reference backend."""

    backend_name = "interp"
    max_chunk = DEFAULT_CHUNK  # the prompt is fed in chunks of this many tokens, as the compiled library runs it

    def __init__(self, config: Qwen2Config, weights: dict[str, np.ndarray], n_ctx: int = 4096,
                 precision: str = "f32", order: str | None = None):
        """order: the interpreter's (interpreter.ORDERS); by default, for int8 and native, the
        compiled library's order on this CPU (library_order), since quantized activations would
        turn BLAS's other rounding into other int8 values; for f32, NumPy's. native runs int8's
        graph on the weights quantize.NativeWeights makes."""
        self.config = config
        self.n_ctx = check_n_ctx(n_ctx, config)
        self.precision = check_precision(precision)
        view = weights_in(precision, weights)
        said = fallback_note(view)
        if said:
            note(said)
        self.weights = dict(view)
        graph = GRAPH_OF[precision]
        self.order = order or (library_order() if graph == "int8" else "numpy")
        self._run = functools.partial(interpreter.run, order=self.order)
        blocks = superblock_weights(view, precision)
        self._graphs = {False: build_qwen2(config, "last", graph, blocks), True: build_qwen2(config, "all", graph, blocks)}
        self.reset()

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


BACKENDS = ("compiled", "interp")


def open_session(model, backend: str = "compiled", n_ctx: int = 4096, threads: int = 1, progress: bool = False,
                 precision: str = "f32", tuned: bool = True):
    """A session on a LoadedModel: the compiled library (default) or the NumPy interpreter.
    tuned=False: the recipes' schedules even where `nanocompile tune` measured others."""
    check_precision(precision)
    if backend == "interp":
        # every weight converted (and checked) before the first step; int8's forms are made from
        # the source one tensor at a time, without keeping a float32 copy
        weights = model.weights if GRAPH_OF[precision] == "int8" else model.weights.materialize()
        return InterpreterSession(model.config, weights, n_ctx=n_ctx, precision=precision)
    if backend == "compiled":
        return CompiledSession(model.config, model.weights, n_ctx=n_ctx, threads=threads,
                               weights_key=model.key, progress=progress, precision=precision, tuned=tuned)
    raise InputError(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")
