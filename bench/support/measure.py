"""How the benchmarks measure: every engine on the same thread count (NumPy's BLAS too), the
machine described with every record (CPU model, its ISA flags, the level nanocompile builds for),
medians, minima and spreads (never the mean alone), exact sign tests, the one timer every engine
goes through, and bench/results.jsonl, where every run is appended."""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import statistics
import time
from pathlib import Path


RESULTS = Path(__file__).resolve().parents[1] / "results.jsonl"
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
            # the generation, where the name says only "AMD EPYC" (family 23: Zen/Zen 2, 25: Zen 3/4, 26: Zen 5)
            if line.startswith("cpu family"):
                info["cpu_family"] = int(line.split(":", 1)[1])
            if line.startswith("model") and line.split(":", 1)[0].strip() == "model":
                info["cpu_model"] = int(line.split(":", 1)[1])
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                info["isa"] = sorted(f for f in flags if f.startswith(("avx", "fma", "amx")))
                break
    except OSError:
        pass
    import numpy

    import nanocompile
    from nanocompile.target import detect_march

    info["numpy"] = numpy.__version__
    info["nanocompile"] = nanocompile.__file__
    info["march"] = detect_march()[0]  # the level nanocompile's libraries are built for here (NANOCOMPILE_MARCH)
    if importlib.util.find_spec("llama_cpp") is not None:  # the peer's build, where it is installed
        from bench.support.peer import llama_build
        info["llama_cpp"] = llama_build()
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


def positive_int(text: str) -> int:
    """An argparse type: a whole number, at least 1 (rounds, threads, sizes)."""
    import argparse

    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number, at least 1")
    return int(text)


def x86_level(text: str) -> str:
    """An argparse type: an x86-64 level the compiler knows (x86-64-v3, x86-64-v4+vnni, ...)."""
    import argparse

    from nanocompile.target import level_flags

    try:
        level_flags(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def append(record: dict, path: Path = RESULTS) -> None:
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "threads": THREADS, "machine": machine(), **record}
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def sign_test(wins: int, n: int) -> float:
    """P of at least `wins` wins in n coin tosses: the tuner's exact one-sided test (imported
    here, not at the top, so a peer's worker in an interpreter without nanocompile loads this)."""
    from nanocompile.tune.search import sign_test as exact

    return exact(wins, n)


def two_sided_sign_test(wins: int, n: int) -> float:
    """P of a split at least this uneven if each round were a coin toss (ties dropped before)."""
    if n == 0:
        return 1.0
    return min(1.0, 2 * min(sign_test(wins, n), sign_test(n - wins, n)))


def timed_run(engine, prompt: list[int], steps: int, tokens: list[int] | None = None,
              reset: bool = True) -> tuple[float, list[float]]:
    """The one timer: engine is anything with reset() and step(ids) -> the last id's logits (a
    nanocompile session, peer.LlamaCpp, oracle.Transformers). The prompt in one call, then `steps`
    calls of one token each: the given tokens, else greedy from the last logits. reset=False
    continues after what the engine has cached. Returns the prompt call's seconds and each step's."""
    import numpy as np

    if reset:
        engine.reset()
    t0 = time.perf_counter()
    logits = engine.step(list(prompt))
    prefill = time.perf_counter() - t0
    times = []
    for i in range(steps):
        token = int(tokens[i]) if tokens is not None else int(np.argmax(logits))
        s0 = time.perf_counter()
        logits = engine.step([token])
        times.append(time.perf_counter() - s0)
    return prefill, times
