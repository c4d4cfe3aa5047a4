"""What the tests share besides bench/support (tiny models and their files, the oracle, the llama.cpp
peer): the targets this CPU runs, one graph per primitive with random feeds, the real prompts, a
server on the loopback."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nanocompile.codegen.options import Options
from nanocompile.compiler.driver import compile_program
from nanocompile.frontend import nn
from nanocompile.ir import PAST, SEQ, GraphBuilder, interpreter
from nanocompile.ir.expr import evaluate_shape
from nanocompile.ir.signature import StepProgram, plain_signature
from nanocompile.target import cpu_flags, detect_march, level_flags, missing_flags, vector_lanes

THREADS = (1, 2, 3, 8)
EPS = np.finfo(np.float32).eps

# targets ----------------------------------------------------------------------------------------

LEVELS = ("x86-64-v4", "x86-64-v3")  # the levels with vector code: AVX-512 and AVX2


def target_level() -> str:
    """The level the tests build for: this CPU's, or NANOCOMPILE_MARCH."""
    return detect_march()[0]


def target_lanes() -> int:
    return vector_lanes(target_level())


def require_level(march: str) -> None:
    """Skips (with the reason) a test of a level this CPU cannot run."""
    missing = sorted(set(level_flags(march)) - cpu_flags())
    if missing:
        pytest.skip(f"this CPU cannot run {march} code: it lacks {', '.join(missing)}")


EVEX_VNNI = {"avx512_vnni", "avx512vl"}  # vpdpbusd on 256-bit vectors in its AVX-512 encoding


def use_target(march: str, monkeypatch) -> None:
    """Builds for march from here on (NANOCOMPILE_MARCH), or skips, saying why. x86-64-v3+vnni
    (AVX-VNNI: vpdpbusd at 8 lanes) is also built on a CPU with AVX-512 VNNI and VL but no AVX-VNNI:
    the same instruction in its EVEX encoding (-mavx512vnni -mavx512vl, which nc_vector.h takes
    first), so the 8-lane VNNI kernels are tested there too."""
    import nanocompile.target as target
    from nanocompile.codegen import render
    from nanocompile.compiler import graph_library

    flags = target.cpu_flags()
    if march == "x86-64-v3+vnni" and march not in target.runnable_targets() and EVEX_VNNI <= flags:
        monkeypatch.setattr(target, "cpu_flags", lambda: flags | {"avx_vnni"})
        own = target.compiler_flags

        def evex(m: str) -> list[str]:
            return [f for flag in own(m) for f in (("-mavx512vnni", "-mavx512vl") if flag == "-mavxvnni" else (flag,))]

        monkeypatch.setattr(graph_library, "compiler_flags", evex)
        monkeypatch.setattr(render, "compiler_flags", evex)
    elif march not in target.runnable_targets():
        pytest.skip(f"this CPU cannot run {march} code: it lacks {', '.join(missing_flags(level_flags(march)))}")
    monkeypatch.setenv("NANOCOMPILE_MARCH", march)


def require_lanes(lanes: int) -> None:
    require_level({16: "x86-64-v4", 8: "x86-64-v3"}[lanes])



ENVS = [{"seq": s, "past": p} for s in (1, 3, 7) for p in (0, 5)]


def narrow_dot_call(bits: int, lanes: int, pairs: bool = False, half_known: bool = True) -> str:
    """The generated call of a dot product on `bits`-bit weights, with p where it sums int16
    pairs. At 8 lanes the h form takes its unit's address and a literal half, where every term of
    the weight's index is a multiple of 64 (runtime/nc_vector.h); else the form that finds both."""
    p = "p" if pairs else ""
    return f"nc_dot4u{bits}{'h' if lanes == 8 and half_known else ''}{p}_{lanes}("


def calls_narrow_dot(source: str, bits: int, lanes: int, pairs: bool = False) -> bool:
    return any(narrow_dot_call(bits, lanes, pairs, known) in source for known in (True, False))


def superblock_values(parts: dict, fmt) -> np.ndarray:
    """What superblock_matmul multiplies: sc * d * qs - mn * dmin per sub-block, as float32."""
    per_super = fmt.block // fmt.sub
    scale = parts["sc"].astype(np.float32) * np.repeat(parts["d"].astype(np.float32), per_super, axis=1)
    w = np.repeat(scale, fmt.sub, axis=1) * parts["qs"].astype(np.float32)
    if fmt.has_min:
        least = parts["mn"].astype(np.float32) * np.repeat(parts["dmin"].astype(np.float32), per_super, axis=1)
        w = w - np.repeat(least, fmt.sub, axis=1)
    return w


def make_graph(name, build):
    """A graph whose outputs out0, out1, ... are what build(builder) returns."""
    b = GraphBuilder(name)
    out = build(b)
    for i, o in enumerate(out if isinstance(out, list) else [out]):
        b.output(f"out{i}", o)
    return b.finish()


