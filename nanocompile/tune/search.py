"""The search over one kernel's candidates, fit for a shared, noisy machine.

Candidates are tried in order against the incumbent (at first the recipe's schedule). Each is
first checked bit for bit; one that fails is dropped and reported. Then candidate and incumbent
are measured in alternated pairs (incumbent first in even pairs, candidate first in odd ones, so
a drift in the machine's speed favours neither); after the first pair a candidate slower than
`screen` times the incumbent is screened out. A candidate replaces the incumbent only if it is
faster in enough pairs that a one-sided sign test rejects "no faster" at `alpha`.

Every decision is a function of the recorded check results and samples, and of when the budget
ran out (recorded as the number of candidates tried), so replay() repeats a search exactly from
its record, without measuring anything.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import comb
from typing import Callable, Protocol

PAIRS = 8       # alternated pairs per candidate: 7 of 8 wins is p = 0.035
ALPHA = 0.05
SCREEN = 1.25   # after one pair: slower than this many times the incumbent is out


def sign_test(wins: int, n: int) -> float:
    """One-sided exact sign test: P(at least `wins` of n by chance)."""
    return sum(comb(n, k) for k in range(wins, n + 1)) / 2 ** n


class Measure(Protocol):
    def check(self, which: int) -> str | None: ...          # None: bitwise equal; else what differs
    def sample(self, which: int) -> dict[str, float]: ...   # seconds per run at each shape


@dataclass
class Trial:
    candidate: int
    outcome: str = ""          # dropped, screened, lost, won
    error: str | None = None   # why it was dropped
    pairs: list = field(default_factory=list)   # [incumbent sample, candidate sample] in measured order
    incumbent: int = 0
    wins: int = 0
    p: float = 1.0

    def as_dict(self) -> dict:
        return {"candidate": self.candidate, "incumbent": self.incumbent, "outcome": self.outcome,
                "error": self.error, "pairs": self.pairs, "wins": self.wins, "p": self.p}

    @staticmethod
    def from_dict(d: dict) -> "Trial":
        return Trial(d["candidate"], d["outcome"], d.get("error"), d["pairs"], d["incumbent"], d["wins"], d["p"])


@dataclass
class Result:
    winner: int
    trials: list[Trial]
    tried: int           # candidates taken up before the budget ran out (all: len(order))
    complete: bool       # False: the budget ran out before the last candidate


def search(order: list[int], start: int, measure: Measure, cost: Callable[[dict], float],
           out_of_time: Callable[[], bool], pairs: int = PAIRS, alpha: float = ALPHA,
           screen: float = SCREEN, trials: list | None = None) -> Result:
    """Tries the candidates in `order` against the incumbent, starting from `start`. trials: a
    list the trials are appended to as they are taken (what an interrupted search had measured)."""
    incumbent = start
    trials = [] if trials is None else trials
    for n, cand in enumerate(order):
        if out_of_time():
            return Result(incumbent, trials, n, False)
        trial = Trial(cand, incumbent=incumbent)
        trials.append(trial)
        trial.error = measure.check(cand)
        if trial.error is not None:
            trial.outcome = "dropped"
            continue
        for i in range(pairs):
            if i % 2 == 0:
                a = measure.sample(incumbent)
                b = measure.sample(cand)
            else:
                b = measure.sample(cand)
                a = measure.sample(incumbent)
            trial.pairs.append([a, b])
            if i == 0 and cost(b) > screen * cost(a):
                trial.outcome = "screened"
                break
        if trial.outcome:
            continue
        trial.wins = sum(cost(b) < cost(a) for a, b in trial.pairs)
        trial.p = sign_test(trial.wins, len(trial.pairs))
        trial.outcome = "won" if trial.p <= alpha else "lost"
        if trial.outcome == "won":
            incumbent = cand
    return Result(incumbent, trials, len(order), True)


class Recorded:
    """A Measure that serves a record's check results and samples in the order they were taken."""

    def __init__(self, trials: list[Trial]):
        self.checks = [t.error for t in trials]
        self.samples = []
        for t in trials:
            for i, (a, b) in enumerate(t.pairs):
                self.samples += [a, b] if i % 2 == 0 else [b, a]
        self.checks.reverse()
        self.samples.reverse()

    def check(self, which: int) -> str | None:
        return self.checks.pop()

    def sample(self, which: int) -> dict[str, float]:
        return self.samples.pop()


def replay(order: list[int], start: int, record: Result, cost: Callable[[dict], float], **kw) -> Result:
    """The search again, from a record's measurements and its budget's end alone."""
    measure = Recorded(record.trials)
    taken = iter(range(record.tried + 1))
    return search(order, start, measure, cost, lambda: next(taken) >= record.tried and not record.complete, **kw)
