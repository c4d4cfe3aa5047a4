"""Several generations on one compiled library at once, their steps run together.

A Batcher holds n sequences of one CompiledSession (its library's slots, each with its own KV
cache). Each sequence is used by a thread of its own exactly as a session is used alone (the one
generation loop, engine/stream.py, with its sampling, stops, grammars and prompt-lookup drafts):
only its step() differs. A step waits for a scheduler thread, which each round runs every step
waiting, of every sequence, as one batched step (CompiledSession.step_batch: one pass over the
weights for all of them), after waiting up to `gather` seconds for the generating sequences that
have not asked yet: decoding steps (one row), verify steps (every row's logits) and chunks of a
newcomer's prompt (its last row's logits only: the others never reach the head). Prompts are fed
`prompt_chunk` tokens at a time (the sequences' max_chunk), so a newcomer adds at most that many
rows to the others' steps, its prompt riding on passes over the weights they make anyway. A step
of more rows than one pass takes runs alone. Every sequence gets bitwise the logits its own
steps would give it (the batched step's guarantee), so every answer is the one it gets alone.

A sequence drafting by prompt lookup (engine/lookup.py) offers its draft with each drafted
token's chance of being kept; the round decides how many rows each draft gets (lookup.spend: the
likeliest drafted tokens of all the sequences first, while the step's expected tokens in all per
second rise), by the costs of the batched steps timed so far. So one client's steps verify long
drafts and many clients' steps give each sequence one row, whichever the measured costs favour.

Calls into the library (a step, truncate, reading the cache) hold one lock: the library runs one
call at a time, and its selected slot is part of every call.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from .lookup import Acceptance, StepCosts, spend

GATHER_SECONDS = 0.004  # how long a round waits for the generating sequences that have not asked yet
PROMPT_CHUNK = 32  # prompt tokens a sequence feeds a round


@dataclass
class _Request:
    ids: list[int]
    all_logits: bool
    batched: bool  # a step of the batch; else one of more rows than a pass takes, run alone
    chances: list[float] | None = None  # ids[1:] are a draft offered, each token's chance of being kept
    done: threading.Event = field(default_factory=threading.Event)
    result: np.ndarray | None = None
    error: BaseException | None = None


@dataclass
class BatchStats:
    batched_steps: int = 0   # rounds that ran steps together
    batched_rows: int = 0    # their rows
    sequences: int = 0       # the sequences' steps in them
    alone: int = 0           # steps of more rows than a pass takes, run alone
    step_seconds: float = 0.0     # in the batched steps
    between_seconds: float = 0.0  # from a batched step's end to the next one's start, while sequences generate

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class Batcher:
    def __init__(self, session, n: int, gather: float = GATHER_SECONDS, prompt_chunk: int = PROMPT_CHUNK):
        if not hasattr(session, "step_batch"):
            raise InputError(f"batched decoding needs the compiled backend, not {getattr(session, 'backend_name', '?')}")
        self.session = session
        self._mark = getattr(session, "mark_first_max", None)
        self.gather = gather
        self.prompt_chunk = max(1, min(prompt_chunk, session.max_chunk))
        self.lock = threading.RLock()  # every library call
        self.sequences = [BatchedSequence(self, s) for s in session.sequences(n)]
        self.stats = BatchStats()
        self.step_log: list | None = None  # a probe's: (rows, rows reaching the head, seconds, sequences) per batched step
        self.costs = StepCosts()  # batched steps' times by their rows in all: the drafts' rows are spent by them
        self.acceptance = Acceptance()  # the sequences' drafts, pooled: each new one's starts from it
        self._cond = threading.Condition()
        self._waiting: dict[BatchedSequence, _Request] = {}
        self._generating: set[BatchedSequence] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="nanocompile-batcher", daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    # called by the sequences' threads ------------------------------------------------------------
    def _ask(self, seq: "BatchedSequence", request: _Request) -> np.ndarray:
        with self._cond:
            if self._closed:
                raise InputError("the batcher is closed")
            self._waiting[seq] = request
            self._cond.notify_all()
        request.done.wait()
        if request.error is not None:
            raise request.error
        return request.result

    @contextmanager
    def generating(self, seq: "BatchedSequence"):
        """While a sequence generates, a round of decoding steps waits (up to `gather`) for it."""
        with self._cond:
            self._generating.add(seq)
        try:
            yield seq
        finally:
            with self._cond:
                self._generating.discard(seq)
                self._cond.notify_all()

    # the scheduler -------------------------------------------------------------------------------
    def _take(self) -> list[tuple["BatchedSequence", _Request]] | None:
        """The next round's requests (called holding _cond): as many of the steps waiting, in
        order of asking, as one pass takes (an offered draft's rows left to spend()), drafts
        trimmed to what the round spends on them; or one step of more rows, alone; None when
        closed."""
        while not self._waiting:
            if self._closed:
                return None
            self._cond.wait()
        deadline = time.monotonic() + self.gather
        while not self._closed and not self._generating <= self._waiting.keys():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._cond.wait(left)
        waiting = list(self._waiting.items())
        if not waiting[0][1].batched:
            taken = waiting[:1]
        else:
            taken, rows = [], 0
            for s, r in waiting:
                own = 1 if r.chances else len(r.ids)
                if r.batched and rows + own <= self.session.max_chunk:
                    taken.append((s, r))
                    rows += own
            self._spend([r for _, r in taken], rows)
        for s, _ in taken:
            del self._waiting[s]
        return taken

    def _spend(self, requests: list[_Request], rows: int) -> None:
        """Trims each offered draft to the rows the step spends on it (a draft given none is a
        plain decoding step). Tokens: a row reaching the head yields one (a prompt chunk's rows
        yield none; its last row, the first token, is counted as one)."""
        offered = [r for r in requests if r.chances]
        if not offered:
            return
        tokens = sum(1 for r in requests if r.chances or r.all_logits or len(r.ids) == 1)
        for r, k in zip(offered, spend(self.costs, rows, tokens, [r.chances for r in offered], self.session.max_chunk)):
            r.ids, r.all_logits = r.ids[:1 + k], k > 0

    def _loop(self) -> None:
        ended = None  # when the latest batched step ended, if sequences were generating then
        while True:
            with self._cond:
                taken = self._take()
            if taken is None:
                return
            try:
                with self.lock:
                    if taken[0][1].batched:
                        t0 = time.perf_counter()
                        rows = self.session.step_batch([(s.session, r.ids, r.all_logits) for s, r in taken])
                        if self._mark is not None:  # each row's largest logit found on the library's threads
                            rows = self._mark(rows)
                        t1 = time.perf_counter()
                        if all(r.all_logits or len(r.ids) == 1 for _, r in taken):  # every row reaches the head
                            self.costs.timed(sum(len(r.ids) for _, r in taken), t1 - t0)
                        self.stats.step_seconds += t1 - t0
                        if ended is not None:
                            self.stats.between_seconds += t0 - ended
                        ended = t1 if self._generating else None
                        self.stats.batched_steps += 1
                        self.stats.batched_rows += sum(len(r.ids) for _, r in taken)
                        self.stats.sequences += len(taken)
                        if self.step_log is not None:
                            self.step_log.append((sum(len(r.ids) for _, r in taken),
                                                  sum(len(r.ids) if r.all_logits else 1 for _, r in taken),
                                                  t1 - t0, len(taken)))
                        for (_, r), out in zip(taken, rows):
                            r.result = out
                    else:
                        (s, r), = taken
                        r.result = s.session.step(r.ids, all_logits=r.all_logits)
                        self.stats.alone += 1
                        ended = None
            except BaseException as e:  # each asker raises it: a bad step fails its requests only
                for _, r in taken:
                    r.error = e
            for _, r in taken:
                r.done.set()


class BatchedSequence:
    """One sequence of a Batcher: the session interface (step, truncate, reset, past, tokens,
    read_cache, and what describes the model), its steps run by the batcher."""

    def __init__(self, batcher: Batcher, session):
        self.batcher, self.session = batcher, session
        self.slot = session.slot
        # the positions held, kept here: only this sequence's own calls change them, and asking the
        # library would wait for the lock a batched step of the others holds
        self._past = session.past

    def __getattr__(self, name):  # config, n_ctx, vocab, max_chunk, precision, rows_exact, backend_name, ...
        return getattr(self.session, name)

    def generating(self):
        return self.batcher.generating(self)

    @property
    def max_chunk(self) -> int:
        """The most tokens the generation loop feeds a step of a prompt: the batcher's prompt chunk."""
        return self.batcher.prompt_chunk

    def step(self, tokens, all_logits: bool = False, chances=None) -> np.ndarray:
        """As a session's step; chances: tokens[1:] are a draft offered, each token's chance of
        being kept, and the step verifies as many of them as the batcher spends rows on: the
        logits of those rows (every row's), or the first token's alone where it spends none."""
        ids = [int(t) for t in np.asarray(tokens).reshape(-1)]
        batched = len(ids) <= self.session.max_chunk  # more rows than a pass: the library's chunks, alone
        if chances is not None and len(chances) != len(ids) - 1:
            raise InputError(f"a draft of {len(ids) - 1} tokens was offered with {len(chances)} chances")
        request = _Request(ids, all_logits, batched, list(chances) if chances and batched else None)
        out = self.batcher._ask(self, request)
        self._past += len(request.ids)
        return out

    @property
    def past(self) -> int:
        return self._past

    @property
    def step_costs(self) -> StepCosts:
        """The batched steps' times, by which the batcher spends rows on drafts (engine/lookup.py)."""
        return self.batcher.costs

    @property
    def draft_pool(self) -> Acceptance:
        """The acceptance of every sequence's drafts: a prompt-lookup generation on this sequence
        starts from it, adds to it, and offers its drafts for the batcher to spend rows on."""
        return self.batcher.acceptance

    @property
    def tokens(self) -> list[int]:
        return self.session._history[:self._past].tolist()

    def truncate(self, n_past: int) -> None:
        with self.batcher.lock:
            self.session.truncate(n_past)
        self._past = n_past

    def reset(self) -> None:
        with self.batcher.lock:
            self.session.reset()
        self._past = 0

    def read_cache(self, layer: int):
        with self.batcher.lock:
            return self.session.read_cache(layer)

    def set_threads(self, n: int) -> None:
        with self.batcher.lock:
            self.session.set_threads(n)

    def close(self) -> None:
        """The batcher's owner closes the library."""
