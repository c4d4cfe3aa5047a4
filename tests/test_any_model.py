"""The compiler core knows no model: a step program that is not Qwen2 compiles through the same
stages into a library that agrees with the interpreter bitwise.

The model: ids -> embedding -> two residual ReLU MLP blocks -> x; a state buffer `memory`
[1, past, width] to which every step appends its rows of x; scores = (x + the running maximum of
memory over positions) @ W_out^T. Every value is a small integer (weights in {-1, 0, 1},
embeddings in [-2, 2]) and the largest partial sum is below 2^24, so float32 arithmetic is exact
in any order: the interpreter (NumPy's BLAS) and the compiled kernels must agree bit for bit.
"""
import ctypes

import numpy as np
import pytest

from nanocompile.codegen.options import Options
from nanocompile.compiler.build import find_or_build
from nanocompile.compiler.driver import compile_program
from nanocompile.engine.library import Library
from nanocompile.engine.pack import pack_weights
from nanocompile.ir import PAST, SEQ, GraphBuilder, interpreter
from nanocompile.ir.signature import VARIANTS, Signature, State, StepInput, StepOutput, StepProgram, WeightSpec

VOCAB, WIDTH, HIDDEN, BLOCKS = 37, 16, 16, 2


def mlp_graph(variant: str):
    b = GraphBuilder(f"mlp_{variant}")
    ids = b.input("ids", [SEQ], "i32")
    x = b.gather(b.weight("embed", [VOCAB, WIDTH]), ids)
    zero = b.broadcast(b.reshape(b.const(0.0), [1, 1]), [SEQ, HIDDEN])
    for i in range(BLOCKS):
        h = b.matmul(x, b.permute(b.weight(f"up.{i}", [HIDDEN, WIDTH]), [1, 0]))
        h = b.where(b.less_equal(h, zero), zero, h)  # ReLU
        x = b.add(x, b.matmul(h, b.permute(b.weight(f"down.{i}", [WIDTH, HIDDEN]), [1, 0])))
    memory = b.concat([b.input("memory", [1, PAST, WIDTH]), b.reshape(x, [1, SEQ, WIDTH])], 1)
    b.output("memory", memory)
    if variant == "none":
        return b.finish()
    if variant == "last":
        x = b.slice(x, 0, SEQ - 1, SEQ)
    rows = b.shape(x)[0]
    running_max = b.broadcast(b.reshape(b.reduce_max(memory, 1), [1, WIDTH]), [rows, WIDTH])
    b.output("scores", b.matmul(b.add(x, running_max), b.permute(b.weight("out", [VOCAB, WIDTH]), [1, 0])))
    return b.finish()


def mlp_program() -> StepProgram:
    shapes = {"embed": (VOCAB, WIDTH), "out": (VOCAB, WIDTH)}
    for i in range(BLOCKS):
        shapes[f"up.{i}"], shapes[f"down.{i}"] = (HIDDEN, WIDTH), (WIDTH, HIDDEN)
    sig = Signature("mlp", inputs=(StepInput("ids", "i32", VOCAB),), state=(State("memory", "memory", 0, WIDTH),),
                    outputs=(StepOutput("scores", VOCAB),),
                    weights=tuple(WeightSpec(n, s, n.replace(".", "_")) for n, s in shapes.items()),
                    max_positions=128, description=("A residual MLP that remembers its rows.",),
                    config={"model": "mlp", "vocab": VOCAB, "width": WIDTH})
    return StepProgram(sig, {v: mlp_graph(v) for v in VARIANTS})


def mlp_weights(seed=0):
    rng = np.random.default_rng(seed)
    w = {"embed": rng.integers(-2, 3, (VOCAB, WIDTH)), "out": rng.integers(-1, 2, (VOCAB, WIDTH))}
    for i in range(BLOCKS):
        w[f"up.{i}"] = rng.integers(-1, 2, (HIDDEN, WIDTH))
        w[f"down.{i}"] = rng.integers(-1, 2, (WIDTH, HIDDEN))
    return {k: v.astype(np.float32) for k, v in w.items()}


class StepLibrary:
    """The generated step library through its C interface, as a model-agnostic caller sees it."""

    def __init__(self, module, weights, path, n_ctx=64, threads=2):
        lib_path, manifest = find_or_build(module)
        self.lib = Library(lib_path, manifest["prefix"])
        pack_weights(module, weights, path)
        self.weights = np.fromfile(path, np.uint8)
        self.handle = ctypes.c_void_p()
        error = ctypes.create_string_buffer(256)
        rc = self.lib.init(ctypes.byref(self.handle), self.weights.ctypes.data, self.weights.size, n_ctx, threads,
                           error, len(error))
        assert rc == 0, error.value

    def step(self, ids, all_rows):
        ids = np.asarray(ids, np.int32)
        out = np.empty((len(ids) if all_rows else 1, self.lib.output_row()), np.float32)
        assert self.lib.step(self.handle, ids.ctypes.data, len(ids), out.ctypes.data, int(all_rows)) == 0
        return out

    def memory(self):
        out = np.empty((self.lib.past(self.handle), WIDTH), np.float32)
        assert self.lib.read_state(self.handle, 0, 0, out.ctypes.data) == 0
        return out


@pytest.mark.c
@pytest.mark.levels
def test_a_model_that_is_not_qwen2_compiles_and_agrees_bitwise(tmp_path):
    program, weights = mlp_program(), mlp_weights()
    module = compile_program(program, Options(max_chunk=8))
    assert {k.op for k in module.kernels.values()} >= {"gather", "matmul", "where", "add"}
    library = StepLibrary(module, weights, tmp_path / "weights.bin")
    memory = np.zeros((1, 0, WIDTH), np.float32)
    rng = np.random.default_rng(1)
    # the running maximum sees every row of a pass, so a step stays within one chunk (8 rows)
    for chunk, all_rows in ((8, True), (1, False), (3, False), (5, True), (1, False)):
        ids = rng.integers(0, VOCAB, chunk).astype(np.int32)
        env = {"seq": chunk, "past": memory.shape[1]}
        want = interpreter.run(program.graphs["all" if all_rows else "last"], env,
                               {"ids": ids, "memory": memory}, weights)
        memory = want["memory"]
        got = library.step(ids, all_rows)
        assert np.abs(want["scores"]).max() < 2 ** 22  # exact in float32: order cannot matter
        assert np.array_equal(got, want["scores"])
        assert np.array_equal(library.memory(), memory[0])
