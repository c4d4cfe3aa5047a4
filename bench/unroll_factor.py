"""Which unroll-and-jam factor the recipe should prefer: the real model compiled with the recipe
preferring 4, 8 or 16, alternating in one process, two threads, a 64-token prefill and 16 decode
steps per round. Each variant is built in its own cache directory; all share one packed weights
file.

    python -m bench.unroll_factor [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import tempfile

from bench.common import THREADS, append, pin_threads, summary, timed_session

pin_threads()


def recipe_preferring(first: int):
    from nanocompile import schedule as S

    factors = [f for f in (16, 8, 4, 2) if f <= first]

    def recipe(k):
        chosen = S.default_schedule(k)
        if chosen and isinstance(chosen[0], S.UnrollJam):
            var = chosen[0].loop
            for f in factors:
                try:
                    S._check_unroll_jam(k, S.UnrollJam(var, f))
                    return (S.UnrollJam(var, f), S.Parallel(var))
                except S.ScheduleError:
                    continue
        return chosen

    return recipe


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from nanocompile import compiler
    from nanocompile.library import CompiledSession
    from nanocompile.models import cache, load_model

    model = load_model("default", progress=False)
    packed = next((cache.cache_dir() / "packed").glob(f"{model.key}-*.bin"), None)
    sessions = {}
    original = compiler.default_schedule
    home = os.environ.get("NANOCOMPILE_CACHE")
    try:
        for first in (4, 8, 16):
            compiler.default_schedule = recipe_preferring(first)
            os.environ["NANOCOMPILE_CACHE"] = tempfile.mkdtemp(prefix=f"nc-unroll{first}-")
            sessions[first] = CompiledSession(model.config, model.weights, 128, THREADS, packed_path=packed)
    finally:
        compiler.default_schedule = original
        if home is None:
            os.environ.pop("NANOCOMPILE_CACHE", None)
        else:
            os.environ["NANOCOMPILE_CACHE"] = home
    prompt = list(range(1000, 1064))
    prefill = {f: [] for f in sessions}
    decode = {f: [] for f in sessions}
    for r in range(args.rounds):
        for f in (list(sessions) if r % 2 == 0 else list(reversed(list(sessions)))):
            p, steps = timed_session(sessions[f], prompt, 16)
            prefill[f].append(p)
            decode[f].extend(steps)
    results = {}
    for f in sessions:
        p, d = summary(prefill[f]), summary(decode[f])
        results[str(f)] = {"prefill64_s": p, "decode_step_s": d}
        print(f"prefer {f:2}: prefill64 median {p['median'] * 1e3:7.1f} ms | decode step median "
              f"{d['median'] * 1e3:6.1f} ms (min {d['min'] * 1e3:6.1f}, max {d['max'] * 1e3:6.1f})")
    append({"bench": "unroll_factor", "rounds": args.rounds, "results": results})


if __name__ == "__main__":
    main()