def x_(b, shape=(SEQ, 6), name="x", dtype="f32"):
    """The input called name, made on first use (each test graph reads its inputs several times)."""
    existing = b.graph.inputs().get(name)
    if existing is not None:
        assert existing.dtype == dtype
        return existing.id
    return b.input(name, list(shape), dtype)


def feeds(graph, env, rng):
    """Random inputs and weights for a graph at the sizes env gives."""
    inputs = {}
    for name, node in graph.inputs().items():
        shape = evaluate_shape(node.shape, env)
        if node.dtype == "f32":
            inputs[name] = (rng.standard_normal(shape) * 2).astype(np.float32)
        elif node.dtype == "i32":  # also valid rows of the gather test's 10-row table
            inputs[name] = rng.integers(0, 10, shape).astype(np.int32)
        else:
            inputs[name] = rng.integers(0, 2, shape).astype(bool)
    weights = {name: (rng.standard_normal(evaluate_shape(n.shape, env))).astype(np.float32)
               for name, n in graph.weights().items()}
    return inputs, weights


def ulps(a, b):
    """How many float32 values apart a and b are, elementwise."""
    ai = a.view(np.int32).astype(np.int64)
    bi = b.view(np.int32).astype(np.int64)
    ai = np.where(ai < 0, -(1 << 31) - ai, ai)  # order floats as integers
    bi = np.where(bi < 0, -(1 << 31) - bi, bi)
    return np.abs(ai - bi)


EXACT = {
    "add": lambda b: b.add(x_(b), x_(b, name="y")),
    "sub": lambda b: b.sub(x_(b), x_(b, name="y")),
    "mul": lambda b: b.mul(x_(b), x_(b, name="y")),
    "div": lambda b: b.div(x_(b), x_(b, name="y")),
    "neg": lambda b: b.neg(x_(b)),
    "sqrt": lambda b: b.sqrt(b.mul(x_(b), x_(b))),
    "reciprocal": lambda b: b.reciprocal(x_(b)),
    "where_less_equal": lambda b: b.where(b.less_equal(x_(b), x_(b, name="y")), x_(b), x_(b, name="y")),
    "cast": lambda b: [b.cast(x_(b), "i32"), b.cast(x_(b, name="i", dtype="i32"), "f32"),
                       b.cast(x_(b, name="m", dtype="bool"), "f32")],
    "int_arith": lambda b: [b.add(x_(b, name="i", dtype="i32"), x_(b, name="j", dtype="i32")),
                            b.mul(x_(b, name="i", dtype="i32"), x_(b, name="j", dtype="i32")),
                            b.neg(x_(b, name="i", dtype="i32"))],
    "reduce_max": lambda b: [b.reduce_max(x_(b), 1), b.reduce_max(x_(b), 0)],
    "gather": lambda b: b.gather(b.weight("table", [10, 5]), x_(b, (SEQ,), "i", "i32")),
    "iota_dim": lambda b: [b.iota(PAST + SEQ), b.add(b.iota(SEQ), b.broadcast(b.reshape(b.dim(PAST), [1]), [SEQ]))],
    "const": lambda b: b.mul(x_(b, (SEQ, 3)), b.broadcast(b.reshape(b.const([0.5, -2.0, 3.25]), [1, 3]), [SEQ, 3])),
    "movement": lambda b: [
        b.permute(x_(b, (2, SEQ, 3), "a"), [1, 2, 0]),
        b.broadcast(b.reshape(x_(b, (SEQ,), "v"), [1, SEQ, 1]), [4, SEQ, 3]),
        b.slice(x_(b), 1, 1, 5),
        b.slice(x_(b), 0, SEQ - 1, SEQ),
        b.reshape(x_(b), [SEQ, 2, 3]),
    ],
    "reshape_copy": lambda b: b.reshape(b.permute(x_(b, (SEQ, 4, 2), "a"), [1, 0, 2]), [4 * SEQ, 2]),
    "concat": lambda b: [b.concat([x_(b, (2, PAST, 3), "c"), x_(b, (2, SEQ, 3), "n")], 1),
                         b.concat([b.neg(b.slice(x_(b), 1, 3, 6)), b.slice(x_(b), 1, 0, 3)], 1)],
}

BOUNDED = {
    "exp": lambda b: b.exp(x_(b)),
    "sin": lambda b: b.sin(b.mul(x_(b), x_(b, name="y"))),
    "cos": lambda b: b.cos(b.mul(x_(b), x_(b, name="y"))),
    "reduce_sum": lambda b: [b.reduce_sum(x_(b, (SEQ, 37)), 1), b.reduce_sum(x_(b), 0)],
    "matmul": lambda b: [b.matmul(x_(b, (SEQ, 19)), b.permute(b.weight("w", [11, 19]), [1, 0])),
                         b.matmul(x_(b, (3, SEQ, 8), "q"), b.permute(x_(b, (3, PAST + SEQ, 8), "k"), [0, 2, 1]))],
}


