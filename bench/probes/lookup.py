"""Prompt-lookup speculative decoding side by side: nanocompile with and without lookup, llama.cpp
plain and with llama-cpp-python's prompt lookup (LlamaPromptLookupDecoding), on the same file,
greedy, 2 threads, every engine in a process of its own per round, in alternating order.

Two prompt sets, as the default model's users send them through its chat template: edit-style
prompts built from functions of Python's standard library (source no one here wrote, read with
inspect) with an instruction to rename, add type hints, comment or fix a stated fault, whose
answers repeat most of the prompt; and free-generation prompts, whose answers do not. Per set
and engine: decode tokens per second over the set (tokens after the first, over the time from
the first token to the last), and for ours acceptance and tokens per step. Ratios are per round.

    python -m bench.probes.lookup [--rounds 3] [--max-tokens 192] [--precision native]
    python -m bench.probes.lookup --avx2      # our x86-64-v3 build and llama.cpp's AVX2 build
"""
from __future__ import annotations

import argparse
import inspect
import statistics
import tempfile
from pathlib import Path

from bench.report.engines import AVX2_PYTHON
from bench.report.jobs import Run, WorkerError, run_worker
from bench.support.measure import THREADS, append, positive_int, summary


def edit_prompts() -> list[str]:
    import base64
    import calendar
    import shutil
    import statistics as stats
    import string
    import textwrap

    edits = [
        (shutil.copyfileobj, "Rename the parameter fsrc to source and fdst to target everywhere in this function."),
        (textwrap.indent, "Add type hints to this function."),
        (stats.median, "Add type hints to this function."),
        (string.capwords, "Rename the variable sep to separator everywhere in this function."),
        (calendar.monthrange, "Add a comment above each statement of this function saying what it does."),
        (base64.b64encode, "Add type hints to this function."),
        (stats.mode, "Fix this function: for empty data it should return None instead of raising an error."),
        (textwrap.dedent, "Rename the variable margin to common_margin everywhere in this function."),
    ]
    return [f"{instruction} Reply with the whole function in one code block.\n\n```python\n"
            f"{inspect.getsource(function)}```" for function, instruction in edits]


FREE_PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome, ignoring punctuation and case.",
    "Explain in a few paragraphs how a hash table works and what makes lookups fast.",
    "Write a short story about a robot that learns to paint.",
    "List ten ideas for a weekend programming project, one line each, with a sentence on why each is fun.",
]

