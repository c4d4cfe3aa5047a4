"""The thread pool when a core is taken (issue 11, point 4): decode (tg) and prefill (pp) while a
busy loop, started as another program (its own session), occupies one core.

    default model, under load:  nanocompile -t 1 and -t 2, llama.cpp (F32 GGUF of the same
                                weights) -t 1 and -t 2
    default model, no load:     nanocompile -t 1 and -t 2 (what the load costs)
    tiny model (tests' tiny_config, random weights), no load and under load: decode at -t 1, 2, 8
    with --before-python PY:    the same nanocompile measurements (a subset) with the package
                                installed in PY's environment, e.g. the commit before the new pool

Every measurement runs in its own process (one engine per process, a fresh pool). The
configurations come in groups whose members are compared (-t 1 and -t 2 of one engine under one
load, ...): a group's members run one after the other, in the opposite order every other round,
so a ratio compares measurements minutes apart at most on a machine whose load drifts; the busy
loop is started before and killed after each measurement under load. tg: greedy steps after a pp-token prompt, tokens over the
wall time of all steps (stalls count); pp: prompt tokens over the prefill's wall time. Gates
(medians of per-round ratios): under load nanocompile -t 2 >= 0.9x -t 1 (tg and pp); tiny model
with no load -t 2 >= 0.5x -t 1 and -t 8 >= 0.7x -t 2 (tg).

    python -m bench.probes.contention [--rounds 3] [--pp 256] [--tg 64] [--tiny-tg 240] [--no-llama]
                               [--precision f32|int8|native] [--before-python /path/to/venv/bin/python]
                               [--label after]

--precision: the default model's precision (f32, the first runs' and their records'; native is what
`nanocompile run` uses on the default file, whose decode calls are short: a stall costs more of
them); llama.cpp runs the same numbers (F32, Q8_0, the file itself).

Workers run from /tmp, so each imports the nanocompile installed in its environment, not this
source tree.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a worker by path: bench/ importable, nanocompile installed
    sys.path.append(str(ROOT))

from bench.support.measure import append, summary, timed_run  # noqa: E402

TINY = dict(hidden=40, heads=4, kv_heads=2, head_dim=10, ffn=72, layers=2, vocab=300)  # tests' tiny_config()
TINY_PROMPT = 8  # + --tiny-tg steps must fit the 256-token context
TINY_REPEATS = 3  # decode runs per tiny-model process; the process reports their median


# ---- one measurement, in a process of its own ----------------------------------------------------

def _tiny_session(threads: int):
    from bench.support.tiny import random_weights, tiny_config
    from nanocompile.engine.compiled import CompiledSession
    cfg = tiny_config(**TINY)
    return CompiledSession.from_weights(cfg, random_weights(cfg, seed=1), n_ctx=cfg.max_position_embeddings, threads=threads)


def worker(engine: str, model: str, threads: int, pp: int, tg: int, precision: str = "f32") -> dict:
    import numpy as np

    if model == "tiny":
        s = _tiny_session(threads)
        prompt = list(range(1, TINY_PROMPT + 1))
        timed_run(s, prompt, 16)  # warm-up: pages, caches, the pool's threads
        runs = [timed_run(s, prompt, tg) for _ in range(TINY_REPEATS)]
        return {"tg": tg / statistics.median(sum(steps) for _, steps in runs)}

    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 150000, pp)]
    if engine == "nanocompile":
        from nanocompile.engine.compiled import CompiledSession
        from nanocompile.models import load_model
        m = load_model("default", progress=False)
        engine = CompiledSession.from_weights(m.config, m.weights, pp + tg + 8, threads, m.key, precision=precision)
    else:
        from bench.support.peer import LlamaCpp, requantized
        from nanocompile.cache.location import cache_dir
        from nanocompile.models import load_model
        source = load_model("default", progress=False).source
        gguf = Path(source) if precision == "native" else requantized(
            Path(source), "f32" if precision == "f32" else "q8_0", cache_dir() / "requantized")
        engine = LlamaCpp(gguf, pp + tg + 8, threads)
    timed_run(engine, prompt[:16], 4)  # warm-up
    p, steps = timed_run(engine, prompt, tg)
    return {"pp": pp / p, "tg": tg / sum(steps)}


# ---- the driver ------------------------------------------------------------------------------------

@contextlib.contextmanager
def busy_loop(on: bool):
    """A single-threaded busy loop in a session of its own (another program, as far as the
    scheduler's autogroups are concerned), killed by its pid afterwards."""
    if not on:
        yield
        return
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        time.sleep(0.3)
        yield
    finally:
        p.kill()
        p.wait()


def measure(engine: str, model: str, threads: int, load: bool, args) -> dict:
    python = args.before_python if engine == "nanocompile-before" else sys.executable
    cmd = [python, str(Path(__file__).resolve()), "--worker", "llama.cpp" if engine == "llama.cpp" else "nanocompile",
           "--model", model, "--threads", str(threads), "--pp", str(args.pp),
           "--tg", str(args.tiny_tg if model == "tiny" else args.tg), "--precision", args.precision]
    with busy_loop(load):
        r = subprocess.run(cmd, capture_output=True, text=True, cwd="/tmp", timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    return {**json.loads(r.stdout.strip().splitlines()[-1]), "loadavg": os.getloadavg()[0]}


def configurations(llama: bool, before: bool) -> list[list[tuple]]:
    """Groups of (engine, model, threads, under load) that are compared with each other."""
    groups = [[("nanocompile", "default", t, True) for t in (1, 2)]]
    if llama:
        groups += [[("llama.cpp", "default", t, True) for t in (1, 2)]]
    groups += [[("nanocompile", "default", t, False) for t in (1, 2)]]
    groups += [[("nanocompile", "tiny", t, load) for t in (1, 2, 8)] for load in (False, True)]
    if before:  # the old pool is slow where it stalls: -t 8 under load is left out
        groups[0] += [("nanocompile-before", "default", t, True) for t in (1, 2)]
        groups[-3] += [("nanocompile-before", "default", 2, False)]
        groups[-2] += [("nanocompile-before", "tiny", t, False) for t in (1, 2, 8)]
        groups[-1] += [("nanocompile-before", "tiny", 2, True)]
    return groups


def key(c: tuple) -> str:
    engine, model, threads, load = c
    return f"{engine} {model} -t {threads} {'load' if load else 'idle'}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", choices=["nanocompile", "llama.cpp"])
    ap.add_argument("--model", default="default")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=256)
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--tiny-tg", type=int, default=240)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--precision", choices=["f32", "int8", "native"], default="f32",
                    help="the default model's precision (the tiny model is f32)")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--only", default="", help="run only configurations whose name contains this")
    ap.add_argument("--label", default="", help="recorded with the results (e.g. before, after)")
    ap.add_argument("--before-python", help="a Python whose environment has the nanocompile to compare with")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.model, args.threads, args.pp, args.tg, args.precision)))
        return

    groups = [[c for c in g if args.only in key(c)] for g in configurations(not args.no_llama, bool(args.before_python))]
    groups = [g for g in groups if g]
    configs = [c for g in groups for c in g]
    for engine in {c[0] for c in configs if c[1] == "tiny"}:  # builds the tiny library outside the timing
        measure(engine, "tiny", 1, False, argparse.Namespace(pp=args.pp, tg=args.tg, tiny_tg=8, precision="f32",
                                                             before_python=args.before_python))
    per_round = []
    for r in range(args.rounds):
        order = [c for i in range(len(groups)) for c in groups[(i + r) % len(groups)][::1 if r % 2 == 0 else -1]]
        this = {}
        for c in order:
            this[key(c)] = measure(*c, args)
            print(f"  round {r} {key(c)}: " + ", ".join(f"{k} {v:.1f} t/s" for k, v in this[key(c)].items()
                                                         if k != "loadavg")
                  + f" (load average {this[key(c)]['loadavg']:.1f})", flush=True)
        per_round.append(this)

    results = {k: {test: summary([r[k][test] for r in per_round]) for test in per_round[0][k] if test != "loadavg"}
               for k in per_round[0]}
    print("\n| engine | model | threads | load | test | median t/s | min | max | IQR |\n|---|---|---|---|---|---|---|---|---|")
    for c in configs:
        for test, s in results[key(c)].items():
            test_name = f"pp{args.pp}" if test == "pp" else f"tg{args.tiny_tg if c[1] == 'tiny' else args.tg}"
            print(f"| {c[0]} | {c[1]} | {c[2]} | {'busy core' if c[3] else 'none'} | {test_name} | "
                  f"{s['median']:.1f} | {s['min']:.1f} | {s['max']:.1f} | {s['iqr']:.1f} |")

    def ratio(a: str, b: str, test: str):
        rs = [r[a][test] / r[b][test] for r in per_round if a in r and b in r]
        return {"median": statistics.median(rs), "by_round": rs} if rs else None

    gates = {
        "load: -t 2 / -t 1, tg (>= 0.9)": (ratio("nanocompile default -t 2 load", "nanocompile default -t 1 load", "tg"), 0.9),
        "load: -t 2 / -t 1, pp (>= 0.9)": (ratio("nanocompile default -t 2 load", "nanocompile default -t 1 load", "pp"), 0.9),
        "tiny idle: -t 2 / -t 1, tg (>= 0.5)": (ratio("nanocompile tiny -t 2 idle", "nanocompile tiny -t 1 idle", "tg"), 0.5),
        "tiny idle: -t 8 / -t 2, tg (>= 0.7)": (ratio("nanocompile tiny -t 8 idle", "nanocompile tiny -t 2 idle", "tg"), 0.7),
    }
    extra = {
        "load: llama.cpp -t 2 / -t 1, tg": ratio("llama.cpp default -t 2 load", "llama.cpp default -t 1 load", "tg"),
        "load: llama.cpp -t 2 / -t 1, pp": ratio("llama.cpp default -t 2 load", "llama.cpp default -t 1 load", "pp"),
        "load: nanocompile -t 2 / llama.cpp -t 2, tg": ratio("nanocompile default -t 2 load", "llama.cpp default -t 2 load", "tg"),
        "load: nanocompile -t 2 / llama.cpp -t 2, pp": ratio("nanocompile default -t 2 load", "llama.cpp default -t 2 load", "pp"),
        "idle: -t 2 / -t 1, tg": ratio("nanocompile default -t 2 idle", "nanocompile default -t 1 idle", "tg"),
        "idle: -t 2 / -t 1, pp": ratio("nanocompile default -t 2 idle", "nanocompile default -t 1 idle", "pp"),
        "tiny load: -t 2 / -t 1, tg": ratio("nanocompile tiny -t 2 load", "nanocompile tiny -t 1 load", "tg"),
        "tiny load: -t 8 / -t 2, tg": ratio("nanocompile tiny -t 8 load", "nanocompile tiny -t 2 load", "tg"),
        "before, load: -t 2 / -t 1, tg": ratio("nanocompile-before default -t 2 load", "nanocompile-before default -t 1 load", "tg"),
        "before, load: -t 2 / -t 1, pp": ratio("nanocompile-before default -t 2 load", "nanocompile-before default -t 1 load", "pp"),
        "after / before, idle -t 2, tg": ratio("nanocompile default -t 2 idle", "nanocompile-before default -t 2 idle", "tg"),
        "after / before, idle -t 2, pp": ratio("nanocompile default -t 2 idle", "nanocompile-before default -t 2 idle", "pp"),
        "after / before, load -t 2, tg": ratio("nanocompile default -t 2 load", "nanocompile-before default -t 2 load", "tg"),
        "before, tiny idle: -t 2 / -t 1, tg": ratio("nanocompile-before tiny -t 2 idle", "nanocompile-before tiny -t 1 idle", "tg"),
        "before, tiny idle: -t 8 / -t 2, tg": ratio("nanocompile-before tiny -t 8 idle", "nanocompile-before tiny -t 2 idle", "tg"),
    }
    print()
    verdicts = {}
    for name, (r, bound) in gates.items():
        if r:
            verdicts[name] = r["median"] >= bound
            print(f"gate {name}: {r['median']:.3f} (by round {[round(x, 3) for x in r['by_round']]}) "
                  f"{'holds' if verdicts[name] else 'MISSED'}")
    for name, r in extra.items():
        if r:
            print(f"{name}: {r['median']:.3f} (by round {[round(x, 3) for x in r['by_round']]})")
    append({"bench": "contention", "label": args.label, "precision": args.precision, "pp": args.pp, "tg": args.tg, "tiny_tg": args.tiny_tg,
            "tiny_config": TINY, "rounds": args.rounds, "results": results, "per_round": per_round,
            "gates": {k: {"ratio": v[0], "bound": v[1], "holds": verdicts.get(k)} for k, v in gates.items()},
            "ratios": extra, "load": "one single-threaded busy loop (python), own session, unpinned",
            "before_python": args.before_python, "cpus": os.cpu_count(), "commit": _commit()})


def _commit() -> str:
    """This tree's commit (the package measured is the one installed from it), '+' if modified."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "runtime", "templates", "nanocompile"],
                           capture_output=True, text=True)
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


if __name__ == "__main__":
    main()
