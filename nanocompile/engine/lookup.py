"""Prompt-lookup drafting (no draft model): the next tokens are guessed by finding the context's
last few tokens earlier in the context and copying what followed them there. The generation loop
(engine/stream.py) feeds the last chosen token and the draft in one step, keeps the longest
prefix of the draft that the model itself chooses, and rolls the cache back past the rest.

What is drafted never changes what is generated: each kept token is the one the sampler chose
from the model's logits at its position, and those logits are bitwise the same whether a row
came in a step of one or of many (the compiled library computes every row in the same order).
So greedy output is plain greedy output, token for token. With temperature > 0 the sampler draws
from the model's distribution and a drafted token is kept when the draw equals it: it is kept
with the model's probability of it, and on rejection the token that comes instead is a draw
from the distribution without the drafted token, which is the acceptance rule that keeps the
model's distribution (for a draft that puts all its mass on one token).

How many tokens to draft: a verify step of k drafted tokens yields 1 + (tokens accepted) and
costs what a step of k + 1 rows costs. DraftLength estimates the acceptance of each drafted
token (per length of the n-gram that matched, decaying, so a region that stops repeating is
noticed within a few steps) and StepCosts each row count's cost (the fastest step seen with that
many rows, every row reaching the head; between counts seen, the line; past them, the cheapest
cost per extra row seen; a prior before any). spend() picks the drafted rows that maximise
expected tokens per second; zero where nothing matches or no draft is worth its cost.

Where several sequences' steps run together (engine/batcher.py) the decision is the step's, not a
sequence's: each sequence offers its draft with each token's chance of being kept, and the
batcher spends rows on the likeliest drafted tokens of all of them while the step's expected
tokens in all per second rise, so at one client the rows go to drafts and with many they go to
one token for each sequence. A sequence's acceptance starts from the batch's (pooled per n-gram
length) rather than the prior, so a server whose answers do not repeat their prompts stops
offering drafts to each newcomer that would take its own many steps to learn it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ..errors import InputError
from ..target import split_target

# a step of k rows costs about 1 + PRIOR_ROW_COST * (k - 1) steps of one, until measured
PRIOR_ROW_COST = 0.15
# prior acceptance, as (accepted, rejected) counts, for a match of 1, 2 and 3 or more tokens
PRIOR_COUNTS = {1: (1.0, 3.0), 2: (1.0, 2.0), 3: (1.5, 1.0)}
DECAY = 0.85  # each verify step's weight against the earlier ones
OFFER_FLOOR = 0.01  # a drafted token less likely to be kept than this is not offered: it never pays its row


def on_by_default(march: str | None) -> bool:
    """Whether the server drafts unless told not to, for a library built for `march`: where its
    products run 16 lanes with VNNI, a verify step of 8 rows costs at most about 1.6x a step of
    one (issue 27, point 1), so a rejected draft costs little and free text decodes as fast as
    without (0.97-1.00x batched, docs/LOOKUP.md). At 8 lanes a verify step's rows are bound by
    their arithmetic (2.7x one row at 8 rows) and drafting stays opt-in."""
    if not march:
        return False
    level, vnni = split_target(march)
    return level == "x86-64-v4" and vnni


@dataclass(frozen=True)
class LookupParams:
    """draft_max: the most tokens one step verifies besides the last chosen one (llama.cpp's
    --draft-max); ngram_min..ngram_max: the lengths of the context's last tokens looked up,
    longest first (llama.cpp's lookup uses 1..4)."""
    draft_max: int = 16
    ngram_min: int = 1
    ngram_max: int = 4

    def check(self, flag_names: bool = True) -> "LookupParams":
        def name(field: str) -> str:
            return "--" + field.replace("_", "-") if flag_names else field

        for field in ("draft_max", "ngram_min", "ngram_max"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name(field)} must be a whole number of at least 1, got {value!r}")
        if self.ngram_min > self.ngram_max:
            raise InputError(f"{name('ngram_min')} ({self.ngram_min}) must not exceed "
                             f"{name('ngram_max')} ({self.ngram_max})")
        return self


class NgramIndex:
    """The context's tokens and, per n-gram length, where each n-gram's latest occurrence was
    followed: appending a token is O(ngram_max), drafting is one dictionary lookup per length."""

    def __init__(self, tokens, ngram_min: int = 1, ngram_max: int = 4):
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self.tokens: list[int] = []
        self.follows: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(ngram_min, ngram_max + 1)}
        self.extend(tokens)

    def extend(self, tokens) -> None:
        for t in tokens:
            self.append(int(t))

    def append(self, token: int) -> None:
        # the n-grams ending just before this token are now followed by it
        i = len(self.tokens)
        for n, follows in self.follows.items():
            if i >= n:
                follows[tuple(self.tokens[i - n:i])] = i
        self.tokens.append(token)

    def draft(self, limit: int) -> tuple[list[int], int]:
        """Up to limit tokens that followed the latest earlier occurrence of the longest matching
        n-gram of the context's last tokens, and that n-gram's length (0: nothing matches)."""
        end = len(self.tokens)
        for n in range(min(self.ngram_max, end), self.ngram_min - 1, -1):
            at = self.follows[n].get(tuple(self.tokens[end - n:]))
            if at is not None:
                return self.tokens[at:at + limit], n
        return [], 0


