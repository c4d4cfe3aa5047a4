"""`nanocompile tune`: search each distinct kernel's schedules on this CPU within a time budget
and keep the winners in the cache, where `compile` and `run` find them (nanocompile/tune)."""
from __future__ import annotations

import sys

from ..engine.precision import PRECISION_CHOICES
from .common import positive_threads


def _summary(data: dict) -> list[str]:
    lines = [f"{'kernel':44} {'class':20} {'stable':7} {'gain':>6}  schedule in use"]
    for name, e in sorted(data["kernels"].items()):
        if "searches" not in e:
            continue
        stable = {True: "yes", False: "NO", None: "-"}[e.get("stable")]
        gain = f"{e['verify']['gain']:.3f}" if e.get("verify") else "-"
        use = ", ".join(e["use"]) if e.get("use") else "recipe"
        lines.append(f"{name:44} {e['class']:20} {stable:7} {gain:>6}  {use}")
    return lines


def cmd_tune(args) -> int:
    from tqdm import tqdm

    from ..engine.open import open_model
    from ..models import load_model
    from ..tune.store import load, store_path
    from ..tune.tuner import model_jobs, tune

    if args.budget <= 0:
        print(f"nanocompile: error: --budget {args.budget}: give a positive number of seconds", file=sys.stderr)
        return 1
    model = load_model(args.model, progress=not args.quiet)
    opened = open_model(model, args.precision, args.march)
    o = opened.options  # native: its K-format matrices' superblock kernels among them
    jobs, march = model_jobs(opened.config, o.march, opened.graph, o.superblocks, o.narrow, opened.precision)
    print(f"tuning {len(jobs)} kernels on this CPU ({march}, {args.threads} threads) for at most "
          f"{args.budget:.0f} s", file=sys.stderr)
    bar = None if args.quiet else tqdm(total=2 * len(jobs), desc="kernels searched (2 searches)", unit="kernel",
                                       leave=False, file=sys.stderr)
    interrupted = False
    try:
        data = tune(model.config, args.budget, args.threads, march, jobs=jobs, bar=bar,
                    say=lambda m: print(m, file=sys.stderr))
    except KeyboardInterrupt:
        interrupted = True
        data = load(store_path(march))
    finally:
        if bar is not None:
            bar.close()
    print("\n".join(_summary(data)))
    run = data.get("run", {})
    print(f"saved {store_path(march)}; {run.get('seconds', 0):.0f} s, peak memory {run.get('peak_rss_mib', 0):.0f} MiB"
          + ("; interrupted: what was measured is kept" if interrupted else ""), file=sys.stderr)
    return 130 if interrupted else 0


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="search the kernels' schedules on this CPU and keep the fastest")
    p.add_argument("-m", "--model", default="default", help="'default', a GGUF file or a Hugging Face directory")
    p.add_argument("--precision", default="f32", choices=list(PRECISION_CHOICES), help="auto, f32, int8 or native (native: the kernels native runs, "
                                                     "superblock kernels included)")
    p.add_argument("--budget", type=float, default=600, help="seconds the search may take in all (default 600)")
    p.add_argument("-t", "--threads", type=positive_threads, default=2, help="threads the kernels run on (default 2)")
    p.add_argument("--march", help="x86-64 level to tune for (default: this CPU's)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_tune)
