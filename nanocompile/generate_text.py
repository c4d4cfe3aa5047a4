"""Generation on a session, greedy or sampled, streaming token by token, with timings."""
from __future__ import annotations

import codecs
import time
from dataclasses import dataclass, field

import numpy as np

from .errors import ContextFullError, InputError


@dataclass
class GenerationResult:
    prompt_tokens: int
    tokens: list[int] = field(default_factory=list)
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0
    stop_reason: str = ""  # "eos", "length", "context"

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def decode_tps(self) -> float:
        # the first generated token comes from the prompt pass; the rest from decode steps
        steps = max(len(self.tokens) - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds else 0.0


def greedy(logits: np.ndarray) -> int:
    return int(np.argmax(logits))


def generate(session, prompt_ids: list[int], max_new: int, stop_ids=(), on_token=None,
             choose=greedy) -> GenerationResult:
    """Feeds the prompt, then generates up to max_new tokens (-1: until a stop token or the
    context is full). on_token(id) is called for each generated token as it is produced;
    choose(logits) picks it (greedy, or a sampling.Sampler)."""
    if len(prompt_ids) == 0:
        raise InputError("the prompt is empty")
    if session.past + len(prompt_ids) > session.n_ctx:
        raise ContextFullError(f"the prompt has {len(prompt_ids)} tokens, more than the context of "
                               f"{session.n_ctx - session.past} that is left (n_ctx = {session.n_ctx})")
    result = GenerationResult(prompt_tokens=len(prompt_ids))
    t0 = time.perf_counter()
    logits = session.step(prompt_ids)
    result.prompt_seconds = time.perf_counter() - t0
    limit = max_new if max_new >= 0 else float("inf")
    t0 = time.perf_counter()
    while len(result.tokens) < limit:
        token = choose(logits)
        result.tokens.append(token)
        if on_token:
            on_token(token)
        if token in stop_ids:
            result.stop_reason = "eos"
            break
        if len(result.tokens) >= limit:
            result.stop_reason = "length"
            break
        if session.past >= session.n_ctx:
            result.stop_reason = "context"
            break
        logits = session.step([token])
    else:
        result.stop_reason = "length"
    result.decode_seconds = time.perf_counter() - t0
    return result


class TextStream:
    """Turns token ids into text as they come, never splitting a UTF-8 character."""

    def __init__(self, tokenizer, write):
        self.tokenizer = tokenizer
        self.write = write
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, token: int) -> None:
        text = self.decoder.decode(self.tokenizer.token_bytes(token))
        if text:
            self.write(text)

    def flush(self) -> None:
        text = self.decoder.decode(b"", final=True)
        if text:
            self.write(text)
