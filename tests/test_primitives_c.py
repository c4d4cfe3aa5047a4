"""Every primitive, lowered to a loop nest and compiled to C, against the interpreter.

Bitwise where the operation is exactly rounded and done in the same order (IEEE add, sub, mul,
div, sqrt, compare, select, casts, max, every movement); within a stated bound where it is not:
exp, sin and cos (glibc's float functions against NumPy's, 2 ulp) and sums (the C kernels add in
index order, NumPy pairwise or through BLAS: |error| <= n * eps * sum|terms|).
"""
import numpy as np
import pytest

from nanocompile import interpreter
from nanocompile.codegen.graph_library import GraphLibrary
from nanocompile.ir import PAST, SEQ, GraphBuilder

ENVS = [{"seq": s, "past": p} for s in (1, 3, 7) for p in (0, 5)]
EPS = np.finfo(np.float32).eps


def _feeds(graph, env, rng):
    from nanocompile.ir.expr import evaluate_shape
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


def _ulps(a, b):
    ai = a.view(np.int32).astype(np.int64)
    bi = b.view(np.int32).astype(np.int64)
    ai = np.where(ai < 0, -(1 << 31) - ai, ai)  # order floats as integers
    bi = np.where(bi < 0, -(1 << 31) - bi, bi)
    return np.abs(ai - bi)


def _graph(name, build):
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


@pytest.mark.parametrize("name", sorted(EXACT))
def test_exact_primitives_are_bitwise(name):
    g = _graph(name, EXACT[name])
    lib = GraphLibrary(g)
    rng = np.random.default_rng(len(name))
    for env in ENVS:
        inputs, weights = _feeds(g, env, rng)
        with np.errstate(all="ignore"):
            want = interpreter.run(g, env, inputs, weights)
        got = lib.run(env, inputs, weights)
        for k in want:
            assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, (name, k, env)
            assert np.array_equal(got[k].view(np.uint8), want[k].view(np.uint8)), (name, k, env)


@pytest.mark.parametrize("name", sorted(BOUNDED))
def test_bounded_primitives(name):
    g = _graph(name, BOUNDED[name])
    lib = GraphLibrary(g)
    rng = np.random.default_rng(len(name))
    for env in ENVS:
        inputs, weights = _feeds(g, env, rng)
        want = interpreter.run(g, env, inputs, weights)
        got = lib.run(env, inputs, weights)
        for k in want:
            assert got[k].shape == want[k].shape
            if name in ("exp", "sin", "cos"):
                assert _ulps(got[k], want[k]).max() <= 2, (name, env)
            else:
                # a sum of n terms in two orders differs by at most about n * eps * sum|terms|
                terms = _abs_terms(name, k, inputs, weights)
                n = terms[1]
                assert np.all(np.abs(got[k] - want[k]) <= n * EPS * terms[0] + 1e-30), (name, k, env)


def _abs_terms(name, key, inputs, weights):
    if name == "reduce_sum":
        x = np.abs(inputs["x"]).astype(np.float64)
        return (x.sum(1, keepdims=True), 37) if key == "out0" else (x.sum(0, keepdims=True), x.shape[0])
    if key == "out0":
        return np.abs(inputs["x"]).astype(np.float64) @ np.abs(weights["w"]).T.astype(np.float64), 19
    q, k = np.abs(inputs["q"]).astype(np.float64), np.abs(inputs["k"]).astype(np.float64)
    return q @ k.transpose(0, 2, 1), 8


def test_guard_regions_catch_a_write_outside_an_output():
    """The harness itself: a kernel that writes one element past its output is caught."""
    g = _graph("neg", EXACT["neg"])
    lib = GraphLibrary(g)
    text = lib.source.replace("for (int64_t i1 = 0; i1 < 6; ++i1)", "for (int64_t i1 = 0; i1 < 7; ++i1)")
    assert text != lib.source
    lib.load(lib.compile(text))
    inputs, weights = _feeds(g, {"seq": 3, "past": 0}, np.random.default_rng(0))
    with pytest.raises(AssertionError, match="wrote outside output"):
        lib.run({"seq": 3, "past": 0}, inputs, weights)
