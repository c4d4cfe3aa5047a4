"""Numbers from the run's records: each engine's samples over rounds, and every ratio between
nanocompile and its peer of the same precision with an exact sign test over the rounds."""
from __future__ import annotations

import statistics

from bench.support.measure import summary, two_sided_sign_test


def ratio_summary(ratios: list[float]) -> dict:
    """ratios: one per round, nanocompile's t/s over its peer's in the same round."""
    untied = [r for r in ratios if r != 1.0]
    wins = sum(r > 1 for r in untied)
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "wins": wins,
            "n": len(untied), "p": two_sided_sign_test(wins, len(untied)), "by_round": ratios}


def samples(speed: dict, engine: str, threads: int, test: str, field: str = "t_s") -> dict[int, float]:
    """{round: value} of one engine's test; speed: {(engine, threads, round): worker result}."""
    return {r: result["tests"][test][field] for (e, t, r), result in speed.items()
            if e == engine and t == threads and test in result["tests"]}


def engine_summary(speed: dict, engine: str, threads: int, test: str) -> dict | None:
    values = list(samples(speed, engine, threads, test).values())
    return summary(values) if values else None


def paired_ratios(speed: dict, ours: str, peer: str, threads: int, test: str) -> dict | None:
    a, b = samples(speed, ours, threads, test), samples(speed, peer, threads, test)
    rounds = sorted(set(a) & set(b))
    return ratio_summary([a[r] / b[r] for r in rounds]) if rounds else None
