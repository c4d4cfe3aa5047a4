"""Fused multiply-add in the float32 reductions (issue 14, point 4).

Lowering writes each step of a matmul's sum as acc = fma(a, b, acc), so the unscheduled kernel,
the reference every schedule is checked against bitwise (tests/test_schedules.py), accumulates
with fmaf in k order. A target without FMA runs the separate stage, acc = acc + a * b: another
library, another fingerprint. Other sums of products (the RMS norm's squares) keep their add, so
the fused library stays bitwise equal to the unfused one (tests/test_compiled_model.py).
"""
import numpy as np
import pytest

from nanocompile.codegen.graph_library import GraphLibrary
from nanocompile.compiler import compile_model
from nanocompile.ir.expr import SEQ
from nanocompile.loopir.ir import AccUpdate, Bin, Fma
from nanocompile.loopir.traverse import statements, walk
from nanocompile.target import FORCE, cpu_flags

from helpers import make_graph, tiny_config, x_


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