def graph_kernels(graph, fuse=True):
    """The kernels a graph compiles to (fused unless told otherwise), unscheduled."""
    program = StepProgram(plain_signature(graph), {"run": graph})
    return compile_program(program, Options(fuse=fuse, schedule=False)).kernels


# a tiny GGUF with K formats ----------------------------------------------------------------------

K_CFG = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=256, layers=2, vocab=300)  # down: whole 256-blocks
K_TYPES = {"model.layers.0.mlp.down_proj.weight": "Q4_K", "model.layers.1.mlp.down_proj.weight": "Q6_K",
           "model.layers.0.mlp.up_proj.weight": "Q5_0"}


def write_k_gguf(path: Path) -> Path:
    """The tiny model with a Q4_K and a Q6_K down projection (ggml's reference quantizer), a Q5_0
    up projection and Q8_0 elsewhere: a file native runs entirely as stored."""
    from bench.support.tiny import random_weights, tiny_config, write_gguf

    cfg = tiny_config(**K_CFG)
    return write_gguf(path, cfg, random_weights(cfg, seed=21), tensor_types=K_TYPES)


# the real model's prompts -----------------------------------------------------------------------

REAL_PROMPTS = {
    "code": "def quicksort(arr):\n",
    "english": "The three laws of thermodynamics are",
    "chat": None,  # a chat-templated question, rendered with the model's template
}
N_TOKENS = 32


def real_prompt_ids(model, name):
    tok = model.tokenizer
    if name == "chat":
        return tok.encode(tok.render_chat([{"role": "user", "content": "Write a haiku about compilers."}]))
    return tok.encode(REAL_PROMPTS[name])


def greedy_run(session, ids, n):
    """Greedy tokens and the logits before each of them, on a nanocompile session."""
    session.reset()
    prompt_logits = session.step(ids, all_logits=True)
    logits, tokens, steps = prompt_logits[-1], [], []
    for _ in range(n):
        steps.append(logits)
        tokens.append(int(np.argmax(logits)))
        logits = session.step([tokens[-1]])
    return {"tokens": tokens, "step_logits": steps, "prompt_logits": prompt_logits}


# int8 projections (test_int8, test_narrow, test_superblock) -------------------------------------

TARGETS = ["x86-64-v4+vnni", "x86-64-v4", "x86-64-v3+vnni", "x86-64-v3", "x86-64"]
ENVS = [{"seq": s, "past": p} for s in (1, 3, 7) for p in (0, 5)]


def projection_graph(k, n):
    """x f32[seq, k] quantized in blocks, times an int8 weight [n, k]: both outputs and the
    quantized activations."""
    kp = nn.padded(k)

    def build(b):
        x = b.input("x", [SEQ, k])
        xq, xd = nn.quantize_blocks(b, x)
        return [b.block_matmul(xq, xd, b.weight("wq", [n, kp], "i8"), b.weight("wd", [n, kp // 32], "f16")), xq, xd]

    return make_graph(f"q8_{k}x{n}", build)


def activations(seq, k, rng, kind="normal"):
    x = (rng.standard_normal((seq, k)) * 3).astype(np.float32)
    if kind == "zero_block":
        x[:, :32] = 0.0
    elif kind == "outlier":
        x[:, 5] = 1e4  # one large value: the rest of its block rounds to 0
    return x


def check_bitwise(lib, g, w, rng, threads=THREADS, kinds=("normal", "zero_block", "outlier"), envs=ENVS[::2]):
    k = g.inputs()["x"].shape[1].as_int()
    for env in envs:
        for kind in kinds:
            x = activations(env["seq"], k, rng, kind)
            want = interpreter.run(g, env, {"x": x}, w)
            for t in threads:
                got = lib.run(env, {"x": x}, w, threads=t)
                for key in want:
                    assert got[key].dtype == want[key].dtype
                    assert np.array_equal(got[key].view(np.uint8), want[key].view(np.uint8)), (key, env, kind, t)


# a server ---------------------------------------------------------------------------------------

class LiveServer:
    """uvicorn serving an app on a free loopback port, in a thread of this process."""

    def __init__(self, app):
        import socket
        import threading
        import time

        import uvicorn  # the serve extra: imported here, so that other tests do not need it

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        end = time.time() + 30
        while not self.server.started:
            assert time.time() < end and self.thread.is_alive()
            time.sleep(0.02)

    def health(self) -> dict:
        import httpx

        return httpx.get(self.url + "/health").json()

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)
