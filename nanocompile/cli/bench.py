"""`nanocompile bench`: prompt processing and generation speed, reported as llama-bench does.

ppN: a prompt of N random tokens fed into an empty cache, tokens per second. tgN: N tokens
generated one by one after one token of context, tokens per second. Each test runs once to warm
up, then -r times; the table gives mean ± standard deviation over the repetitions.
"""
from __future__ import annotations

import csv
import io
import json
import statistics
import sys
import time

from ..errors import NanocompileError
from .common import add_model_flags, int_list, set_blas_threads, warn_if_oversubscribed


def _pp(session, tokens) -> float:
    session.reset()
    t0 = time.perf_counter()
    session.step(tokens)
    return len(tokens) / (time.perf_counter() - t0)


def _tg(session, first: int, n: int) -> float:
    session.reset()
    logits = session.step([first])
    t0 = time.perf_counter()
    for _ in range(n):
        logits = session.step([int(logits.argmax())])
    return n / (time.perf_counter() - t0)


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 2 ** 30:.2f} GiB" if n_bytes >= 2 ** 30 else f"{n_bytes / 2 ** 20:.2f} MiB"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def cmd_bench(args) -> int:
    # the interpreter's BLAS reads its thread count once, when NumPy loads: the first -t sets it
    set_blas_threads(args.threads[0])
    import numpy as np

    from ..engine.open import open_model, open_session
    from ..models import load_model

    tests = [("pp", p) for p in args.n_prompt if p > 0] + [("tg", n) for n in args.n_gen if n > 0]
    if not tests:
        raise NanocompileError("nothing to measure: every -p and -n is 0")
    if any(v < 0 for v in args.n_prompt + args.n_gen):
        raise NanocompileError("-p and -n take sizes >= 0")
    if any(t < 1 for t in args.threads):
        raise NanocompileError(f"threads must be at least 1, got {args.threads}")
    warn_if_oversubscribed(max(args.threads))
    if args.repetitions < 1:
        raise NanocompileError(f"-r must be at least 1, got {args.repetitions}")
    model = load_model(args.model, progress=not args.quiet)
    opened = open_model(model, args.precision)
    precision = opened.precision
    cfg = model.config
    n_ctx = max([p for k, p in tests if k == "pp"] + [n + 1 for k, n in tests if k == "tg"])
    if n_ctx > cfg.max_position_embeddings:
        raise NanocompileError(f"a test needs {n_ctx} tokens of context; the model's maximum is "
                               f"{cfg.max_position_embeddings}")
    n_params = model.n_params  # from the shapes: counting converts nothing
    rng = np.random.default_rng(0)
    rows = []
    for threads in args.threads:
        session = open_session(opened, args.backend, n_ctx=n_ctx, threads=threads, progress=not args.quiet)
        for kind, size in tests:
            tokens = [int(t) for t in rng.integers(0, cfg.vocab_size, size)]
            run = (lambda: _pp(session, tokens)) if kind == "pp" else (lambda: _tg(session, tokens[0], size))
            run()  # warm-up
            samples = [run() for _ in range(args.repetitions)]
            rows.append({"model": f"qwen2 {_params(n_params)} {precision.upper()}",
                         "size": _size(session.weights_bytes),
                         "params": _params(n_params), "precision": precision,
                         "backend": session.backend_name, "threads": threads,
                         "test": f"{kind}{size}", "n_prompt": size if kind == "pp" else 0,
                         "n_gen": size if kind == "tg" else 0, "model_n_params": n_params,
                         "model_size": session.weights_bytes, "avg_ts": statistics.mean(samples),
                         "stddev_ts": statistics.stdev(samples) if len(samples) > 1 else 0.0, "samples_ts": samples})
            if args.output == "md" and not args.quiet:
                print(f"  {kind}{size} at {threads} threads: {statistics.mean(samples):.2f} t/s", file=sys.stderr)
        getattr(session, "close", lambda: None)()  # the compiled library's memory, before the next
    sys.stdout.write(render(rows, args.output))
    return 0


COLUMNS = ("model", "size", "params", "precision", "backend", "threads", "test")


def render(rows: list[dict], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(rows, indent=2) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=[*COLUMNS, "n_prompt", "n_gen", "avg_ts", "stddev_ts"],
                                extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()
    lines = ["| " + " | ".join(COLUMNS) + " | t/s |", "|" + "---|" * (len(COLUMNS) + 1)]
    for r in rows:
        lines.append("| " + " | ".join(str(r[c]) for c in COLUMNS) + f" | {r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} |")
    return "\n".join(lines) + "\n"


def add_parser(sub) -> None:
    bench = sub.add_parser("bench", help="prompt and generation speed, as llama-bench reports it")
    add_model_flags(bench, threads=False)
    bench.add_argument("-p", "--n-prompt", type=int_list, default=[512], help="prompt sizes, e.g. 128,512")
    bench.add_argument("-n", "--n-gen", type=int_list, default=[128], help="generation lengths, e.g. 32,128")
    bench.add_argument("-r", "--repetitions", type=int, default=5, help="repetitions of each test")
    bench.add_argument("-t", "--threads", type=int_list, default=[2], help="thread counts, e.g. 1,2")
    bench.add_argument("-o", "--output", choices=["md", "csv", "json"], default="md", help="output format")
    bench.set_defaults(func=cmd_bench)
