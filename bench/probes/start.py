"""A warm start against llama-cpp-python's: `nanocompile run -m default -p x -n 1` with its library,
weights and tokenizer cached, and llama-cpp-python loading the same GGUF and answering one token,
each in a fresh process, alternated round by round; wall time from the parent (fork to exit),
medians and minima. A second pass runs ours with a stage clock inside the process to say where the
time goes (interpreter and imports, the file, the open step, the session, the token).

    python -m bench.probes.start [--rounds 7]      # appends to bench/results.jsonl
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from bench.support.measure import THREADS, append, summary

LLAMA = """
import sys
from bench.support.peer import open_llama
llm = open_llama(sys.argv[1], n_ctx=4096, n_threads={threads}, n_threads_batch={threads}, verbose=False)
llm("x", max_tokens=1, temperature=0)
"""

STAGES = """
import time
t0 = time.perf_counter()
from nanocompile.models import load_model
from nanocompile.engine.open import open_model
from nanocompile.engine.compiled import CompiledSession
t1 = time.perf_counter()
model = load_model("default", progress=False)
t2 = time.perf_counter()
opened = open_model(model)
t3 = time.perf_counter()
session = CompiledSession(opened, n_ctx=4096, threads={threads})
t4 = time.perf_counter()
session.step(model.tokenizer.encode("x"))
t5 = time.perf_counter()
assert session.warm, "the library was not found by its key: run `nanocompile run -p x -n 1` once first"
print(t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)
"""


def wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {args.rounds}")
    from nanocompile.models import load_model

    gguf = load_model("default", progress=False).source
    ours = [sys.executable, "-m", "nanocompile", "run", "-q", "-m", "default", "-p", "x", "-n", "1", "-t",
            str(THREADS), "--temp", "0"]
    theirs = [sys.executable, "-c", LLAMA.format(threads=THREADS), gguf]
    wall(ours), wall(theirs)  # warm: every cache filled, the file in the page cache
    times = {"nanocompile": [], "llama-cpp-python": []}
    for r in range(args.rounds):
        pair = [("nanocompile", ours), ("llama-cpp-python", theirs)]
        for name, cmd in pair if r % 2 == 0 else pair[::-1]:
            times[name].append(wall(cmd))
        print(f"round {r}: ours {times['nanocompile'][-1]:.3f} s, llama-cpp-python {times['llama-cpp-python'][-1]:.3f} s",
              flush=True)
    names = ("imports", "load the file", "open", "session (warm)", "tokenize + first token")
    stages = []
    for _ in range(args.rounds):
        out = subprocess.run([sys.executable, "-c", STAGES.format(threads=THREADS)], check=True, capture_output=True,
                             text=True).stdout
        stages.append(dict(zip(names, map(float, out.split()))))
    result = {name: summary(samples) for name, samples in times.items()}
    ratios = [a / b for a, b in zip(times["nanocompile"], times["llama-cpp-python"])]
    where = {n: statistics.median(s[n] for s in stages) for n in names}
    print(f"\nmedian: ours {result['nanocompile']['median']:.3f} s, llama-cpp-python "
          f"{result['llama-cpp-python']['median']:.3f} s, ours / theirs {statistics.median(ratios):.3f} "
          f"(faster in {sum(x < 1 for x in ratios)} of {len(ratios)})")
    print("where ours goes (median, in-process): " + ", ".join(f"{n} {v * 1000:.0f} ms" for n, v in where.items()))
    append({"bench": "start", "rounds": args.rounds, "wall_s": result, "ratio_by_round": ratios,
            "stages_s": where, "stage_runs": stages})


if __name__ == "__main__":
    main()
