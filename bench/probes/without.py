"""The default model with the recipes as they are and with the recipes less one kind of directive
(PrefetchNext: a projection's row tiles fetch its next column block; FetchNextBlock: a quantized
projection's first row tile does; Unpack: a narrow weight's bytes rebuilt once per column block;
PairSums: a sub-block's 4-bit dot products summed in int16 pairs; AmxSums: a K-format projection's
integer sums from AMX tiles, where the target has them), or another model file (-m), both
libraries loaded in one process and alternated round by round: a prompt (pp), tokens after it
(tg) and, with --verify K, a step of K rows after the prompt with every row's logits (a verify
step's shape, rolled back) each round. Why a directive is in the recipes, at a precision and an
x86-64 level; a sign test over the rounds says whether the difference is more than the machine's
noise. The library less the directive is built in a directory of its own, outside the cache: found
by the recipes' key, it would stand in for theirs (before stop 41 it did, since the warm start of
issue 25: both sessions could run one library).

    python -m bench.probes.without PrefetchNext                  # f32, pp512: the recorded A/B of stop 24
    python -m bench.probes.without Unpack --precision native --march x86-64-v3 --rounds 20
    python -m bench.probes.without FetchNextBlock --precision native --pp 256 --tg 4 --verify 8
                                                                  # prints; appends to bench/results.jsonl
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.support.measure import THREADS, append, pin_threads, summary, two_sided_sign_test


@contextlib.contextmanager
def recipes_without(kind: type):
    """Every recipe's candidates less their directives of this kind, while a library is compiled."""
    from nanocompile.schedule import AmxSums, program, recipes

    candidates, with_tile_sums = recipes._candidates, program.with_tile_sums

    def less(*args, **kwargs):
        for schedule in candidates(*args, **kwargs):
            yield [d for d in schedule if not isinstance(d, kind)]

    recipes._candidates = less
    if kind is AmxSums:  # added after the recipes where the target has AMX (schedule_program)
        program.with_tile_sums = lambda k, schedule, max_rows=0: tuple(schedule)
    try:
        yield
    finally:
        recipes._candidates, program.with_tile_sums = candidates, with_tile_sums


def library_less(model, kind: type, precision: str, march: str | None) -> tuple:
    """(library path, manifest, prompt chunk) of the model compiled by the recipes less `kind`,
    built in a temporary directory (never recorded in the cache under the recipes' key)."""
    return library_apart(model, precision, march, recipes_without(kind))


def library_apart(model, precision: str, march: str | None, recipes) -> tuple:
    """(library path, manifest, prompt chunk) of the model compiled while the context manager
    `recipes` changes the recipes, built in a temporary directory outside the cache."""
    from nanocompile.codegen.render import render_tree
    from nanocompile.codegen.tree import write_tree
    from nanocompile.compiler.build import cmake_build
    from nanocompile.engine.open import open_model

    d = Path(tempfile.mkdtemp(prefix="nc-without-"))
    # the library and the packed weights a session maps from it (a GB for the 1.5B shape): gone
    # with the process, so that probes run again and again do not fill the disk
    atexit.register(shutil.rmtree, d, ignore_errors=True)
    with recipes:  # a setting of the code generator is read while the C is written
        module = open_model(model, precision, march, tuned=False).compile(out=lambda _: None)
        write_tree(module, d / "tree")
        manifest = json.loads(render_tree(module)["manifest.json"])
    cmake_build(d / "tree", d / "build", {}, target=manifest["library"])
    return d / "build" / f"lib{manifest['library']}.so", manifest, module.max_chunk


def native_session_apart(model, march: str | None, recipes, n_ctx: int):
    """A native session of the model on a library compiled apart (library_apart) while the context
    manager that recipes() returns changes the recipes; its weights packed in that library's
    layout, beside it. recipes is called twice: a context manager runs once."""
    from nanocompile.engine.compiled import CompiledSession

    lib, manifest, chunk = library_apart(model, "native", march, recipes())
    with recipes():  # the session packs its weights in this library's layout
        return CompiledSession.from_weights(model.config, model.weights, n_ctx=n_ctx, threads=THREADS,
                                            weights_key=model.key, precision="native", march=march, tuned=False,
                                            library=(lib, manifest), max_chunk=chunk,
                                            packed_path=lib.parent / "weights.bin")


