"""Prompt-lookup drafts and batched decoding together (issue 28, point 5), in one process: the
default model, a Batcher of 4 sequences (what `serve --parallel 4` runs), edit-style chat requests
(bench.probes.lookup's: answers that repeat the prompt), greedy, 2 threads.

At 1 and 4 clients, alternating in rounds: batched with lookup, batched without; and at 4 clients
the same requests one after another on one sequence, with and without lookup (batching off).
Each figure is generated tokens over the wall time of the whole set (prompts included). A
sequence's verify step is one more request of the batch; the tokens are the same with and without
lookup (asserted here per request).

    python -m bench.probes.batch_lookup [--rounds 3] [--max-tokens 160]
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

from bench.probes.lookup import edit_prompts
from bench.support.measure import THREADS, append, machine, positive_int, summary


def run_set(models, prompts, max_tokens: int, lookup: bool, concurrent: bool) -> tuple[float, list, int, int, int]:
    """(seconds, answers, tokens, drafted, accepted): each prompt on models[i % len(models)], all
    at once in threads or one after another."""
    out: list = [None] * len(prompts)

    def one(i):
        model = models[i % len(models)]
        model.reset()
        with model.session.generating():
            r = model.create_chat_completion([{"role": "user", "content": prompts[i]}], max_tokens=max_tokens,
                                             temperature=0, lookup=lookup)
        out[i] = (r.message.content, r.timings)

    t0 = time.perf_counter()
    if concurrent:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for i in range(len(prompts)):
            one(i)
    seconds = time.perf_counter() - t0
    return seconds, [o[0] for o in out], sum(o[1].generated_tokens for o in out), \
        sum(o[1].drafted_tokens for o in out), sum(o[1].accepted_tokens for o in out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--max-tokens", type=positive_int, default=160)
    args = ap.parse_args()
    from nanocompile import Model
    from nanocompile.engine.batcher import Batcher

    model = Model("default", n_ctx=2048, n_threads=THREADS, progress=False)
    batcher = Batcher(model.session, 4)
    views = [model.view(s) for s in batcher.sequences]
    prompts = edit_prompts()[:4]
    configs = {"1 client, batched, lookup": (views[:1], prompts[:1], True, True),
               "1 client, batched": (views[:1], prompts[:1], False, True),
               "4 clients, batched, lookup": (views, prompts, True, True),
               "4 clients, batched": (views, prompts, False, True),
               "4 in turn, lookup": (views[:1], prompts, True, False),
               "4 in turn": (views[:1], prompts, False, False)}
    rates: dict[str, list[float]] = {k: [] for k in configs}
    answers: dict[str, list] = {}
    drafts: dict[str, tuple] = {}
    for r in range(args.rounds):
        order = list(configs) if r % 2 == 0 else list(configs)[::-1]
        for name in order:
            views_, prompts_, lookup, concurrent = configs[name]
            seconds, texts, tokens, drafted, accepted = run_set(views_, prompts_, args.max_tokens, lookup, concurrent)
            rates[name].append(tokens / seconds)
            answers.setdefault(name, texts)
            assert texts == answers[name], f"{name}: other answers in round {r}"
            drafts[name] = (drafted, accepted)
            print(f"round {r}: {name}: {tokens / seconds:.1f} tok/s ({tokens} tokens, {seconds:.1f} s; drafted "
                  f"{drafted}, accepted {accepted})", flush=True)
    assert answers["4 clients, batched, lookup"] == answers["4 clients, batched"] == answers["4 in turn"]
    batcher.close()

    def ratio(a, b):
        return statistics.median(x / y for x, y in zip(rates[a], rates[b]))

    comparisons = {"lookup at 1 client (batched, on / off)": ratio("1 client, batched, lookup", "1 client, batched"),
                   "lookup at 4 clients (batched, on / off)": ratio("4 clients, batched, lookup", "4 clients, batched"),
                   "batching with lookup (4 at once / in turn)": ratio("4 clients, batched, lookup", "4 in turn, lookup"),
                   "batching without lookup (4 at once / in turn)": ratio("4 clients, batched", "4 in turn")}
    for name, value in comparisons.items():
        print(f"{name}: {value:.2f}x")
    append({"bench": "batch_lookup", "machine": machine(), "threads": THREADS, "rounds": args.rounds,
            "max_tokens": args.max_tokens, "rates_tok_s": {k: summary(v) for k, v in rates.items()},
            "rounds_tok_s": rates, "drafts": drafts, "comparisons": comparisons})


if __name__ == "__main__":
    main()
