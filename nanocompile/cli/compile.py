"""`nanocompile compile`: ahead of time, build a model's library and pack its weights, so the
first `run` starts at once. Stages are named as they start; packing shows a progress bar."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from ..compiler import STAGE_NAMES
from ..engine.precision import AUTO, PRECISION_CHOICES


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return ""


def cmd_compile(args) -> int:
    from ..compiler.build import find_or_build
    from ..engine import warm
    from ..engine.open import open_model, tuned_store
    from ..engine.pack import open_packed
    from ..models import load_model


    def stage(name):
        print(f"[{time.perf_counter() - start:6.1f} s] {name}", file=sys.stderr, flush=True)

    start = time.perf_counter()
    stage(f"loading {args.model}")
    model = load_model(args.model, progress=not args.quiet)
    opened = open_model(model, args.precision, args.march, tuned=not args.no_tuned)
    stage(f"precision {opened.precision}")
    if args.dump_after:
        stage(f"compiling, printing the IR after stage {args.dump_after}")
        opened.compile(dump_after=args.dump_after)
        return 0
    stage("compiling: graph, passes, loop IR, schedules")
    module = opened.compile()
    stage(f"building the library ({module.march}, {len(module.kernels)} kernels) with CMake, or finding it built")
    lib, manifest = find_or_build(module)
    warm.remember(warm.warm_key(opened), warm.Built.of(module, lib, manifest))  # a run finds it without compiling
    stage("packed weights: checking the cache, or packing them from the model file")
    packed, _, made = open_packed(module.layout_hash, module.weights_bytes, opened.graph, opened.weights,
                                  model.key, lambda: module, progress=not args.quiet)
    stage("packing weights: done" if made else "packed weights: already in the cache")
    stage("done")
    print(f"model     {model.source}")
    print(f"library   {lib} ({_size(Path(lib).stat().st_size)}), fingerprint {module.fingerprint_hash[:16]}, "
          f"{module.march}")
    print(f"weights   {packed} ({_size(packed.stat().st_size)}), layout {module.layout_hash[:16]}, "
          f"{sum(1 for w in module.weights if w.packed)} of {len(module.weights)} tensors packed in blocks")
    print(f"workspace {_size(module.arena_bytes)} per session, plus the KV cache")
    if module.tuned_kernels:
        print(f"schedules {len(module.tuned_kernels)} of {len(module.kernels)} kernels tuned on this CPU "
              f"({tuned_store(args.march)}), the rest from the recipes")
    elif not module.stale_tuned_kernels:
        print("schedules the recipes" + ("" if args.no_tuned else " (no tuned schedules for this CPU: "
                                          "`nanocompile tune` measures them)"))
    if module.stale_tuned_kernels:
        print(f"{len(module.stale_tuned_kernels)} tuned schedules not used: measured against recipes that have "
              f"changed since (`nanocompile tune` measures them again)" + ("" if module.tuned_kernels else
                                                                          "; schedules the recipes"))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("compile", help="build a model's library and pack its weights ahead of time")
    p.add_argument("-m", "--model", default="default", help="'default', a GGUF file or a Hugging Face directory")
    p.add_argument("--precision", default=AUTO, choices=list(PRECISION_CHOICES),
                   help="auto (native for a quantized GGUF, else f32), f32, int8 or native (every matrix in "
                        "the GGUF's own blocks)")
    p.add_argument("--march", help="x86-64 level to compile for (default: this CPU's, e.g. x86-64-v4)")
    p.add_argument("--dump-after", choices=list(STAGE_NAMES), metavar="STAGE",
                   help=f"print the graph or loop IR after a stage and stop ({', '.join(STAGE_NAMES)})")
    p.add_argument("--no-tuned", action="store_true", help="the recipes' schedules even if tuned ones exist")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_compile)
