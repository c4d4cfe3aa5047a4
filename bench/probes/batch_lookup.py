"""Prompt-lookup drafts and batched decoding together (issue 28, point 5), in one process: the
default model, a Batcher of as many sequences as the most clients asked for (what `serve
--parallel N` runs), greedy, 2 threads. Two prompt sets: edit-style chat requests
(bench.probes.lookup's: answers that repeat the prompt) and free ones (serve_load's requests for
a Python function, whose answers do not).

Per set and number of clients C, alternating in rounds: C clients batched with lookup and
without; and for the --in-turn counts the same C requests one after another on one sequence,
with and without lookup (batching off). Each figure is generated tokens over the wall time of
the whole set (prompts included). The tokens are the same with and without lookup and batching
(asserted here per request). Per configuration the batched steps are summarised: their count,
rows a step, the drafted rows and the accepted tokens, and the median time of a step by rows.

    python -m bench.probes.batch_lookup [--sets edit,free] [--clients 1,4,8] [--in-turn 4]
                                        [--rounds 3] [--max-tokens 160]
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

from bench.probes.lookup import edit_prompts
from bench.probes.serve_load import TOPICS
from bench.support.measure import THREADS, append, machine, positive_int, summary


def free_prompts(n: int) -> list[str]:
    return [f"Request {i}: write a Python function for {TOPICS[i % len(TOPICS)]}." for i in range(n)]


def counts(text: str) -> list[int]:
    try:
        values = sorted({int(x) for x in text.split(",") if x})
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of client counts, not {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"client counts are at least 1, not {text!r}")
    return values


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


def steps_summary(log: list) -> dict:
    """The batched steps of a run: count, rows a step, and the median seconds of a step per rows
    reaching the head (steps with a prompt chunk left out)."""
    by_rows: dict[int, list[float]] = {}
    for rows, head, seconds, _ in log:
        if rows == head:
            by_rows.setdefault(rows, []).append(seconds)
    return {"steps": len(log), "rows_per_step": sum(r for r, *_ in log) / max(len(log), 1),
            "median_ms_by_rows": {r: round(1e3 * statistics.median(v), 2) for r, v in sorted(by_rows.items())},
            "steps_by_rows": {r: len(v) for r, v in sorted(by_rows.items())}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="edit,free", help="the prompt sets: edit, free or edit,free")
    ap.add_argument("--clients", type=counts, default=[1, 4, 8])
    ap.add_argument("--in-turn", type=counts, default=[4], help="client counts also run one after another")
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--max-tokens", type=positive_int, default=160)
    args = ap.parse_args()
    sets = [s for s in args.sets.split(",") if s]
    if not sets or set(sets) - {"edit", "free"}:
        raise SystemExit(f"--sets: edit, free or edit,free, not {args.sets!r}")
    from nanocompile import Model
    from nanocompile.engine.batcher import Batcher

    model = Model("default", n_ctx=2048, n_threads=THREADS, progress=False)
    most = max(args.clients)
    batcher = Batcher(model.session, most)
    views = [model.view(s) for s in batcher.sequences]
    texts = {"edit": edit_prompts(), "free": free_prompts(most)}
    configs = {}
    for name in sets:
        for c in args.clients:
            prompts = (texts[name] * most)[:c]
            configs[f"{name}, {c} clients, batched, lookup"] = (views[:c], prompts, True, True)
            configs[f"{name}, {c} clients, batched"] = (views[:c], prompts, False, True)
            if c in args.in_turn:
                configs[f"{name}, {c} in turn, lookup"] = (views[:1], prompts, True, False)
                configs[f"{name}, {c} in turn"] = (views[:1], prompts, False, False)
    rates: dict[str, list[float]] = {k: [] for k in configs}
    answers: dict[str, list] = {}
    drafts: dict[str, tuple] = {}
    steps: dict[str, dict] = {}
    for r in range(args.rounds):
        order = list(configs) if r % 2 == 0 else list(configs)[::-1]
        for name in order:
            views_, prompts_, lookup, concurrent = configs[name]
            batcher.step_log = []
            seconds, out, tokens, drafted, accepted = run_set(views_, prompts_, args.max_tokens, lookup, concurrent)
            rates[name].append(tokens / seconds)
            answers.setdefault(name, out)
            assert out == answers[name], f"{name}: other answers in round {r}"
            drafts[name] = (drafted, accepted)
            steps[name] = steps_summary(batcher.step_log)
            print(f"round {r}: {name}: {tokens / seconds:.1f} tok/s ({tokens} tokens, {seconds:.1f} s; drafted "
                  f"{drafted}, accepted {accepted}; {steps[name]['steps']} steps of "
                  f"{steps[name]['rows_per_step']:.1f} rows)", flush=True)
    batcher.close()
    for name in configs:
        if name.endswith(", lookup"):
            assert answers[name] == answers[name[:-len(", lookup")]], f"{name}: other answers than without lookup"

    def ratio(a, b):
        return statistics.median(x / y for x, y in zip(rates[a], rates[b]))

    comparisons = {}
    for name in sets:
        for c in args.clients:
            on, off = f"{name}, {c} clients, batched, lookup", f"{name}, {c} clients, batched"
            comparisons[f"{name}: lookup at {c} clients (batched, on / off)"] = ratio(on, off)
            if c in args.in_turn:
                comparisons[f"{name}: batching with lookup ({c} at once / in turn)"] = ratio(on, f"{name}, {c} in turn, lookup")
                comparisons[f"{name}: batching without lookup ({c} at once / in turn)"] = ratio(off, f"{name}, {c} in turn")
    for name, value in comparisons.items():
        print(f"{name}: {value:.2f}x")
    for name, s in steps.items():
        print(f"{name}: step ms by rows {s['median_ms_by_rows']}")
    append({"bench": "batch_lookup", "machine": machine(), "threads": THREADS, "rounds": args.rounds,
            "max_tokens": args.max_tokens, "rates_tok_s": {k: summary(v) for k, v in rates.items()},
            "rounds_tok_s": rates, "drafts": drafts, "steps": steps, "comparisons": comparisons})


if __name__ == "__main__":
    main()