def main() -> None:
    from nanocompile import schedule
    from nanocompile.engine.compiled import CompiledSession
    from nanocompile.engine.precision import PRECISIONS
    from nanocompile.models import load_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directive", choices=["AmxSums", "FetchNextBlock", "PairSums", "PrefetchNext", "Unpack"])
    ap.add_argument("-m", "--model", default="default", help="'default', a GGUF file or a Hugging Face directory")
    ap.add_argument("--precision", default="f32", choices=list(PRECISIONS))
    ap.add_argument("--march", default=None, help="an x86-64 level below this CPU's (default: this CPU's)")
    ap.add_argument("--rounds", default=40, type=int)
    ap.add_argument("--pp", default=512, type=int)
    ap.add_argument("--tg", default=16, type=int)
    ap.add_argument("--verify", default=0, type=int, help="also a step of this many rows after the prompt")
    ap.add_argument("--no-append", action="store_true", help="do not append to bench/results.jsonl")
    args = ap.parse_args()
    if args.rounds < 1 or args.pp < 1 or args.tg < 0 or args.verify < 0:
        ap.error(f"--rounds and --pp at least 1, --tg and --verify at least 0 (got {args.rounds}, {args.pp}, "
                 f"{args.tg}, {args.verify})")
    pin_threads()
    model = load_model(args.model, progress=False)
    vocab = model.config.vocab_size  # ordinary ids of the default model; any of a tiny one
    ids = [int(t) for t in np.random.default_rng(0).integers(min(1000, vocab // 4), min(100000, vocab),
                                                             args.pp + max(args.tg, args.verify))]

    def session(library=None, chunk=None):
        extra = {"library": library, "max_chunk": chunk} if library else {}
        s = CompiledSession.from_weights(model.config, model.weights,
                                         n_ctx=args.pp + max(args.tg, args.verify) + 8, threads=THREADS,
                                         weights_key=model.key, precision=args.precision, march=args.march,
                                         tuned=False, **extra)
        s.step(ids[:16])  # warm-up: the weights faulted in, the pool started
        return s

    kind = getattr(schedule, args.directive)
    lib, manifest, chunk = library_less(model, kind, args.precision, args.march)
    sessions = {"recipes": session(), f"less {args.directive}": session((lib, manifest), chunk)}
    holding = [n for n, k in sessions["recipes"].module.kernels.items() if any(isinstance(d, kind) for d in k.schedule)]
    if not holding:
        raise SystemExit(f"the recipes hold no {args.directive} for this model and precision: nothing to compare")
    print(f"{args.directive} in {len(holding)} kernels of the recipes' library; none in the other", flush=True)
    names = list(sessions)
    tests = ("pp", "tg") + (("verify",) if args.verify else ())
    speeds = {test: {name: [] for name in names} for test in tests}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            s = sessions[name]
            s.reset()
            t0 = time.perf_counter()
            s.step(ids[:args.pp])
            t1 = time.perf_counter()
            for t in ids[args.pp:]:
                s.step([t])
            speeds["pp"][name].append(args.pp / (t1 - t0))
            if args.tg:
                speeds["tg"][name].append(args.tg / (time.perf_counter() - t1))
            if args.verify:  # rows per second of a verify step after the prompt (and the tokens)
                past = s.past
                t2 = time.perf_counter()
                s.step(ids[args.pp:args.pp + args.verify], all_logits=True)
                speeds["verify"][name].append(args.verify / (time.perf_counter() - t2))
                s.truncate(past)
        print(f"round {r}: " + ", ".join(f"{n} pp {speeds['pp'][n][-1]:.0f}" +
                                         (f" tg {speeds['tg'][n][-1]:.1f}" if args.tg else "") +
                                         (f" verify {speeds['verify'][n][-1]:.1f}" if args.verify else "")
                                         for n in names), flush=True)
    for s in sessions.values():
        s.close()
    result = {"bench": "without", "directive": args.directive, "model": str(model.source), "precision": args.precision,
              "march": args.march or "this CPU's", "rounds": args.rounds, "pp": args.pp, "tg": args.tg,
              "verify_rows": args.verify, "less_built_apart": True}
    for test in (t for t in tests if t != "tg" or args.tg):
        ratios = [a / b for a, b in zip(*speeds[test].values())]
        wins = sum(x > 1 for x in ratios)
        p = two_sided_sign_test(wins, len(ratios))
        for n in names:
            v = speeds[test][n]
            print(f"{n}: {test} median {statistics.median(v):.1f} t/s [{min(v):.1f}-{max(v):.1f}]")
        print(f"{test}: recipes / less {args.directive}: median {statistics.median(ratios):.3f} "
              f"[{min(ratios):.3f}-{max(ratios):.3f}], faster in {wins} of {len(ratios)} (sign test p = {p:.2g})")
        result[test] = {"engines": {n: summary(v) for n, v in speeds[test].items()}, "ratio": summary(ratios),
                        "wins": wins, "sign_test_p": p, "samples": speeds[test]}
    if not args.no_append:
        append(result)


if __name__ == "__main__":
    main()