ENGINES = ("nanocompile", "nanocompile lookup", "llama.cpp", "llama.cpp lookup")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--max-tokens", type=positive_int, default=192)
    ap.add_argument("--precision", default="native")
    ap.add_argument("--avx2", action="store_true", help=f"both built for AVX2 (ours x86-64-v3, llama.cpp from "
                                                        f"the interpreter in {AVX2_PYTHON})")
    ap.add_argument("-m", "--model", default="default")
    ap.add_argument("--sets", default="edit,free", help="the prompt sets to run: edit, free or both")
    args = ap.parse_args()
    wanted = args.sets.split(",")
    if not wanted or set(wanted) - {"edit", "free"}:
        raise SystemExit(f"--sets: edit, free or edit,free, not {args.sets!r}")
    import os
    import sys

    from nanocompile.models import load_model

    model = load_model(args.model, progress=False)
    tok = model.tokenizer
    sets = {name: texts for name, texts in (("edit", edit_prompts()), ("free", FREE_PROMPTS)) if name in wanted}
    prompts = {name: [tok.encode(tok.render_chat([{"role": "user", "content": text}])) for text in texts]
               for name, texts in sets.items()}
    n_ctx = max(len(p) for ps in prompts.values() for p in ps) + args.max_tokens + 32
    base = {"files": {"source": str(model.source), "file": str(model.source)}, "threads": THREADS, "n_ctx": n_ctx,
            "max_tokens": args.max_tokens, "precision": args.precision, "stop_ids": sorted(tok.eos_ids),
            "prompts": [p for ps in prompts.values() for p in ps]}
    if args.avx2 and not os.environ.get(AVX2_PYTHON):
        raise SystemExit(f"--avx2 needs {AVX2_PYTHON}: an interpreter with llama-cpp-python built for AVX2 only")
    launches = {
        "nanocompile": (sys.executable, {"NANOCOMPILE_MARCH": "x86-64-v3"} if args.avx2 else {}),
        "llama.cpp": (os.environ[AVX2_PYTHON] if args.avx2 else sys.executable, {}),
    }
    answers = {e: [] for e in ENGINES}  # per round, the worker's answers
    with tempfile.TemporaryDirectory() as scratch:
        run = Run(Path(scratch))
        for r in range(args.rounds):
            for engine in ENGINES if r % 2 == 0 else ENGINES[::-1]:
                family = engine.split()[0]
                spec = {**base, "family": family, "lookup": engine.endswith("lookup")}
                python, env = launches[family]
                try:
                    out = run_worker(run, "generation", spec, THREADS, env, python)
                except WorkerError as err:
                    raise SystemExit(f"{engine}: {err}") from None
                answers[engine].append(out["answers"])
            print(f"round {r} done", flush=True)

    parts, at = {}, 0
    for name, ps in prompts.items():
        parts[name], at = slice(at, at + len(ps)), at + len(ps)

    def rate(round_answers, part) -> float:
        chosen = round_answers[parts[part]]
        return sum(len(a["tokens"]) - 1 for a in chosen) / sum(a["decode_s"] for a in chosen)

    record = {"bench": "lookup", "model": str(model.source), "precision": args.precision,
              "builds": "x86-64-v3 / llama.cpp avx2" if args.avx2 else "this CPU", "rounds": args.rounds,
              "max_tokens": args.max_tokens, "sets": {}, "policy": "unseen row counts at the cheapest cost per extra row seen"}
    same = all(a["tokens"] == b["tokens"] for x, y in zip(answers["nanocompile"], answers["nanocompile lookup"])
               for a, b in zip(x, y))
    print(f"\nnanocompile with lookup gave the same tokens as without on every prompt: {same}")
    for part in parts:
        rates = {e: [rate(a, part) for a in answers[e]] for e in ENGINES}
        ours = [a[parts[part]] for a in answers["nanocompile lookup"]]
        drafted = sum(x["drafted"] for rnd in ours for x in rnd)
        accepted = sum(x["accepted"] for rnd in ours for x in rnd)
        generated = sum(len(x["tokens"]) for rnd in ours for x in rnd)
        lookup_s = sum(x["lookup_s"] for rnd in ours for x in rnd)
        decode_s = sum(x["decode_s"] for rnd in ours for x in rnd)
        ratios = {
            "lookup / plain (ours)": [a / b for a, b in zip(rates["nanocompile lookup"], rates["nanocompile"])],
            "ours lookup / llama.cpp plain": [a / b for a, b in zip(rates["nanocompile lookup"], rates["llama.cpp"])],
            "ours plain / llama.cpp plain": [a / b for a, b in zip(rates["nanocompile"], rates["llama.cpp"])],
            "llama.cpp lookup / plain": [a / b for a, b in zip(rates["llama.cpp lookup"], rates["llama.cpp"])],
        }
        print(f"\n{part} prompts ({len(prompts[part])}, up to {args.max_tokens} tokens each):")
        for e in ENGINES:
            print(f"  {e}: {statistics.median(rates[e]):.1f} tok/s [{min(rates[e]):.1f}-{max(rates[e]):.1f}]")
        print(f"  ours: acceptance {accepted / max(drafted, 1):.2f}, {generated / max(generated - accepted, 1):.2f} "
              f"tokens per step, drafting {100 * lookup_s / decode_s:.2f}% of decode time")
        for name, v in ratios.items():
            print(f"  {name}: {statistics.median(v):.2f}x (rounds {', '.join(f'{x:.2f}' for x in v)})")
        record["sets"][part] = {"prompts": len(prompts[part]), "rates": {e: summary(v) for e, v in rates.items()},
                                "by_round": rates, "ratios": {k: summary(v) for k, v in ratios.items()},
                                "acceptance": accepted / max(drafted, 1),
                                "tokens_per_step": generated / max(generated - accepted, 1),
                                "lookup_share_of_decode": lookup_s / decode_s}
    record["same_tokens_with_lookup"] = same
    append(record)


if __name__ == "__main__":
    main()
