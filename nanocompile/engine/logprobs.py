"""Log-probabilities of the tokens chosen: for each row of logits the generation loop hands the
sampler, the log-softmax of that row (the model's distribution, before penalties, temperature and
truncation, as OpenAI and llama.cpp's server report it), the chosen token's value and the most
likely tokens'. Computed in float64 from the float32 row, so the numbers follow from the logits
alone."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import InputError
from ..results import TokenLogprob

MAX_TOP = 20  # alternatives per token, OpenAI's bound for top_logprobs


def log_softmax(row: np.ndarray) -> np.ndarray:
    x = np.asarray(row, dtype=np.float64)
    shifted = x - x.max()
    return shifted - np.log(np.exp(shifted).sum())


def most_likely(logprobs: np.ndarray, k: int) -> tuple[tuple[int, float], ...]:
    """The k largest (finite ones), largest first; equal values in the order of their ids."""
    if k <= 0:
        return ()
    candidates = np.argpartition(-logprobs, k - 1)[:k] if k < logprobs.size else np.arange(logprobs.size)
    order = sorted(candidates.tolist(), key=lambda t: (-logprobs[t], t))
    # a grammar's mask leaves fewer than k possible: the impossible ones are not alternatives
    return tuple((t, float(logprobs[t])) for t in order if np.isfinite(logprobs[t]))


def check_top(top: int, field: str) -> int:
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP:
        raise InputError(f"{field} must be an integer from 0 to {MAX_TOP}, got {top!r}")
    return top


class Scored:
    """A token chooser that also scores what it chooses: choose(row) as before, and for each
    token a TokenLogprob with the top most likely tokens beside it. take() hands over the records
    made since the last take, in the order the tokens were chosen."""

    def __init__(self, choose: Callable[[np.ndarray], int], top: int):
        self.choose, self.top = choose, top
        self.records: list[TokenLogprob] = []

    def __call__(self, row: np.ndarray) -> int:
        token = self.choose(row)
        logprobs = log_softmax(row)
        self.records.append(TokenLogprob(token, float(logprobs[token]), most_likely(logprobs, self.top)))
        return token

    def take(self) -> list[TokenLogprob]:
        out, self.records = self.records, []
        return out
