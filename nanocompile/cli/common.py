"""What the commands share: flags, argument types, thread settings, opening a model."""
from __future__ import annotations

import argparse
import os
import sys

from ..errors import NanocompileError


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
    p.add_argument("--precision", default="f32", help="weights and arithmetic: f32 (int8 is a later phase)")
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


def sampler_from(args):
    from ..sampling import Sampler, SamplingParams
    return Sampler(SamplingParams(args.temp, args.top_k, args.top_p, args.min_p, args.repeat_penalty,
                                  args.repeat_last_n, args.seed))


def check_precision(precision: str) -> None:
    if precision != "f32":
        raise NanocompileError(f"--precision {precision}: only f32 is supported so far (int8 with AVX-VNNI is "
                               f"phase 6 of docs/ROADMAP.md)")


def open_model_session(args, n_ctx: int | None):
    """The model and a session on it; n_ctx None: 4096 or the model's maximum if smaller."""
    from ..models import load_model
    from ..session import open_session

    check_precision(args.precision)
    threads = getattr(args, "threads", 2)
    warn_if_oversubscribed(threads)
    model = load_model(args.model, progress=not args.quiet)
    if n_ctx is None:
        n_ctx = min(4096, model.config.max_position_embeddings)
    session = open_session(model, args.backend, n_ctx=n_ctx, threads=threads, progress=not args.quiet)
    return model, session
