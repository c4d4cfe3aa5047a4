"""The interpreter: each primitive against the NumPy it is defined as, at symbolic sizes."""
import dataclasses

import numpy as np
import pytest

from nanocompile.ir import PAST, SEQ, Expr, GraphBuilder, interpreter
from nanocompile.ir.interpreter import InterpreterError

ENVS = [{"seq": 1, "past": 0}, {"seq": 3, "past": 5}, {"seq": 7, "past": 2}]


def _run(build, env, inputs):
    b = GraphBuilder("t")
    out = build(b)
    b.output("out", out)
    return interpreter.run(b.finish(), env, inputs, {})["out"]


@pytest.mark.parametrize("env", ENVS)
def test_elementwise_and_reductions(env):
    rng = np.random.default_rng(env["seq"])
    s = env["seq"]
    a = rng.standard_normal((s, 6)).astype(np.float32)
    c = rng.standard_normal((s, 6)).astype(np.float32) + 3
    feeds = {"a": a, "c": c}
    cases = {
        "add": (lambda b, x, y: b.add(x, y), a + c), "sub": (lambda b, x, y: b.sub(x, y), a - c),
        "mul": (lambda b, x, y: b.mul(x, y), a * c), "div": (lambda b, x, y: b.div(x, y), a / c),
        "neg": (lambda b, x, y: b.neg(x), -a), "sqrt": (lambda b, x, y: b.sqrt(y), np.sqrt(c)),
        "reciprocal": (lambda b, x, y: b.reciprocal(y), np.float32(1) / c),
        "exp": (lambda b, x, y: b.exp(x), np.exp(a)), "sin": (lambda b, x, y: b.sin(x), np.sin(a)),
        "cos": (lambda b, x, y: b.cos(x), np.cos(a)),
        "reduce_sum": (lambda b, x, y: b.reduce_sum(x, 1), a.sum(1, keepdims=True)),
        "reduce_max": (lambda b, x, y: b.reduce_max(x, 0), a.max(0, keepdims=True)),
        "where": (lambda b, x, y: b.where(b.less_equal(x, y), x, y), np.where(a <= c, a, c)),
        "cast": (lambda b, x, y: b.cast(b.cast(y, "i32"), "f32"), c.astype(np.int32).astype(np.float32)),
    }
    for name, (fn, want) in cases.items():
        got = _run(lambda b: fn(b, b.input("a", [SEQ, 6]), b.input("c", [SEQ, 6])), env, feeds)
        assert got.dtype == np.float32 and np.array_equal(got, want), name


@pytest.mark.parametrize("env", ENVS)
def test_sources_and_movement(env):
    s, p = env["seq"], env["past"]
    rng = np.random.default_rng(0)
    cache = rng.standard_normal((2, p, 4)).astype(np.float32)
    new = rng.standard_normal((2, s, 4)).astype(np.float32)
    feeds = {"cache": cache, "new": new}

    def both(b):
        return b.input("cache", [2, PAST, 4]), b.input("new", [2, SEQ, 4])

    assert np.array_equal(_run(lambda b: b.concat(list(both(b)), 1), env, feeds), np.concatenate([cache, new], 1))
    assert np.array_equal(_run(lambda b: b.iota(PAST + SEQ), env, feeds), np.arange(p + s, dtype=np.int32))
    assert _run(lambda b: b.dim(PAST * 2 + SEQ), env, feeds) == 2 * p + s
    got = _run(lambda b: b.reshape(b.permute(both(b)[1], [1, 0, 2]), [SEQ, 8]), env, feeds)
    assert np.array_equal(got, new.transpose(1, 0, 2).reshape(s, 8))
    got = _run(lambda b: b.slice(both(b)[1], 1, SEQ - 1, SEQ), env, feeds)
    assert np.array_equal(got, new[:, s - 1:s])
    got = _run(lambda b: b.broadcast(b.reshape(b.const(2.5), [1, 1]), [SEQ, 3]), env, feeds)
    assert np.array_equal(got, np.full((s, 3), 2.5, np.float32))
    table = rng.standard_normal((10, 4)).astype(np.float32)
    idx = np.arange(s, dtype=np.int32) % 10
    got = _run(lambda b: b.gather(b.input("t", [10, 4]), b.input("i", [SEQ], "i32")), env, {"t": table, "i": idx})
    assert np.array_equal(got, table[idx])

    def attention_scores(b):
        c, n = both(b)
        return b.matmul(n, b.permute(b.concat([c, n], 1), [0, 2, 1]))

    got = _run(attention_scores, env, feeds)
    assert np.array_equal(got, np.matmul(new, np.concatenate([cache, new], 1).transpose(0, 2, 1)))


def test_result_that_breaks_inference_is_caught():
    b = GraphBuilder("t")
    x = b.input("x", [SEQ, 4])
    b.output("y", b.exp(x))
    g = b.finish()
    g.nodes[1] = dataclasses.replace(g.nodes[1], shape=(SEQ, Expr.of(5)))  # a lie the interpreter must notice
    with pytest.raises(InterpreterError, match="inference promised"):
        interpreter.run(g, {"seq": 2, "past": 0}, {"x": np.zeros((2, 4), np.float32)}, {})


def test_feeds_are_checked():
    b = GraphBuilder("t")
    b.output("y", b.exp(b.input("x", [SEQ, 4])))
    g = b.finish()
    with pytest.raises(InterpreterError, match="was not given"):
        interpreter.run(g, {"seq": 2, "past": 0}, {}, {})
    with pytest.raises(InterpreterError, match=r"expected f32\[2, 4\]"):
        interpreter.run(g, {"seq": 2, "past": 0}, {"x": np.zeros((3, 4), np.float32)}, {})


def test_gather_out_of_range_is_an_error_not_garbage():
    b = GraphBuilder("t")
    b.output("y", b.gather(b.input("t", [3, 2]), b.input("i", [SEQ], "i32")))
    with pytest.raises(InterpreterError, match="outside"):
        interpreter.run(b.finish(), {"seq": 1, "past": 0},
                        {"t": np.zeros((3, 2), np.float32), "i": np.array([3], np.int32)}, {})


def test_exp_overflow_is_inf_by_definition():
    got = _run(lambda b: b.exp(b.input("a", [SEQ])), {"seq": 1, "past": 0}, {"a": np.array([100.0], np.float32)})
    assert np.isinf(got[0])
