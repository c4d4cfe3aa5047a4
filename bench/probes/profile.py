"""Per-kernel times of one prefill and one decode step, from a library built with
NANOCOMPILE_PROFILE (every kernel call timed on thread 0, to the end of its barrier).

    python -m bench.probes.profile [int8|f32|native] [prompt tokens] [--chunk N] [--threads N]
                                   [--verify K]   # also a step of K rows with every row's logits
                                                     # prints; appends to bench/results.jsonl
"""
from __future__ import annotations

import atexit
import ctypes
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.support.measure import THREADS


def profile(model, prompt, module, precision: str | None = None, threads: int = THREADS, verify: int = 0,
            sequences: int = 0) -> dict:
    """Per-kernel times of one prefill and one decode step, from a NANOCOMPILE_PROFILE build.
    precision: the session's (native's module is int8's graph, so module.precision says int8).
    verify: also a step of that many rows after the prompt, every row's logits read (the shape
    of a speculative verify step, docs/LOOKUP.md), rolled back before the decode step.
    sequences: also a batched step of that many sequences, one row each, every one after the same
    prompt in a slot of its own (the server's decoding step at that many clients, docs/SERVER.md)."""
    import numpy as np

    from nanocompile.codegen.render import render_tree
    from nanocompile.codegen.tree import write_tree
    from nanocompile.compiler.build import cmake_build
    from nanocompile.engine.compiled import CompiledSession

    d = Path(tempfile.mkdtemp(prefix="nc-profile-"))
    atexit.register(shutil.rmtree, d, ignore_errors=True)  # the profiling build: gone with the process
    write_tree(module, d / "tree")
    manifest = json.loads(render_tree(module)["manifest.json"])
    cmake_build(d / "tree", d / "build", {"NANOCOMPILE_PROFILE": "ON"}, target=manifest["library"])
    lib_path = d / "build" / f"lib{manifest['library']}.so"
    s = CompiledSession.from_weights(model.config, model.weights, n_ctx=len(prompt) + 8 + verify, threads=threads,
                        weights_key=model.key, library=(lib_path, manifest), precision=precision or module.precision,
                        max_chunk=module.max_chunk)
    p = manifest["prefix"]
    lib = s.lib.cdll
    for name, res in (("profile_kernels", ctypes.c_int32), ("profile_name", ctypes.c_char_p),
                      ("profile_ns", ctypes.c_uint64), ("profile_calls", ctypes.c_uint64)):
        getattr(lib, p + name).restype = res
    getattr(lib, p + "profile_name").argtypes = [ctypes.c_int32]
    getattr(lib, p + "profile_ns").argtypes = [ctypes.c_int32]
    getattr(lib, p + "profile_calls").argtypes = [ctypes.c_int32]

    def measure(tokens, all_logits=False, batch=None):
        getattr(lib, p + "profile_reset")()
        t0 = time.perf_counter()
        logits = s.step(tokens, all_logits=all_logits) if batch is None else s.step_batch(batch)
        wall = time.perf_counter() - t0
        by_kernel = {}
        for i in range(getattr(lib, p + "profile_kernels")()):
            calls = getattr(lib, p + "profile_calls")(i)
            if calls:
                name = getattr(lib, p + "profile_name")(i).decode()
                by_kernel[name] = {"ns": getattr(lib, p + "profile_ns")(i), "calls": calls}
        inside = sum(k["ns"] for k in by_kernel.values()) / 1e9
        matmul = sum(k["ns"] for n, k in by_kernel.items() if n.startswith("matmul")) / 1e9
        top = sorted(by_kernel.items(), key=lambda kv: -kv[1]["ns"])[:8]
        return logits, {"wall_s": wall, "matmul_s": matmul, "other_kernels_s": inside - matmul,
                        "outside_s": wall - inside, "calls": sum(k["calls"] for k in by_kernel.values()),
                        "top": [{"kernel": n, "ms": k["ns"] / 1e6, "calls": k["calls"]} for n, k in top],
                        "kernels": {n: k["ns"] / 1e6 for n, k in by_kernel.items()}}

    s.step(prompt[:1])  # warm-up: every weight faulted in, the pool started (else a short prompt times the faults)
    s.reset()
    logits, prefill = measure(prompt)
    phases = {"prefill": prefill}
    if verify:
        past = s.past
        s.step(prompt[:verify], all_logits=True)  # warm-up: the pages of every row's logits faulted in
        s.truncate(past)
        _, phases[f"verify {verify} rows"] = measure(prompt[:verify], all_logits=True)
        s.truncate(past)
    token = int(np.argmax(logits))
    if sequences:
        past = s.past
        others = s.sequences(sequences)[1:]
        for o in others:
            o.step(prompt)
        _, phases[f"{sequences} sequences"] = measure(None, batch=[(x, [token], False) for x in [s] + others])
        s.truncate(past)
    _, phases["decode"] = measure([token])
    s.close()
    return phases