class StepCosts:
    """The fastest step seen per number of rows, each row reaching the head (a prompt chunk's rows
    do not, and would make rows look cheaper than a draft's): a generation's own, or, where
    several generations' steps run together (engine/batcher.py), one table for all of them, timed
    by the batcher with each step's rows in all."""

    def __init__(self):
        self.fastest: dict[int, float] = {}  # rows -> seconds

    def timed(self, rows: int, seconds: float) -> None:
        if seconds < self.fastest.get(rows, float("inf")):
            self.fastest[rows] = seconds

    def seconds(self, rows: int) -> float:
        """A step of rows: as seen; between two counts seen, on the line between them; past the
        largest, at the cheapest cost per extra row seen (so a CPU whose extra rows cost more than
        the prior says is not made to try every draft length to find out, and one where larger
        steps are cheaper per row than small ones still tries them); the prior where too little
        is seen."""
        if rows in self.fastest:
            return self.fastest[rows]
        if not self.fastest:
            return 1.0 + PRIOR_ROW_COST * (rows - 1)
        seen = sorted(self.fastest)
        least, most = seen[0], seen[-1]
        if rows < least:  # fewer rows than any step seen (a batch's steps may all be large): the prior's shape
            return self.fastest[least] * (1.0 + PRIOR_ROW_COST * (rows - 1)) / (1.0 + PRIOR_ROW_COST * (least - 1))
        if rows < most:
            below = max(r for r in seen if r < rows)
            above = min(r for r in seen if r > rows)
            t0, t1 = self.fastest[below], self.fastest[above]
            return t0 + (t1 - t0) * (rows - below) / (above - below)
        per_row = (min(max(self.fastest[r] - self.fastest[least], 0.0) / (r - least) for r in seen[1:]) if most > least
                   else PRIOR_ROW_COST * self.fastest[least])
        return self.fastest[most] + per_row * (rows - most)

    def cost(self, rows: int) -> float:
        """A step of rows against a step of one."""
        if rows <= 1:
            return 1.0
        return max(self.seconds(rows) / self.seconds(1), 1.0)


def spend(costs: StepCosts, rows: int, tokens: float, offers: list[list[float]], max_rows: int) -> list[int]:
    """How many of each offer's drafted tokens one step verifies. rows, tokens: the step's rows
    without any draft and the tokens they yield (each verifying sequence's own row counts: one
    row, one token); offers: per verifying sequence, each drafted token's chance of being kept
    (cumulative, so not increasing along a draft); max_rows: the most one step takes. Rows go to
    the likeliest drafted tokens first, and the number of them is the one that maximises the
    step's expected tokens per second."""
    def seconds(n: int) -> float:
        return max(costs.seconds(n), 1e-9)  # a clock too coarse for a step must not divide by zero

    order = sorted(((p, i) for i, chances in enumerate(offers) for p in chances), key=lambda o: -o[0])
    best, best_rate, expected = 0, tokens / seconds(rows), float(tokens)
    for extra, (p, _) in enumerate(order, 1):
        if rows + extra > max_rows:
            break
        expected += p
        rate = expected / seconds(rows + extra)
        if rate > best_rate:
            best, best_rate = extra, rate
    taken = [0] * len(offers)
    for _, i in order[:best]:
        taken[i] += 1
    return taken


