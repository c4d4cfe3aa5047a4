"""Sessions that misbehave on purpose, wrapped around a real one: for the API's and the server's
handling of faults and of slow generation."""
from __future__ import annotations

import time

import numpy as np


class WrappedSession:
    """Passes everything to the session inside; subclasses change step()."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = 0  # step() calls so far

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def step(self, tokens, all_logits: bool = False):
        self.calls += 1
        return self.inner.step(tokens, all_logits)


class FaultySession(WrappedSession):
    """The step() call numbered `at` (from 1) returns logits with a NaN (or an infinity) in them,
    after running the step as usual: like a library whose arithmetic went wrong."""

    def __init__(self, inner, at: int, value: float = float("nan")):
        super().__init__(inner)
        self.at, self.value = at, value

    def step(self, tokens, all_logits: bool = False):
        logits = super().step(tokens, all_logits)
        if self.calls == self.at:
            logits = np.array(logits)
            logits[..., 7] = self.value
        return logits


class SlowSession(WrappedSession):
    """Every step takes at least `delay` seconds longer: a generation long enough to interrupt."""

    def __init__(self, inner, delay: float):
        super().__init__(inner)
        self.delay = delay

    def step(self, tokens, all_logits: bool = False):
        time.sleep(self.delay)
        return super().step(tokens, all_logits)


class EndlessSession(WrappedSession):
    """Never ends an answer by itself: the logits of `ids` (the model's end-of-text tokens) are
    put 100 below the row's smallest, so a sampled answer runs until its context is full or it is
    stopped (a random tiny model otherwise ends some answers after a token or two)."""

    def __init__(self, inner, ids):
        super().__init__(inner)
        self.ids = sorted(ids)

    def step(self, tokens, all_logits: bool = False):
        logits = np.array(super().step(tokens, all_logits))
        logits[..., self.ids] = logits.min(axis=-1, keepdims=True) - 100.0
        return logits
