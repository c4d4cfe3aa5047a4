"""Phase 3: fusion. The fused library against the unfused one (phase 2's), both float32 on the
same weights, alternating in one process; the fused patterns alone (rms_norm, SwiGLU, softmax)
against NumPy at decode and prefill shapes; the work each moves; a profile of the fused step.

    python -m bench.history.phase3 [--rounds 3] [--prompt 32] [--decode 16]
"""
from __future__ import annotations

import argparse
import json
import time

from bench.support.measure import THREADS, append, pin_threads, sign_test, summary, timed_run

pin_threads()


def pattern_graphs():
    """(name, graph builder, numpy function) for each fused pattern, as the frontend writes it."""
    from nanocompile.frontend import nn
    from nanocompile.ir import SEQ, GraphBuilder

    def rms(width):
        b = GraphBuilder(f"rms_norm_{width}")
        b.output("y", nn.rms_norm(b, b.input("x", [SEQ, width]), b.input("g", [width]), 1e-6))
        return b.finish()

    def swiglu(width):
        b = GraphBuilder(f"swiglu_{width}")
        b.output("y", b.mul(nn.silu(b, b.input("gate", [SEQ, width])), b.input("up", [SEQ, width])))
        return b.finish()

    def softmax(heads, keys):
        b = GraphBuilder(f"softmax_{heads}x{keys}")
        b.output("y", nn.softmax(b, b.input("x", [heads, SEQ, keys])))
        return b.finish()

    import numpy as np
    eps = np.float32(1e-6)

    def np_rms(x, g):
        return g * (x * (np.float32(1) / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps)))

    def np_swiglu(gate, up):
        return gate * (np.float32(1) / (np.float32(1) + np.exp(-gate))) * up

    def np_softmax(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    return [("rms_norm", rms(896), np_rms), ("swiglu", swiglu(4864), np_swiglu),
            ("softmax", softmax(14, 128), np_softmax)]


def time_patterns(repeats: int = 200) -> list[dict]:
    import numpy as np

    from nanocompile.compiler.graph_library import GraphLibrary
    from nanocompile.ir.expr import evaluate_shape

    rows = []
    rng = np.random.default_rng(0)
    for name, graph, fn in pattern_graphs():
        lib = GraphLibrary(graph, max_seq=64, max_past=0, fuse=True)
        for seq in (1, 64):
            env = {"seq": seq, "past": 0}
            inputs = {k: rng.standard_normal(evaluate_shape(n.shape, env)).astype(np.float32)
                      for k, n in graph.inputs().items()}
            args = [inputs[k] for k in graph.inputs()]
            ours, theirs = [], []
            for i in range(repeats):
                for who in ((0, 1) if i % 2 == 0 else (1, 0)):
                    t0 = time.perf_counter()
                    if who == 0:
                        lib.run(env, inputs, {}, guard=0)
                    else:
                        fn(*args)
                    (ours if who == 0 else theirs).append(time.perf_counter() - t0)
            shape = "x".join(str(d) for d in evaluate_shape(graph.nodes[graph.outputs["y"]].shape, env))
            rows.append({"pattern": name, "shape": shape, "fused_us": summary(ours)["median"] * 1e6,
                         "numpy_us": summary(theirs)["median"] * 1e6})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--decode", type=int, default=16)
    args = ap.parse_args()

    import numpy as np

    from bench.history.phase2 import print_profile, profile, work_report
    from nanocompile.compiler.driver import compile_model
    from nanocompile.engine.compiled import CompiledSession
    from nanocompile.models import load_model

    model = load_model("default", progress=False)
    fused_m, unfused_m = compile_model(model.config), compile_model(model.config, fuse=False)
    work = {"unfused": work_report(unfused_m), "fused": work_report(fused_m)}
    patterns = time_patterns()
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, 150000, args.prompt)]
    prof = profile(model, prompt, fused_m)

    n_ctx = args.prompt + args.decode + 1
    sessions = {"unfused": CompiledSession.from_weights(model.config, model.weights, n_ctx, THREADS, model.key, fuse=False),
                "fused": CompiledSession.from_weights(model.config, model.weights, n_ctx, THREADS, model.key)}

    prefill = {k: [] for k in sessions}
    decode = {k: [] for k in sessions}
    per_round = {k: [] for k in sessions}
    for r in range(args.rounds):
        for name in (("unfused", "fused") if r % 2 == 0 else ("fused", "unfused")):
            p, steps = timed_run(sessions[name], prompt, args.decode)
            prefill[name].append(p)
            decode[name].extend(steps)
            per_round[name].append(float(np.median(steps)))

    results = {}
    print(f"phase 3, {THREADS} threads requested (the library runs one), {args.rounds} rounds, "
          f"prompt {args.prompt}, decode {args.decode}")
    for name in sessions:
        p, d = summary(prefill[name]), summary(decode[name])
        results[name] = {"prefill_s": p, "decode_step_s": d}
        print(f"  {name:8} prefill {p['median'] * 1e3:8.1f} ms (min {p['min'] * 1e3:8.1f}) | decode step "
              f"{d['median'] * 1e3:7.1f} ms (min {d['min'] * 1e3:7.1f}, max {d['max'] * 1e3:7.1f})")
    speed = results["unfused"]["decode_step_s"]["median"] / results["fused"]["decode_step_s"]["median"]
    pspeed = results["unfused"]["prefill_s"]["median"] / results["fused"]["prefill_s"]["median"]
    wins = sum(f < u for f, u in zip(per_round["fused"], per_round["unfused"]))
    print(f"  fused is {speed:.2f}x faster at decode (ahead in {wins} of {args.rounds} rounds, sign test "
          f"p = {sign_test(wins, args.rounds):.3f}), {pspeed:.2f}x at prefill")
    for k, w in work.items():
        print(f"work {k}: {json.dumps(w)}")
    for row in patterns:
        print(f"pattern {row['pattern']:9} [{row['shape']:>10}]  fused C {row['fused_us']:9.1f} us   "
              f"NumPy {row['numpy_us']:9.1f} us")
    print_profile(prof, 8)
    append({"bench": "phase3", "rounds": args.rounds, "prompt_tokens": args.prompt, "decode_tokens": args.decode,
            "engines": results, "fused_decode_speedup": speed, "fused_prefill_speedup": pspeed,
            "fused_decode_wins": wins, "work": work, "patterns": patterns, "profile": prof})


if __name__ == "__main__":
    main()
