"""The generation loop, the one every caller uses (the Python API, hence the command line and the
server): feed a prompt in chunks, then choose and feed one token at a time, with timings.

The prompt goes in chunks of the session's max_chunk tokens, so a long prompt can report progress
and be stopped between chunks; a prompt stopped that way (should_stop, or Ctrl-C) is taken back
out of the cache, leaving the session as it was. Decoding can be stopped between tokens; what was
generated stays cached. Logits that are not finite stop generation with an error naming the step,
and the session is returned to where it was before the prompt.
"""
from __future__ import annotations

import codecs
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from .errors import ContextFullError, InputError, NonFiniteLogitsError


@dataclass
class GenerationResult:
    prompt_tokens: int  # tokens fed for the prompt
    tokens: list[int] = field(default_factory=list)
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0
    stop_reason: str = ""  # "eos", "length", "context", "interrupted"

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


def check_finite(logits: np.ndarray, step: int, what: str) -> np.ndarray:
    if not np.isfinite(logits).all():
        nan = int(np.isnan(logits).sum())
        inf = int(np.isinf(logits).sum())
        raise NonFiniteLogitsError(f"the logits of step {step} ({what}) are not finite: {nan} NaN and {inf} "
                                   f"infinite of {logits.size}; generation stopped without choosing a token")
    return logits


def feed_prompt(session, ids: list[int], should_stop: Callable[[], bool] | None = None,
                on_chunk: Callable[[int], None] | None = None) -> np.ndarray | None:
    """Feeds ids after the cached tokens, max_chunk at a time; returns the last token's logits.
    If should_stop() is true before a chunk, or Ctrl-C arrives, the tokens fed so far are taken
    back out (the session is as it was) and None is returned (KeyboardInterrupt is re-raised)."""
    start_past = session.past
    chunk = max(int(getattr(session, "max_chunk", 0) or len(ids)), 1)
    logits = None
    try:
        for start in range(0, len(ids), chunk):
            if should_stop is not None and should_stop():
                session.truncate(start_past)
                return None
            logits = session.step(ids[start:start + chunk])
            if on_chunk is not None:
                on_chunk(len(ids[start:start + chunk]))
    except KeyboardInterrupt:
        session.truncate(min(start_past, session.past))
        raise
    return logits


def stream_tokens(session, prompt_ids: list[int], max_new: int, stop_ids=(), choose=greedy,
                  result: GenerationResult | None = None, should_stop: Callable[[], bool] | None = None,
                  on_chunk: Callable[[int], None] | None = None) -> Iterator[int]:
    """Feeds the prompt after the cached tokens, then yields up to max_new tokens (-1: until a
    stop token or a full context), each as soon as it is chosen (greedy, or a sampling.Sampler).
    The last token is chosen but not fed. result (if given) receives the timings and why it
    stopped; should_stop() is asked between prompt chunks and between tokens."""
    if len(prompt_ids) == 0:
        raise InputError("the prompt is empty")
    if session.past + len(prompt_ids) > session.n_ctx:
        raise ContextFullError(f"the prompt has {len(prompt_ids)} tokens, more than the context of "
                               f"{session.n_ctx - session.past} that is left (n_ctx = {session.n_ctx})")
    result = result if result is not None else GenerationResult(prompt_tokens=len(prompt_ids))
    result.prompt_tokens = len(prompt_ids)
    start_past = session.past
    t0 = time.perf_counter()
    logits = feed_prompt(session, prompt_ids, should_stop, on_chunk)
    result.prompt_seconds = time.perf_counter() - t0
    if logits is None:  # stopped, and taken back out of the cache
        result.prompt_tokens = 0
        result.stop_reason = "interrupted"
        return
    limit = max_new if max_new >= 0 else float("inf")
    step = 1
    t0 = time.perf_counter()
    try:
        check_finite(logits, step, f"the prompt of {len(prompt_ids)} tokens")
        while len(result.tokens) < limit:
            token = choose(logits)
            result.tokens.append(token)
            yield token
            if token in stop_ids:
                result.stop_reason = "eos"
                break
            if len(result.tokens) >= limit:
                result.stop_reason = "length"
                break
            if session.past >= session.n_ctx:
                result.stop_reason = "context"
                break
            if should_stop is not None and should_stop():
                result.stop_reason = "interrupted"
                break
            logits = session.step([token])
            step += 1
            check_finite(logits, step, f"after generated token {len(result.tokens)}")
        else:
            result.stop_reason = "length"
    except NonFiniteLogitsError:
        session.truncate(start_past)
        raise
    finally:
        result.decode_seconds = time.perf_counter() - t0


def generate(session, prompt_ids: list[int], max_new: int, stop_ids=(), on_token=None,
             choose=greedy) -> GenerationResult:
    """stream_tokens to the end: on_token(id) is called for each token as it is chosen."""
    result = GenerationResult(prompt_tokens=len(prompt_ids))
    for token in stream_tokens(session, prompt_ids, max_new, stop_ids, choose, result):
        if on_token:
            on_token(token)
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