def print_beside(prof: dict, phase: str, top: int) -> None:
    """The kernels of a phase beside the decode step's: where the extra rows' time goes."""
    one, many = prof["decode"]["kernels"], prof[phase]["kernels"]
    print(f"{phase} against one row: {prof[phase]['wall_s'] * 1e3:.1f} ms against {prof['decode']['wall_s'] * 1e3:.1f}")
    for name in sorted(many, key=lambda n: one.get(n, 0.0) - many[n])[:top]:
        print(f"    {name:45} {many[name]:8.2f} ms  one row {one.get(name, 0.0):8.2f} ms  "
              f"extra {many[name] - one.get(name, 0.0):7.2f}")


def print_profile(prof: dict, top: int) -> None:
    for phase, q in prof.items():
        print(f"profile {phase}: wall {q['wall_s'] * 1e3:.1f} ms = matmul {q['matmul_s'] * 1e3:.1f} + other kernels "
              f"{q['other_kernels_s'] * 1e3:.1f} + outside {q['outside_s'] * 1e3:.2f} ms, {q['calls']} calls")
        for t in q["top"][:top]:
            print(f"    {t['kernel']:45} {t['ms']:9.2f} ms  {t['calls']} calls")




def main() -> None:
    import argparse

    from bench.support.measure import append, positive_int
    from nanocompile.codegen.options import DEFAULT_CHUNK
    from nanocompile.engine.precision import PRECISIONS

    from nanocompile.engine.compiled import CompiledSession
    from nanocompile.models import load_model

    ap = argparse.ArgumentParser(description="per-kernel times of a prompt and a decode step")
    ap.add_argument("precision", nargs="?", default="int8", choices=PRECISIONS)
    ap.add_argument("prompt", nargs="?", type=positive_int, default=512, help="prompt tokens")
    ap.add_argument("--chunk", type=positive_int, default=DEFAULT_CHUNK,
                    help="prompt rows a pass takes (the library's)")
    ap.add_argument("--threads", type=positive_int, default=THREADS)
    ap.add_argument("--verify", type=positive_int, default=None,
                    help="also a step of this many rows with every row's logits (a verify step)")
    ap.add_argument("--sequences", type=positive_int, default=None,
                    help="also a batched step of this many sequences, one row each (the server's step)")
    ap.add_argument("-m", "--model", default="default", help="'default', a GGUF file or a Hugging Face directory")
    args = ap.parse_args()
    precision, n = args.precision, args.prompt
    model = load_model(args.model, progress=False)
    s = CompiledSession.from_weights(model.config, model.weights, n_ctx=n + 8 + (args.verify or 0), threads=args.threads, weights_key=model.key,
                        precision=precision, max_chunk=args.chunk)
    module = s.module
    s.close()
    prompt = [int(t) for t in np.random.default_rng(0).integers(1000, 100000, n)]
    prof = profile(model, prompt, module, precision, args.threads, args.verify or 0, args.sequences or 0)
    print_profile(prof, 10)
    if args.verify:
        print_beside(prof, f"verify {args.verify} rows", 16)
    if args.sequences:
        print_beside(prof, f"{args.sequences} sequences", 16)
    append({"bench": "profile", "model": str(model.source), "precision": precision, "prompt": n, "march": module.options.march,
            "chunk": args.chunk, "profile_threads": args.threads, **prof})


if __name__ == "__main__":
    main()