class Acceptance:
    """How often a drafted token is kept, per length of the n-gram that matched (1, 2, 3 or
    more): decayed counts of kept and rejected verify steps, from the prior or from another's."""

    def __init__(self, start: "Acceptance | None" = None):
        self.counts = {n: list(c) for n, c in PRIOR_COUNTS.items()}
        if start is not None:  # start's rates at the prior's weight: a few of its own steps outweigh them
            for n, (accepted, rejected) in start.counts.items():
                weight = sum(PRIOR_COUNTS[n])
                self.counts[n] = [weight * accepted / (accepted + rejected), weight * rejected / (accepted + rejected)]

    def rate(self, ngram: int) -> float:
        accepted, rejected = self.counts[min(ngram, 3)]
        return accepted / (accepted + rejected)

    def record(self, ngram: int, drafted: int, accepted: int) -> None:
        counts = self.counts[min(ngram, 3)]
        counts[0] = counts[0] * DECAY + accepted
        counts[1] = counts[1] * DECAY + (1 if accepted < drafted else 0)


class DraftLength:
    """Chooses how many tokens to draft from the acceptance seen so far and the step costs."""

    def __init__(self, draft_max: int, costs: StepCosts | None = None, pool: Acceptance | None = None):
        """pool: the acceptance of the sequences decoding beside this one: this one's starts from
        it, and what this one sees is added to it."""
        self.draft_max = draft_max
        self.pool = pool
        self.own = Acceptance(pool)
        self.costs = costs if costs is not None else StepCosts()

    def acceptance(self, ngram: int) -> float:
        return self.own.rate(ngram)

    def cost(self, rows: int) -> float:
        return self.costs.cost(rows)

    def chances(self, available: int, ngram: int) -> list[float]:
        """Each of the first available drafted tokens' chance of being kept (the drafts before it
        kept too), down to OFFER_FLOOR."""
        chances: list[float] = []
        if ngram == 0:
            return chances
        alpha, p = self.acceptance(ngram), 1.0
        for _ in range(min(available, self.draft_max)):
            p *= alpha
            if p < OFFER_FLOOR:
                break
            chances.append(p)
        return chances

    def choose(self, available: int, ngram: int) -> int:
        """Of the available drafted tokens, how many to verify in a step of this generation's
        own (0: a plain step)."""
        return spend(self.costs, 1, 1, [self.chances(available, ngram)], 1 + self.draft_max)[0]

    def record(self, ngram: int, drafted: int, accepted: int) -> None:
        self.own.record(ngram, drafted, accepted)
        if self.pool is not None:
            self.pool.record(ngram, drafted, accepted)

    def timed(self, rows: int, seconds: float) -> None:
        self.costs.timed(rows, seconds)


class Lookup:
    """One generation's drafting: the index over its context and the draft length's estimates."""

    def __init__(self, params: LookupParams, context, costs: StepCosts | None = None, pool: Acceptance | None = None):
        """costs: a table shared with the steps run beside this generation's (they time it); else
        this generation's own, timed by timed(). pool: the acceptance of the sequences decoding
        beside this one (engine/batcher.py), which then decides each step's drafted rows: offer()."""
        self.params = params
        self.shared_costs = costs is not None
        t0 = time.perf_counter()
        self.index = NgramIndex(context, params.ngram_min, params.ngram_max)
        self.seconds = time.perf_counter() - t0  # spent indexing and drafting: reported, to show it is small
        self.length = DraftLength(params.draft_max, costs, pool)
        self.ngram = 0  # the length of the match the pending draft came from

    def chosen(self, token: int) -> None:
        t0 = time.perf_counter()
        self.index.append(token)
        self.seconds += time.perf_counter() - t0

    def _match(self, room: int) -> list[int]:
        tokens, self.ngram = self.index.draft(min(room, self.params.draft_max)) if room > 0 else ([], 0)
        return tokens

    def draft(self, room: int) -> list[int]:
        """The tokens to verify with the next step of this generation's own, at most room."""
        t0 = time.perf_counter()
        tokens = self._match(room)
        tokens = tokens[:self.length.choose(len(tokens), self.ngram)]
        self.seconds += time.perf_counter() - t0
        return tokens

    def offer(self, room: int) -> tuple[list[int], list[float]]:
        """The tokens the next step may verify, at most room, and each one's chance of being kept:
        for a step whose rows are decided with other sequences' (spend())."""
        t0 = time.perf_counter()
        tokens = self._match(room)
        chances = self.length.chances(len(tokens), self.ngram)
        self.seconds += time.perf_counter() - t0
        return tokens[:len(chances)], chances

    def timed(self, rows: int, seconds: float) -> None:
        """A step of rows of this generation's took seconds (kept unless the costs are shared)."""
        if not self.shared_costs:
            self.length.timed(rows, seconds)
