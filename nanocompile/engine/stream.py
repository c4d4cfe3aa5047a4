"""The generation loop, the one every caller uses (the Python API, hence the command line and the
server): feed a prompt in chunks, then choose and feed one token at a time; decode the text as it
comes, end at a stop token, a stop sequence, the token limit, a full context or when asked to
stop, and time the prompt and the decode.

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
from typing import Callable, Iterator, Sequence

import numpy as np

from ..errors import ContextFullError, InputError, NonFiniteLogitsError
from ..results import Timings
from .lookup import Lookup, LookupParams
from .rows import argmax, known_first_max
from .stops import StopScanner


@dataclass
class GenerationResult:
    prompt_tokens: int   # tokens fed for the prompt
    cached_tokens: int = 0  # of the prompt, already in the cache and kept (reuse_cache)
    tokens: list[int] = field(default_factory=list)
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0
    stop_reason: str = ""  # "eos", "stop", "length", "context", "interrupted"
    drafted: int = 0         # prompt-lookup tokens verified (engine/lookup.py)
    accepted: int = 0        # of them, kept
    verify_steps: int = 0    # steps that verified a draft
    lookup_seconds: float = 0.0  # spent indexing the context and drafting
    mask_seconds: float = 0.0    # waiting for a grammar's masks (engine/constrain.py)

    @property
    def timings(self) -> Timings:
        return Timings(self.prompt_tokens, self.cached_tokens, self.prompt_seconds, len(self.tokens),
                       self.decode_seconds, self.drafted, self.accepted, self.verify_steps, self.lookup_seconds,
                       self.mask_seconds)

    @property
    def prompt_tps(self) -> float:
        return self.timings.prompt_tps

    @property
    def decode_tps(self) -> float:
        return self.timings.decode_tps


@dataclass
class Piece:
    """What the loop yields: per chosen token, the token and the text it releases (empty while a
    character or a possible stop sequence is incomplete); last, the rest of the text and the
    result (why it stopped, timings)."""
    text: str
    tokens: list[int]
    result: GenerationResult | None = None


def greedy(logits: np.ndarray) -> int:
    return argmax(logits)


def check_finite(logits: np.ndarray, step: int, what: str) -> np.ndarray:
    if known_first_max(logits) is not None:  # the library found the row finite as the step ended
        return logits
    if not np.isfinite(logits).all():
        nan = int(np.isnan(logits).sum())
        inf = int(np.isinf(logits).sum())
        raise NonFiniteLogitsError(f"the logits of step {step} ({what}) are not finite: {nan} NaN and {inf} "
                                   f"infinite of {logits.size}; generation stopped without choosing a token")
    return logits


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if differ.size else n


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


def stream(session, prompt_ids: list[int], max_new: int = -1, *, choose=greedy, stop_ids=(),
           stops: Sequence[str] = (), tokenizer=None, reuse_cache: bool = False,
           should_stop: Callable[[], bool] | None = None, on_prompt_chunk: Callable[[int], None] | None = None,
           result: GenerationResult | None = None, lookup: LookupParams | None = None) -> Iterator[Piece]:
    """Feeds the prompt, then yields a Piece per token chosen (greedy, or a sampling.Sampler), up
    to max_new (-1: until a stop token or a full context), then a last Piece with the result.
    reuse_cache: the prompt is the whole context; the longest start of it the cache already holds
    is kept (at least one token is fed, for its logits) and the rest of the cache dropped;
    otherwise it follows the cached tokens. tokenizer: decode text (stop tokens are not written);
    stops: strings that end the text, left out of it. The last token is chosen but not fed.
    should_stop() is asked between prompt chunks and between tokens. result: filled as it goes
    (so a caller that stops iterating early still has the timings), else a new one. lookup:
    draft tokens from the context and verify them in one step (engine/lookup.py); the tokens
    chosen are the same as without, and the cache ends the same."""
    prompt_ids = list(prompt_ids)
    if len(prompt_ids) == 0:
        raise InputError("the prompt is empty")
    if lookup is not None and not getattr(session, "rows_exact", False):
        raise InputError(f"prompt lookup needs a session whose rows do not depend on the step they come in (the "
                         f"compiled backend); this one is {getattr(session, 'backend_name', type(session).__name__)}")
    keep = 0
    if reuse_cache:
        keep = min(common_prefix(session.tokens, prompt_ids), len(prompt_ids) - 1)
        session.truncate(keep)
    new = prompt_ids[keep:]
    if session.past + len(new) > session.n_ctx:
        raise ContextFullError(f"the prompt has {len(new)} tokens, more than the context of "
                               f"{session.n_ctx - session.past} that is left (n_ctx = {session.n_ctx})")
    result = result if result is not None else GenerationResult(0)
    result.prompt_tokens, result.cached_tokens = len(new), keep
    pieces: list[str] = []
    decoder = TextStream(tokenizer, pieces.append) if tokenizer is not None else None
    scanner = StopScanner(list(stops))

    def released() -> str:
        text = scanner.push("".join(pieces))
        pieces.clear()
        return text

    start_past = session.past
    t0 = time.perf_counter()
    logits = feed_prompt(session, new, should_stop, on_prompt_chunk)
    result.prompt_seconds = time.perf_counter() - t0
    if logits is None:  # stopped, and taken back out of the cache
        result.prompt_tokens = 0
        result.stop_reason = "interrupted"
        yield Piece("", [], result)
        return
    limit = max_new if max_new >= 0 else float("inf")
    drafting = (Lookup(lookup, session.tokens, getattr(session, "step_costs", None), getattr(session, "draft_pool", None))
                if lookup is not None else None)
    # a sequence of a batch offers its draft and the batcher decides how much of it the step verifies
    offering = drafting is not None and drafting.length.pool is not None
    # rows[i]: the logits after the cache's first start + i tokens (a step's own row kept as it came,
    # so the library's mark on it stays: engine/rows.py)
    rows, drafts = (logits,), []
    start = session.past
    step = 1
    t0 = time.perf_counter()
    try:
        check_finite(logits, step, f"the prompt of {len(new)} tokens")
        while len(result.tokens) < limit:
            for i, row in enumerate(rows):
                if i:
                    check_finite(row, step, f"drafted token {i} of a verify step")
                token = choose(row)
                result.tokens.append(token)
                if drafting is not None:
                    drafting.chosen(token)
                if decoder and token not in stop_ids:
                    decoder(token)
                yield Piece(released(), [token])
                result.stop_reason = ("stop" if scanner.hit else "eos" if token in stop_ids
                                      else "length" if len(result.tokens) >= limit
                                      else "context" if start + i >= session.n_ctx
                                      else "interrupted" if should_stop is not None and should_stop() else "")
                if result.stop_reason or i == len(drafts) or token != drafts[i]:
                    break
            if drafts:
                result.accepted += i
                drafting.length.record(drafting.ngram, len(drafts), i)
            if session.past > start + i:  # the rejected drafts, and the chosen token is never fed
                session.truncate(start + i)
            if result.stop_reason:
                break
            drafts, chances = [], []
            if drafting is not None:  # room: the context, the tokens still wanted, one pass's rows
                room = int(min(session.n_ctx - session.past, limit - len(result.tokens), session.max_chunk) - 1)
                drafts, chances = drafting.offer(room) if offering else (drafting.draft(room), [])
            s0 = time.perf_counter()
            if chances:  # the rows of as many drafted tokens as the step spent on them
                out = session.step([token] + drafts, all_logits=True, chances=chances)
                drafts = drafts[:len(out) - 1] if out.ndim == 2 else []
            else:
                out = session.step([token] + drafts, all_logits=bool(drafts))
            if drafting is not None:
                drafting.timed(len(drafts) + 1, time.perf_counter() - s0)
            rows = out if drafts else (out,)
            start = session.past - len(drafts)
            result.drafted += len(drafts)
            result.verify_steps += bool(drafts)
            step += 1
            check_finite(rows[0], step, f"after generated token {len(result.tokens)}")
        else:
            result.stop_reason = "length"
    except NonFiniteLogitsError:
        session.truncate(start_past)
        raise
    except KeyboardInterrupt:  # the cache keeps what was generated, as without drafts, not a draft
        fed = start_past + len(new) + len(result.tokens)
        if session.past > fed:
            session.truncate(fed)
        raise
    finally:
        result.decode_seconds = time.perf_counter() - t0
        if drafting is not None:
            result.lookup_seconds = drafting.seconds
    if decoder:
        decoder.flush()
    yield Piece(released() + scanner.flush(), [], result)


def generate(session, prompt_ids: list[int], max_new: int, stop_ids=(), on_token=None,
             choose=greedy) -> GenerationResult:
    """The loop to its end, after the cached tokens: on_token(id) is called for each token as it is
    chosen; returns the result."""
    for piece in stream(session, prompt_ids, max_new, choose=choose, stop_ids=stop_ids):
        for token in piece.tokens:
            if on_token:
                on_token(token)
        if piece.result is not None:
            return piece.result
    raise AssertionError("the generation loop ended without its result")
