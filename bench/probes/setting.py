"""One setting of the compiler (a module constant the recipes read, such as Unpack's MIN_TILES)
at each of several values: the model's native library built apart from the cache for each value,
all loaded in one process, then steps of k rows after a context (a verify step's shape: every
row's logits, rolled back), the values alternated round by round. Every value's logits are
asserted bitwise equal to the first's at each row count (a setting of the schedule changes no
bit); a sign test per value says whether its difference from the first is more than the noise.

    python -m bench.probes.setting nanocompile.schedule.unpack:MIN_TILES "{8: 2, 16: 2}" "{8: 3, 16: 2}" \\
        --march x86-64-v3 --rows 1,8 --rounds 12          # prints; appends to bench/results.jsonl
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import statistics
import time

import numpy as np

from bench.probes.small_steps import sizes
from bench.probes.without import native_session_apart
from bench.support.measure import append, pin_threads, positive_int, summary, two_sided_sign_test


def constant(text: str) -> tuple[str, str]:
    """'package.module:NAME' as (module, name)."""
    module, _, name = text.partition(":")
    if not module or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r}: a setting is MODULE:NAME, e.g. nanocompile.schedule.unpack:MIN_TILES")
    return module, name


def require_setting(ap: argparse.ArgumentParser, module: str, name: str) -> None:
    """ap.error (one line, exit 2) unless module imports and has name."""
    try:
        found = hasattr(importlib.import_module(module), name)
    except ImportError:
        ap.error(f"no module {module}")
    if not found:
        ap.error(f"{module} has no {name}")


def literal(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise argparse.ArgumentTypeError(f"{text!r}: a value is a Python literal (a number, a tuple, a dict)") from None


@contextlib.contextmanager
def setting(module: str, name: str, value):
    """The module's constant set to value while the block runs."""
    m = importlib.import_module(module)
    saved = getattr(m, name)
    setattr(m, name, value)
    try:
        yield
    finally:
        setattr(m, name, saved)


def main() -> None:
    from nanocompile.models import load_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("setting", type=constant, help="MODULE:NAME of the constant")
    ap.add_argument("values", type=literal, nargs="+", help="its values (the first is the baseline)")
    ap.add_argument("-m", "--model", default="default", help="'default', a GGUF file or a Hugging Face directory")
    ap.add_argument("--march", default=None, help="an x86-64 level (default: this CPU's)")
    ap.add_argument("--past", type=positive_int, default=256)
    ap.add_argument("--rows", type=sizes, default=[1, 8])
    ap.add_argument("--rounds", type=positive_int, default=12)
    args = ap.parse_args()
    if len(args.values) < 2:
        ap.error("at least two values: the baseline, then the ones to compare with it")
    module, name = args.setting
    require_setting(ap, module, name)
    pin_threads()
    model = load_model(args.model, progress=False)
    ids = [int(t) for t in np.random.default_rng(0).integers(1000, 100000, args.past + max(args.rows))]
    sessions = []
    for value in args.values:
        s = native_session_apart(model, args.march, lambda: setting(module, name, value), len(ids) + 8)
        s.step(ids[:args.past])
        sessions.append(s)
    past = sessions[0].past
    seconds = [{k: [] for k in args.rows} for _ in sessions]
    first = {}
    for r in range(args.rounds + 1):  # round 0 warms every shape
        for i in range(len(sessions)) if r % 2 == 0 else reversed(range(len(sessions))):
            for k in args.rows:
                t0 = time.perf_counter()
                logits = np.asarray(sessions[i].step(ids[args.past:args.past + k], all_logits=True))
                elapsed = time.perf_counter() - t0
                sessions[i].truncate(past)
                assert np.array_equal(logits, first.setdefault(k, logits)), \
                    f"{name} = {args.values[i]!r}: the logits of {k} rows differ from {args.values[0]!r}'s"
                if r:
                    seconds[i][k].append(elapsed)
    march = sessions[0].module.options.march
    for s in sessions:
        s.close()
    result = {"bench": "setting", "model": str(model.source), "setting": f"{module}:{name}",
              "values": [repr(v) for v in args.values], "march": march,
              "past": args.past, "rounds": args.rounds, "rows": {}}
    for k in args.rows:
        row = {"seconds": [summary(seconds[i][k]) for i in range(len(sessions))]}
        print(f"{k} rows: " + "  ".join(f"{args.values[i]!r} median {statistics.median(seconds[i][k]) * 1e3:.2f} ms"
                                        for i in range(len(sessions))))
        for i in range(1, len(sessions)):
            ratios = [a / b for a, b in zip(seconds[i][k], seconds[0][k])]
            faster = sum(x < 1 for x in ratios)
            row[f"{args.values[i]!r} / {args.values[0]!r}"] = {**summary(ratios), "below_1": faster,
                                                                "sign_test_p": two_sided_sign_test(faster, len(ratios))}
            print(f"    {args.values[i]!r} / {args.values[0]!r}: median {statistics.median(ratios):.3f} "
                  f"[{min(ratios):.3f}-{max(ratios):.3f}], faster in {faster} of {len(ratios)}")
        result["rows"][str(k)] = row
    append(result)


if __name__ == "__main__":
    main()
