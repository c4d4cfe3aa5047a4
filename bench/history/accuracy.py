"""Accuracy of each precision, as llama.cpp's perplexity tool reports it (--kl-divergence), on
real text no one here wrote: modules of the Python standard library that ships with this
interpreter.

The text is cut into chunks of --ctx tokens; each engine computes every row's logits of a chunk
from an empty cache and the second half of each chunk is scored (as llama-perplexity does).
Every engine reads the same token ids (ours, from the model's tokenizer). For each engine:
perplexity; against its float32 reference (ours against ours, llama.cpp against llama.cpp):
mean and 99th-percentile KL divergence and how often the top token agrees ("same top p"); and
ours against llama.cpp on the same weights.

    python -m bench.history.accuracy [--chunks 4] [--ctx 512] [--precisions f32,int8,native]

native's llama.cpp counterpart is the model file itself (Q4_K_M for the default model): the same
weights, in their own types.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from bench.report.kl import MODULES, Scores, corpus_tokens, log_softmax
from bench.support.measure import THREADS, append, pin_threads

pin_threads()

# llama.cpp's GGUF of the same numbers as each of our precisions ("file": the model file itself)
LLAMA = {"f32": "f32", "int8": "q8_0", "native": "file"}
FILE_TYPE = "Q4_K_M"  # the default model's; named in the tables


def llama_label(precision: str) -> str:
    kind = LLAMA[precision]
    return f"llama.cpp {FILE_TYPE if kind == 'file' else kind.upper()}"


def llama_model_path(source: Path, precision: str, directory: Path) -> Path:
    from bench.support.peer import requantized

    return source if LLAMA[precision] == "file" else requantized(source, LLAMA[precision], directory)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--precisions", default="f32,int8")
    ap.add_argument("--no-llama", action="store_true")
    args = ap.parse_args()
    precisions = args.precisions.split(",")

    from nanocompile.cache.location import cache_root
    from nanocompile.engine.open import open_session
    from nanocompile.models import load_model
    from bench.support.peer import LlamaCpp

    model = load_model("default", progress=False)
    ids = corpus_tokens(model.tokenizer, args.chunks * args.ctx)
    ours = {p: open_session(model, "compiled", n_ctx=args.ctx, threads=THREADS, precision=p) for p in precisions}
    theirs = {}
    if not args.no_llama:
        for p in precisions:
            path = llama_model_path(Path(model.source), p, cache_root().path / "requantized")
            theirs[p] = LlamaCpp(path, args.ctx, THREADS, logits_all=True)
    scores = {f"nanocompile {p}": Scores() for p in precisions}
    scores.update({llama_label(p): Scores() for p in theirs})
    cross = {p: Scores() for p in theirs}  # ours against llama.cpp, same weights
    half = args.ctx // 2
    for c in range(args.chunks):
        chunk = ids[c * args.ctx:(c + 1) * args.ctx]
        targets = np.asarray(chunk[half + 1:])  # row i's logits predict token i + 1
        rows = slice(half, args.ctx - 1)
        logp = {}
        for p, s in ours.items():
            s.reset()
            logp[f"nanocompile {p}"] = log_softmax(s.step(chunk, all_logits=True)[rows])
        for p, llama in theirs.items():
            logp[llama_label(p)] = log_softmax(llama.all_logits(chunk)[rows])
        for name, lp in logp.items():
            engine = name.split(" ")[0]
            reference = logp.get(f"{engine} {'f32' if engine == 'nanocompile' else 'F32'}")
            scores[name].add(lp, targets, None if reference is lp else reference)
        for p in theirs:
            cross[p].add(logp[f"nanocompile {p}"], targets, logp[llama_label(p)])
        print(f"chunk {c + 1}/{args.chunks}", flush=True)

    report = {name: s.report() for name, s in scores.items()}
    report_cross = {p: s.report() for p, s in cross.items()}
    print(f"\n{args.chunks} chunks of {args.ctx} tokens from {', '.join(MODULES)}; the second half of each "
          f"scored ({args.chunks * (args.ctx - 1 - half)} positions)\n")
    print("| engine | perplexity | KL vs its float32: mean | 99th pct | same top token |\n|---|---|---|---|---|")
    for name, r in report.items():
        kl = f"{r['kl_mean']:.5f} | {r['kl_p99']:.5f} | {r['same_top']:.2%}" if "kl_mean" in r else "— | — | —"
        print(f"| {name} | {r['ppl']:.4f} | {kl} |")
    if report_cross:
        print("\n| ours vs llama.cpp, same weights | KL mean | 99th pct | same top token |\n|---|---|---|---|")
        for p, r in report_cross.items():
            print(f"| nanocompile {p} vs {llama_label(p)} | {r['kl_mean']:.5f} | {r['kl_p99']:.5f} | "
                  f"{r['same_top']:.2%} |")
    for p in precisions:
        if p != "f32" and llama_label(p) in report and "kl_mean" in report[f"nanocompile {p}"]:
            ratio = report[f"nanocompile {p}"]["kl_mean"] / report[llama_label(p)]["kl_mean"]
            print(f"\n{p}: our KL divergence / {llama_label(p)}'s = {ratio:.3f}")
    append({"bench": "accuracy", "chunks": args.chunks, "ctx": args.ctx, "modules": MODULES, "engines": report,
            "ours_vs_llama": report_cross})


if __name__ == "__main__":
    main()
