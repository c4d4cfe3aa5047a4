"""What the commands share: flags, argument types, thread settings, opening a model."""
from __future__ import annotations

import argparse
import os
import sys

from ..engine.precision import AUTO, PRECISION_CHOICES


def positive_threads(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"threads must be an integer, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"threads must be at least 1, got {n}")
    return n


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def warn_if_oversubscribed(threads: int) -> None:
    """More threads than cores is allowed (the pool keeps going); say that they will share."""
    cores = usable_cores()
    if threads > cores:
        print(f"warning: -t {threads} is more threads than the {cores} cores this process can use; "
              f"they will take turns on them", file=sys.stderr)


def int_list(value: str) -> list[int]:
    """llama-bench's lists: 1,2,4 or a single number."""
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"want integers separated by commas, got {value!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("the list is empty")
    return out


def set_blas_threads(n: int) -> None:
    # the interpreter's matmuls run on NumPy's BLAS; it reads these before it starts
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)


def add_model_flags(p: argparse.ArgumentParser, threads: bool = True) -> None:
    p.add_argument("-m", "--model", default="default", help="'default', a GGUF file or a Hugging Face directory")
    if threads:
        p.add_argument("-t", "--threads", type=positive_threads, default=2,
                       help="threads (the interpreter passes them to NumPy's BLAS)")
    p.add_argument("--precision", default=AUTO, choices=list(PRECISION_CHOICES),
                   help="auto (default): native for a quantized GGUF, f32 otherwise; f32: float32 weights and "
                        "arithmetic; int8: Q8_0 weights, activations quantized in blocks of 32, exact int32 dot "
                        "products (norms, attention and the KV cache stay float32); native: every matrix in the "
                        "GGUF's own blocks (Q8_0/Q5_0/Q4_0 and the K formats), other types requantized to Q8_0 "
                        "(named on stderr)")
    p.add_argument("--backend", choices=["compiled", "interp"], default="compiled",
                   help="compiled: the whole-model C library (default); interp: the NumPy interpreter")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling (llama.cpp's defaults; --temp 0 is greedy)")
    g.add_argument("-s", "--seed", type=int, default=-1, help="random seed (-1: a random one, printed)")
    g.add_argument("--temp", type=float, default=0.8, help="temperature (<= 0: greedy)")
    g.add_argument("--top-k", type=int, default=40, help="keep the k most likely tokens (0: off)")
    g.add_argument("--top-p", type=float, default=0.95, help="keep the smallest set reaching this probability")
    g.add_argument("--min-p", type=float, default=0.05, help="drop tokens below min-p x the top probability")
    g.add_argument("--repeat-penalty", type=float, default=1.0, help="penalize recent tokens (1.0: off)")
    g.add_argument("--repeat-last-n", type=int, default=64, help="recent tokens the penalty looks at")


def sampling_from(args) -> dict:
    """The sampling flags as the API's keyword arguments, checked before the model loads."""
    from ..engine.sampling import SamplingParams

    params = SamplingParams(args.temp, args.top_k, args.top_p, args.min_p, args.repeat_penalty, args.repeat_last_n,
                            args.seed).check(flag_names=True)
    return dict(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p,
                repeat_penalty=params.repeat_penalty, repeat_last_n=params.repeat_last_n)


def add_lookup_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("prompt lookup (speculative decoding from the context: the same tokens, "
                             "several verified in one step)")
    g.add_argument("--lookup", action=argparse.BooleanOptionalAction, default=None,
                   help="draft tokens by finding the last tokens earlier in the context (docs/LOOKUP.md); "
                        "default: off, but on in serve where the library runs 16-lane VNNI products")
    g.add_argument("--draft-max", type=int, default=16, help="the most tokens drafted for one step (llama.cpp's name)")
    g.add_argument("--lookup-ngram-min", type=int, default=1, help="the shortest run of last tokens looked up")
    g.add_argument("--lookup-ngram-max", type=int, default=4, help="the longest run of last tokens looked up")


def lookup_params(args):
    """The lookup flags' parameters, checked before the model loads."""
    from ..engine.lookup import LookupParams

    return LookupParams(args.draft_max, args.lookup_ngram_min, args.lookup_ngram_max).check(flag_names=True)


def lookup_from(args):
    """The lookup flags as the API's lookup argument (False when off or not given)."""
    params = lookup_params(args)
    return params if args.lookup else False


def open_model(args, n_ctx: int | None):
    """The API's Model for the model flags; n_ctx None: 4096 or the model's maximum if smaller."""
    from ..api import Model

    warn_if_oversubscribed(getattr(args, "threads", 2))
    return Model(args.model, n_ctx=n_ctx, n_threads=getattr(args, "threads", 2), precision=args.precision,
                 backend=args.backend, seed=getattr(args, "seed", -1), progress=not args.quiet,
                 lookup=lookup_from(args) if hasattr(args, "lookup") else False)


def report(model) -> None:
    """llama-cli's line after a run: prompt and generation speed, backend, seed."""
    t = model.timings
    print(f"prompt: {t.prompt_tokens} tokens, {t.prompt_seconds * 1000:.1f} ms, {t.prompt_tps:.2f} tok/s | "
          f"generation: {t.generated_tokens} tokens, {t.decode_tps:.2f} tok/s | backend {model.backend} | "
          f"precision {model.precision} | seed {model.seed}", file=sys.stderr)
    if t.drafted_tokens:  # as llama.cpp's speculative example reports a draft
        steps = max(t.generated_tokens - t.accepted_tokens, 1)  # each step yields one token and what it accepted
        print(f"lookup: drafted {t.drafted_tokens}, accepted {t.accepted_tokens} ({100 * t.acceptance:.1f}%), "
              f"{t.verify_steps} verify steps, {t.generated_tokens / steps:.2f} tokens per step, "
              f"{t.lookup_seconds * 1000:.1f} ms drafting", file=sys.stderr)
