"""Fused multiply-add in the float32 reductions (issue 14, point 4).

Lowering writes each step of a matmul's sum as acc = fma(a, b, acc), so the unscheduled kernel,
the reference every schedule is checked against bitwise (tests/test_schedules.py), accumulates
with fmaf in k order. A target without FMA runs the separate stage, acc = acc + a * b: another
library, another fingerprint. Other sums of products (the RMS norm's squares) keep their add, so
the fused library stays bitwise equal to the unfused one (tests/test_compiled_model.py).
"""
import numpy as np
import pytest
from bench.support.tiny import tiny_config
from helpers import make_graph, x_

from nanocompile.compiler.driver import compile_model
from nanocompile.compiler.graph_library import GraphLibrary
from nanocompile.ir.expr import SEQ
from nanocompile.loopir.ir import AccUpdate, Bin, Fma
from nanocompile.loopir.traverse import statements, walk
from nanocompile.target import FORCE, cpu_flags


def _sum_updates(module):
    """Every reduction step that adds, across the module's kernels."""
    return [s for k in module.kernels.values() for s in statements(k.body)
            if isinstance(s, AccUpdate) and s.kind == "sum"]


def test_matmul_sums_are_fused_only_where_the_target_has_fma():
    with_fma = compile_model(tiny_config(), march="x86-64-v3", schedule=False)
    without = compile_model(tiny_config(), march="x86-64-v2", schedule=False)
    fused = [(name, s) for name, k in with_fma.kernels.items() for s in statements(k.body)
             if isinstance(s, AccUpdate) and isinstance(s.value, Fma)]
    assert {name.split("_")[0] for name, _ in fused} == {"matmul", "matmul2"}  # every matmul, nothing else
    assert all(s.value.c.name == s.name for _, s in fused)
    assert not any(isinstance(n, Fma) for s in _sum_updates(without) for n in walk(s))

    def products(module, prefix):
        return [s for name, k in module.kernels.items() if name.startswith(prefix) for s in statements(k.body)
                if isinstance(s, AccUpdate) and isinstance(s.value, Bin) and isinstance(s.value.b, Bin)
                and s.value.b.op == "*"]
    assert len(products(without, "matmul")) == len(fused)
    assert products(with_fma, "rowreduce") and products(with_fma, "rowreduce") == products(without, "rowreduce")
    assert with_fma.fingerprint["fma"] is True and without.fingerprint["fma"] is False
    assert with_fma.fingerprint_hash != without.fingerprint_hash


def _k_order(a, b, fused: bool):
    """a @ b accumulated in k order in float32: fmaf per step (a*b is exact in float64, so the
    sum rounds once to float64 and then to float32, the same as fmaf but for ties the random data
    does not hit), or a rounded product then a rounded add."""
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in range(a.shape[1]):
        prod = a[:, k:k + 1].astype(np.float64) * b[k:k + 1, :].astype(np.float64)
        if fused:
            acc = (prod + acc.astype(np.float64)).astype(np.float32)
        else:
            acc = acc + prod.astype(np.float32)
    return acc


@pytest.mark.c
@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64-v2"])
def test_the_unscheduled_matmul_is_fmaf_in_k_order(march, monkeypatch):
    fused = march == "x86-64-v3"
    if fused and "fma" not in cpu_flags():
        pytest.skip("this CPU has no FMA")
    monkeypatch.setenv(FORCE, march)
    g = make_graph("mm", lambda b: b.matmul(x_(b, (SEQ, 96)), b.weight("w", [96, 24])))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((7, 96)).astype(np.float32)
    w = rng.standard_normal((96, 24)).astype(np.float32)
    got = GraphLibrary(g, max_seq=8).run({"seq": 7, "past": 0}, {"x": x}, {"w": w})["out0"]
    assert np.array_equal(got, _k_order(x, w, fused))
    assert not np.array_equal(got, _k_order(x, w, not fused)), "the two forms differ on this data"


def test_the_interpreters_fmaf_is_cs_fmaf_also_at_ties():
    """interpreter.fmaf (the "compiled_fma" order) against the C library's fmaf, on random values
    and on products that fall exactly halfway between two floats plus a tiny addend, where
    rounding the float64 sum to float32 (double rounding) is wrong: the emulation must round once."""
    import ctypes
    import ctypes.util

    from nanocompile.ir.interpreter import fmaf

    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.fmaf.argtypes, libm.fmaf.restype = [ctypes.c_float] * 3, ctypes.c_float
    rng = np.random.default_rng(11)
    random = [rng.standard_normal(3000).astype(np.float32) * s for s in (1.0, 1e-3, 1e3)]
    # sums in float32's subnormal range (the emulation's slow path) and at its overflow bound
    edges = [rng.standard_normal(400).astype(np.float32) * s for s in (1e-22, 1e-21, 1e-44)]
    top = np.finfo(np.float32).max
    edges = [np.concatenate([e, np.array(x, np.float32)]) for e, x in
             zip(edges, ([top, top, top, -top, 0.0], [1.0, 1.0, 1 + 2 ** -23, 1.0, 0.0],
                         [2.0 ** 103, np.nextafter(np.float32(2.0 ** 103), np.float32(0)), 0.0, -2.0 ** 103, 0.0]))]
    random = [np.concatenate([r, e]) for r, e in zip(random, edges)]
    ties = [(np.float32(sa * (1 + ka * 2.0 ** -23)), np.float32(1 + kb * 2.0 ** -23), np.float32(c))
            for ka in (2 ** 10, 2 ** 11, 3 * 2 ** 10) for kb in (2 ** 11, 2 ** 12, 3 * 2 ** 11)
            for c in (1e-30, -1e-30, 0.0, 1e-45, -1e-45) for sa in (1, -1)]
    a = np.concatenate([random[0], np.array([t[0] for t in ties], np.float32)])
    b = np.concatenate([random[1], np.array([t[1] for t in ties], np.float32)])
    c = np.concatenate([random[2], np.array([t[2] for t in ties], np.float32)])
    want = np.array([libm.fmaf(*x) for x in zip(a, b, c)], np.float32)
    with np.errstate(over="ignore"):
        assert np.array_equal(fmaf(a, b, c).view(np.int32), want.view(np.int32))
        double_rounded = (a.astype(np.float64) * b + c).astype(np.float32)
    assert (np.abs(want[3000:3405]) < np.finfo(np.float32).tiny).sum() > 100 and np.isinf(want).sum() >= 2
    assert not np.array_equal(double_rounded.view(np.int32), want.view(np.int32)), "the data has ties"
