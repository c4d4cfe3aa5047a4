"""Every primitive, lowered to a loop nest and compiled to C, against the interpreter.

Bitwise where the operation is exactly rounded and done in the same order (IEEE add, sub, mul,
div, sqrt, compare, select, casts, max, every movement); within a stated bound where it is not:
exp, sin and cos (nc_expf and glibc's float functions against NumPy's, 2 ulp) and sums (the C kernels add in
index order, NumPy pairwise or through BLAS: |error| <= n * eps * sum|terms|).
"""
import numpy as np
import pytest
from helpers import BOUNDED, ENVS, EPS, EXACT, feeds, make_graph, ulps

from nanocompile.compiler.graph_library import GraphLibrary
from nanocompile.engine.interpreted import library_order
from nanocompile.ir import interpreter

pytestmark = [pytest.mark.c, pytest.mark.levels]

@pytest.mark.parametrize("name", sorted(EXACT))
def test_exact_primitives_are_bitwise(name):
    g = make_graph(name, EXACT[name])
    lib = GraphLibrary(g)
    rng = np.random.default_rng(len(name))
    for env in ENVS:
        inputs, weights = feeds(g, env, rng)
        with np.errstate(all="ignore"):
            want = interpreter.run(g, env, inputs, weights)
        got = lib.run(env, inputs, weights)
        for k in want:
            assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, (name, k, env)
            assert np.array_equal(got[k].view(np.uint8), want[k].view(np.uint8)), (name, k, env)


@pytest.mark.parametrize("name", sorted(BOUNDED))
def test_bounded_primitives(name):
    g = make_graph(name, BOUNDED[name])
    lib = GraphLibrary(g)
    rng = np.random.default_rng(len(name))
    for env in ENVS:
        inputs, weights = feeds(g, env, rng)
        want = interpreter.run(g, env, inputs, weights)
        got = lib.run(env, inputs, weights)
        for k in want:
            assert got[k].shape == want[k].shape
            if name in ("exp", "sin", "cos"):
                assert ulps(got[k], want[k]).max() <= 2, (name, env)
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
    g = make_graph("neg", EXACT["neg"])
    lib = GraphLibrary(g)
    text = lib.source.replace("for (int64_t i1 = 0; i1 < 6; ++i1)", "for (int64_t i1 = 0; i1 < 7; ++i1)")
    assert text != lib.source
    lib.load(lib.compile(text))
    inputs, weights = feeds(g, {"seq": 3, "past": 0}, np.random.default_rng(0))
    with pytest.raises(AssertionError, match="wrote outside output"):
        lib.run({"seq": 3, "past": 0}, inputs, weights)


@pytest.mark.parametrize("name", sorted(EXACT) + sorted(BOUNDED))
def test_every_primitive_is_bitwise_the_interpreters_compiled_order(name):
    """In the interpreter's order for the library's target (sums from 0.0 in index order, matmul
    steps fused multiply-adds where the target has FMA, nc_expf, the C library's sinf, cosf), every
    primitive, the bounded ones too, agrees with its C bit for bit."""
    g = make_graph(name, {**EXACT, **BOUNDED}[name])
    lib = GraphLibrary(g)
    rng = np.random.default_rng(len(name) + 1)
    for env in ENVS:
        inputs, weights = feeds(g, env, rng)
        with np.errstate(all="ignore"):
            want = interpreter.run(g, env, inputs, weights, order=library_order(lib.march))
        got = lib.run(env, inputs, weights)
        for k in want:
            assert np.array_equal(got[k].view(np.uint8), want[k].view(np.uint8)), (name, k, env)


def test_a_select_on_a_stored_mask_survives_gcc_o3(monkeypatch):
    """GCC 12.2 at -O3 (the model libraries' level) if-converts `m[i] ? a[i] : b[i]` over a byte
    mask into masked loads that give wrong values when the innermost loop runs 8 or 16 times
    (found in stop 22 on an unfused build: quantization blocks of 16). The generated code reads
    both sides of a select on a stored mask (NC_PICK): an unfused where over [seq, 16, 16] built
    at -O3, bitwise against the interpreter."""
    from nanocompile.compiler import graph_library
    from nanocompile.ir import SEQ

    monkeypatch.setattr(graph_library, "CFLAGS", ["-O3" if f == "-O2" else f for f in graph_library.CFLAGS])

    def build(b):
        x = b.input("x", [SEQ, 16, 16])
        zero = b.broadcast(b.reshape(b.const(0.0, "f32"), [1, 1, 1]), [SEQ, 16, 16])
        return [b.where(b.less_equal(x, zero), b.neg(x), x)]

    g = make_graph("stored_mask16", build)
    lib = GraphLibrary(g, fuse=False)
    assert "NC_PICK(" in lib.source
    for seq in (1, 3, 7):
        x = np.random.default_rng(seq).standard_normal((seq, 16, 16)).astype(np.float32)
        want = interpreter.run(g, {"seq": seq, "past": 0}, {"x": x}, {})["out0"]
        got = lib.run({"seq": seq, "past": 0}, {"x": x}, {})["out0"]
        assert np.array_equal(got, want), seq
