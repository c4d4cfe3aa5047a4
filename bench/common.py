"""What every benchmark shares: thread settings, the machine's description, statistics, and
appending results to bench/results.jsonl."""
from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results.jsonl"
THREADS = 2
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NANOCOMPILE_THREADS")


def pin_threads(n: int = THREADS) -> None:
    """Every engine gets n threads: NumPy's BLAS and OpenMP read these at import."""
    for var in THREAD_VARS:
        os.environ[var] = str(n)


def machine() -> dict:
    info = {"python": platform.python_version(), "cores": os.cpu_count()}
    try:
        text = Path("/proc/cpuinfo").read_text()
        for line in text.splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                info["isa"] = sorted(f for f in flags if f.startswith(("avx", "fma", "amx")))
                break
    except OSError:
        pass
    import numpy

    import nanocompile
    info["numpy"] = numpy.__version__
    info["nanocompile"] = nanocompile.__file__
    try:
        from threadpoolctl import threadpool_info  # optional: what BLAS really uses
        info["blas"] = [{"api": p.get("internal_api"), "threads": p.get("num_threads")} for p in threadpool_info()]
    except ImportError:
        info["blas_threads_env"] = os.environ.get("OPENBLAS_NUM_THREADS")
    return info


def vector_peak(probe: dict) -> dict:
    """The probe's peak for the kernels' inner step at the widest vector it measured: AVX-512 if
    the CPU has it, else AVX2 (the probe reports null for what the CPU lacks); fused multiply-add
    where measured (the kernels use it on targets with FMA; older probes measured mul+add only)."""
    for key in ("avx512_fma_gflop_s", "avx512_mul_add_gflop_s", "avx2_fma_gflop_s"):
        if probe.get(key):
            return probe[key]
    return probe["avx2_mul_add_gflop_s"]


def summary(samples: list[float]) -> dict:
    """Median, minimum, maximum and the interquartile range; never the mean alone."""
    s = sorted(samples)
    q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0]] * 3
    return {"median": statistics.median(s), "min": s[0], "max": s[-1], "iqr": q[2] - q[0], "n": len(s)}


def append(record: dict, path: Path = RESULTS) -> None:
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "threads": THREADS, "machine": machine(), **record}
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def sign_test(wins: int, n: int) -> float:
    """One-sided exact sign test: P(at least `wins` of n by chance)."""
    from math import comb
    return sum(comb(n, k) for k in range(wins, n + 1)) / 2 ** n


def timed_session(session, prompt: list[int], steps: int) -> tuple[float, list[float]]:
    """A nanocompile session's (or anything with reset/step's) prefill time and greedy decode
    step times, from an empty cache."""
    import numpy as np

    session.reset()
    t0 = time.perf_counter()
    logits = session.step(prompt)
    prefill = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        s0 = time.perf_counter()
        logits = session.step([int(np.argmax(logits))])
        times.append(time.perf_counter() - s0)
    return prefill, times


def timed_transformers(model, prompt: list[int], steps: int) -> tuple[float, list[float]]:
    """The same for transformers' model, with its own KV cache."""
    import torch

    with torch.no_grad():
        t0 = time.perf_counter()
        out = model(torch.tensor([prompt]), use_cache=True, logits_to_keep=1)
        prefill = time.perf_counter() - t0
        cache, times = out.cache, []
        for _ in range(steps):
            s0 = time.perf_counter()
            out = model(torch.tensor([[int(out.logits[0, -1].argmax())]]), cache=cache, use_cache=True)
            cache = out.cache
            times.append(time.perf_counter() - s0)
    return prefill, times


def llama_runner(engine, prompt: list[int], steps: int):
    """A llama.cpp engine (bench/llamacpp.py) as a () -> (prefill seconds, step seconds) run."""
    def run():
        engine.reset()
        t0 = time.perf_counter()
        engine.prefill(prompt)
        prefill = time.perf_counter() - t0
        times = []
        for _ in range(steps):
            s0 = time.perf_counter()
            engine.decode(engine.argmax())
            times.append(time.perf_counter() - s0)
        return prefill, times
    return run


def alternate(engines: dict, rounds: int, pp: int, probed: str | None = None):
    """Runs each engine once per round, the order rotating from round to round; around the
    engine named `probed` the machine is probed just before and just after (its bandwidth
    drifts within a round). Returns (prefill t/s by engine, decode t/s by engine, per round: each
    engine's prefill t/s and median step seconds, and the bandwidth around `probed`; probes)."""
    import statistics

    from bench import probe

    prefill = {k: [] for k in engines}
    decode = {k: [] for k in engines}
    per_round, probes = [], []
    for r in range(rounds):
        names = list(engines)
        this = {}
        for name in names[r % len(names):] + names[:r % len(names)]:
            if name == probed:
                probes.append(probe.measure())
                before = probes[-1]["read_gb_s"]["median"]
            time.sleep(0.2)  # the last engine's threads spin for a while after its call
            p, steps = engines[name]()
            if name == probed:
                probes.append(probe.measure())
                this["read_gb_s"] = (before + probes[-1]["read_gb_s"]["median"]) / 2
            prefill[name].append(pp / p)
            decode[name].extend(1 / s for s in steps)
            this[name] = {"pp": pp / p, "step_s": statistics.median(steps)}
            print(f"  round {r} {name}: pp {pp / p:.1f} t/s, tg median {1 / statistics.median(steps):.2f} t/s",
                  flush=True)
        per_round.append(this)
    return prefill, decode, per_round, probes


def engine_table(engines, prefill: dict, decode: dict, pp: int, tg: int, threads: dict | None = None) -> dict:
    """llama-bench's table (t/s as mean ± sd, with median, min and max); returns the numbers."""
    import statistics

    results = {}
    print("\n| engine | threads | test | t/s (mean ± sd) | median | min | max |\n|---|---|---|---|---|---|---|")
    for name in engines:
        for test, samples in ((f"pp{pp}", prefill[name]), (f"tg{tg}", decode[name])):
            s = summary(samples)
            sd = statistics.stdev(samples) if len(samples) > 1 else 0.0
            results.setdefault(name, {})[test] = {**s, "mean": statistics.mean(samples), "sd": sd}
            print(f"| {name} | {(threads or {}).get(name, THREADS)} | {test} | {statistics.mean(samples):.2f} ± "
                  f"{sd:.2f} | {s['median']:.2f} | {s['min']:.2f} | {s['max']:.2f} |")
    return results
