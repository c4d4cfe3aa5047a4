"""Choosing the next token from logits, as llama.cpp's default sampler chain does: repetition,
frequency and presence penalties, top-k, top-p, min-p, temperature, then a draw from a seeded
generator. Temperature <= 0 is greedy (the largest logit after the penalties). The same seed and the same logits give the same
tokens: the compiled library's logits are bitwise the same at every thread count, so sampled
text is too."""
from __future__ import annotations

import math
import os
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .rows import argmax


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40            # 0: off
    top_p: float = 0.95        # 1.0: off
    min_p: float = 0.05        # 0.0: off
    repeat_penalty: float = 1.0  # 1.0: off
    repeat_last_n: int = 64    # tokens the penalties look back over
    seed: int = -1             # -1: a random seed, reported by Sampler.seed
    frequency_penalty: float = 0.0  # subtracted once per occurrence in the last repeat_last_n tokens
    presence_penalty: float = 0.0   # subtracted once if the token occurs there at all

    def check(self, flag_names: bool = True) -> "SamplingParams":
        """Refuses values out of range, naming them as the command line (--top-p) or the Python
        and HTTP APIs (top_p) call them."""
        def name(field: str) -> str:
            return "--" + {"temperature": "temp"}.get(field, field).replace("_", "-") if flag_names else field

        for field in ("temperature", "top_p", "min_p", "repeat_penalty", "frequency_penalty", "presence_penalty"):
            if not math.isfinite(getattr(self, field)):
                raise InputError(f"{name(field)} must be a finite number, got {getattr(self, field)}")
        if not 0.0 < self.top_p <= 1.0:
            raise InputError(f"{name('top_p')} must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise InputError(f"{name('min_p')} must be in [0, 1], got {self.min_p}")
        if self.top_k < 0:
            raise InputError(f"{name('top_k')} must be >= 0 (0 = off), got {self.top_k}")
        if self.repeat_penalty <= 0:
            raise InputError(f"{name('repeat_penalty')} must be > 0 (1.0 = off), got {self.repeat_penalty}")
        if self.repeat_last_n < 0:
            raise InputError(f"{name('repeat_last_n')} must be >= 0, got {self.repeat_last_n}")
        if self.seed < -1 or self.seed >= 2 ** 64:
            raise InputError(f"{name('seed')} must be -1 (random) or in [0, 2^64), got {self.seed}")
        return self


class Sampler:
    """Chooses tokens with one set of parameters. rng: a generator to draw from (one shared across
    calls continues its sequence); without it, one seeded with params.seed (or a random seed)."""

    def __init__(self, params: SamplingParams = SamplingParams(), rng: np.random.Generator | None = None):
        self.params = params.check()
        if rng is None:
            self.seed = params.seed if params.seed >= 0 else int.from_bytes(os.urandom(4), "little")
            self.rng = np.random.default_rng(self.seed)
        else:
            self.seed, self.rng = params.seed, rng
        self.recent: deque[int] = deque(maxlen=params.repeat_last_n or None)
        if params.repeat_last_n == 0:
            self.recent = deque(maxlen=0)

    def accept(self, tokens) -> None:
        """Tokens the penalties remember: the prompt's, then each one chosen."""
        self.recent.extend(int(t) for t in tokens)

    def __call__(self, logits: np.ndarray) -> int:
        with np.errstate(over="ignore"):  # a penalty or a temperature far from 1 may overflow: handled here
            token = self._choose(logits)
        self.accept([token])
        return token

    def _choose(self, logits: np.ndarray) -> int:
        p = self.params
        if p.temperature <= 0 and not self._penalized():
            # float64 holds every float32 exactly, so the order and the first of equal maxima are
            # the same: greedy needs no converted copy (two 1.2 MB copies a token at 151,936 logits)
            return argmax(logits)
        x = np.array(logits, dtype=np.float64)
        if p.repeat_penalty != 1.0 and self.recent:
            seen = np.fromiter(set(self.recent), dtype=np.int64)
            seen = seen[seen < x.size]
            x[seen] = np.where(x[seen] > 0, x[seen] / p.repeat_penalty, x[seen] * p.repeat_penalty)
            # a logit overflowed to infinity (repeat_penalty near 0 or huge) is the largest float instead:
            # the order is kept, and the softmax does not meet inf - inf
            np.clip(x, -_LARGEST, _LARGEST, out=x)
        if (p.frequency_penalty or p.presence_penalty) and self.recent:
            ids, counts = np.unique(np.fromiter(self.recent, dtype=np.int64), return_counts=True)
            keep = ids < x.size
            x[ids[keep]] -= counts[keep] * p.frequency_penalty + p.presence_penalty
        if p.temperature <= 0:
            return int(np.argmax(x))
        return self._draw(x)

    def _penalized(self) -> bool:
        """Whether a penalty changes the logits of the next choice."""
        p = self.params
        return bool(self.recent) and (p.repeat_penalty != 1.0 or bool(p.frequency_penalty or p.presence_penalty))

    def _draw(self, x: np.ndarray) -> int:
        p = self.params
        ids = np.argsort(-x, kind="stable")  # candidates, most likely first
        if p.top_k > 0:
            ids = ids[:p.top_k]
        probs = _softmax(x[ids])
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1  # the smallest set reaching top_p
            ids, probs = ids[:keep], probs[:keep]
        if p.min_p > 0.0:
            keep = probs >= p.min_p * probs[0]
            ids = ids[keep]
        scaled = x[ids] / p.temperature
        if not np.isfinite(scaled[0]):  # so small a temperature that the largest logit overflows: greedy
            return int(ids[0])
        return int(ids[self.rng.choice(len(ids), p=_softmax(scaled))])


_LARGEST = np.finfo(np.float64).max


def _softmax(v: np.ndarray) -> np.ndarray:
    e = np.exp(v - v.max())
    return e / e.sum()
