"""What the report measures, as data: the sizes of every test, the rounds, and the order of the
operations inside one engine process.

The depth sweep is one chain per process: pp512 from an empty cache, tg128 after it (depth
512), then the cache filled to 2048 and tg128, filled to 4096 and tg128; the worker checks the
depth each test starts at. Filling on from where the last test stopped costs 4096 prompt tokens
instead of the 6656 that separate runs from an empty cache would.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    pp: int = 512                                # llama-bench's pp512: a prompt into an empty cache
    tg: int = 128                                # tg128: tokens one at a time
    depths: tuple[int, ...] = (0, 512, 2048, 4096)  # tg128 after this many cached tokens
    prompts: tuple[int, ...] = (16, 64, 256, 1024)  # prompt lengths (pp512 joins them in the plots)
    threads: tuple[int, ...] = (2, 1)            # the first runs every test, the others pp and tg
    rounds: int = 3                              # at the first thread count
    rounds_other_threads: int = 2
    accuracy_chunks: int = 2                     # chunks of accuracy_ctx tokens, second halves scored
    accuracy_ctx: int = 512
    # the larger shapes (bench/report/shapes.py): 1.5B and 3B at pp256 and tg32, 3 rounds, about 8
    # minutes on two cores with their files made (7B by --shapes: its first run alone takes minutes)
    shapes: tuple[str, ...] = ("1.5B", "3B")
    shape_pp: int = 256
    shape_tg: int = 32
    shape_rounds: int = 3
    quick: bool = False                          # a tiny random model instead of the default one

    @property
    def main_threads(self) -> int:
        return self.threads[0]

    @property
    def n_ctx(self) -> int:
        return max(max(self.depths) + self.tg, self.pp + self.tg, max(self.prompts)) + 8

    def rounds_at(self, threads: int) -> int:
        return self.rounds if threads == self.main_threads else self.rounds_other_threads

    def key(self) -> str:
        """Equal plans resume each other's runs."""
        return hashlib.sha256(json.dumps(dataclasses.asdict(self), sort_keys=True).encode()).hexdigest()[:10]

    def differences(self, other: "Plan") -> dict:
        """{field: (ours, other's)} where this plan differs from other."""
        a, b = dataclasses.asdict(self), dataclasses.asdict(other)
        return {k: (a[k], b[k]) for k in a if a[k] != b[k] and k != "quick"}


FULL = Plan()
QUICK = Plan(pp=64, tg=8, depths=(0, 64, 96, 128), prompts=(8, 16, 32, 128), rounds=2, rounds_other_threads=1,
             accuracy_chunks=2, accuracy_ctx=64, shapes=("quick",), shape_pp=16, shape_tg=4, shape_rounds=1,
             quick=True)


def tg_name(n: int, depth: int) -> str:
    return f"tg{n}" if depth == 0 else f"tg{n} @ d{depth}"


def sequences(plan: Plan, threads: int) -> list[list[dict]]:
    """The operations of one engine process, as sequences each starting from an empty cache.
    Every operation: kind (pp: timed prompt, tg: timed single tokens, fill: prompt tokens that
    bring the cache to a depth), n tokens, the depth it must start at, and its test name."""
    if threads != plan.main_threads:
        return [[_op("tg", plan.tg, 0, tg_name(plan.tg, 0))], [_op("pp", plan.pp, 0, f"pp{plan.pp}")]]
    out = []
    if 0 in plan.depths:
        out.append([_op("tg", plan.tg, 0, tg_name(plan.tg, 0))])
    chain, at = [_op("pp", plan.pp, 0, f"pp{plan.pp}")], plan.pp
    for depth in sorted(d for d in plan.depths if d > 0):
        if depth < at:
            raise ValueError(f"depth {depth} cannot follow pp{plan.pp} and the tg{plan.tg} before it: the cache "
                             f"already holds {at} tokens")
        if depth > at:
            chain.append(_op("fill", depth - at, at, f"fill to {depth}"))
        chain.append(_op("tg", plan.tg, depth, tg_name(plan.tg, depth)))
        at = depth + plan.tg
    out.append(chain)
    out += [[_op("pp", n, 0, f"pp{n}")] for n in plan.prompts if n != plan.pp]
    return out


def _op(kind: str, n: int, start: int, name: str) -> dict:
    return {"kind": kind, "n": n, "start": start, "name": name}


def test_names(plan: Plan, threads: int) -> list[str]:
    return [op["name"] for seq in sequences(plan, threads) for op in seq if op["kind"] != "fill"]


def speed_jobs(plan: Plan, engine_ids: list[str]) -> list[tuple[int, int, list[str]]]:
    """(round, threads, engines in the order they run): every round at every thread count it
    has, the engines rotated."""
    return [(r, t, rotated(engine_ids, r)) for r in range(max(plan.rounds_at(t) for t in plan.threads))
            for t in plan.threads if r < plan.rounds_at(t)]


def rotated(items: list, r: int) -> list:
    """Round r starts with item r: no engine always runs first (or right after another)."""
    k = r % len(items) if items else 0
    return items[k:] + items[:k]
