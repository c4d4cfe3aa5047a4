"""Loop IR: views, lowering, the memory plan and the work counted from it."""
import pytest
from bench.support.tiny import tiny_config

from nanocompile.compiler.driver import compile_model, count_calls
from nanocompile.frontend.qwen2 import qwen2_program
from nanocompile.generate import DEFAULT_ARCH
from nanocompile.ir.expr import SEQ, Expr
from nanocompile.loopir import views as V
from nanocompile.loopir.ir import DTYPE_BYTES, format_program
from nanocompile.loopir.lower import lower
from nanocompile.loopir.work import bytes_by_buffer, bytes_per_run


@pytest.fixture(scope="module")
def default_module():
    return compile_model(DEFAULT_ARCH)


def test_views_split_merge_and_refuse():
    v = V.contiguous("x", (SEQ, Expr.of(14), Expr.of(64)))
    merged = V.reshape(v, (SEQ, 896))
    assert merged.strides == (896, 1)
    split = V.reshape(V.contiguous("h", (Expr.of(14),)), (2, 7))
    assert split.strides == (7, 1)
    t = V.permute(v, [1, 0, 2])                      # [14, seq, 64], strides (64, 896, 1)
    assert t.strides == (64, 896, 1)
    assert V.reshape(t, (2, 7 * SEQ, 64)) is None    # heads and rows do not nest: a copy
    assert V.reshape(t, (2, 7, SEQ, 64)).strides == (448, 64, 896, 1)
    b = V.broadcast(V.reshape(V.contiguous("g", (Expr.of(896),)), (1, 896)), (SEQ, 896))
    assert b.strides == (0, 1)
    s = V.slice_(v, 0, SEQ - 1, SEQ)
    assert s.offset == 896 * SEQ - 896


def test_weights_are_views_never_copies():
    p = qwen2_program(tiny_config())
    prog = lower(p.graphs["last"], p.signature)
    kinds = {c.kernel.split("_")[0] for c in prog.calls}
    # x @ W.T reads W through swapped strides: no kernel ever takes a weight as its output
    for call in prog.calls:
        kernel = prog.kernels[call.kernel]
        for p, arg in zip(kernel.params, call.args):
            if prog.buffers[arg].kind == "weight":
                assert p.access == "read"
    assert "matmul" in kinds and "append" in kinds


def test_printer_shows_loops_and_calls():
    p = qwen2_program(tiny_config())
    text = format_program(lower(p.graphs["last"], p.signature))
    assert "for i0 in 0..seq:" in text and "acc = fma(p1[" in text and "reduce k in 0..40:" in text
    assert "call append_" in text and "buffer cache_0_k: state f32[n_ctx, 2, 10]" in text


@pytest.mark.slow
@pytest.mark.parametrize("fuse", [False, True])
def test_each_weight_is_read_exactly_once(fuse):
    """The 'all logits' variant: every weight is read once per run, so the bytes polynomial's
    constant term is exactly the weights' bytes (the embedding table only in the rows the tokens
    pick, a per-token term) plus the constant tables."""
    module = compile_model(DEFAULT_ARCH, fuse=fuse)
    prog = module.variants["all"]
    moved = bytes_by_buffer(prog)
    h = DEFAULT_ARCH.hidden_size
    for name, b in prog.buffers.items():
        if b.kind != "weight":
            continue
        if name == "w_embed_tokens_weight":
            assert moved[name] == 4 * h * SEQ
        else:
            assert moved[name] == b.size * 4, name
    weights = sum(b.size.as_int() * 4 for n, b in prog.buffers.items()
                  if b.kind == "weight" and n != "w_embed_tokens_weight")
    tables = sum(moved[n].as_int() for n, b in prog.buffers.items() if b.kind == "const")
    # RoPE's inverse frequencies: 128 bytes, read once unfused; fused, the concat that doubles
    # them is a select inside the sin and cos kernels, and a load under a select is counted at
    # its loop's full extent (an upper bound): 2 kernels x 2 branches x 64 x 4 bytes
    assert tables == (1024 if fuse else 4 * DEFAULT_ARCH.head_dim // 2)
    assert bytes_per_run(prog).const == weights + tables


@pytest.mark.slow
def test_each_cached_key_and_value_is_read_once_per_step(default_module):
    """Grouped-query attention without a repeat of K and V: each cached float is read once per
    step (by the scores or the context matmul), so the past coefficient of the bytes polynomial
    is the KV cache's own bytes per token."""
    poly = bytes_per_run(default_module.variants["last"])
    kv_bytes_per_token = 2 * DEFAULT_ARCH.num_hidden_layers * DEFAULT_ARCH.num_key_value_heads * DEFAULT_ARCH.head_dim * 4
    assert poly.coeff("past") == kv_bytes_per_token
    assert poly.coeff("past", "seq") > 0  # the scores and the mask: quadratic in the prompt


def test_call_counts(default_module):
    c = count_calls(default_module, "last")
    layers = DEFAULT_ARCH.num_hidden_layers
    per_layer = [cl for cl in default_module.variants["last"].calls if cl.node >= 0]
    assert c["calls"] == len(per_layer)
    assert c["distinct_kernels"] < c["calls"] // layers + 30  # the layers share their kernels


def test_memory_plan_never_overlaps_live_buffers(default_module):
    for name, plan in default_module.plans.items():
        assert plan.overlapping_live_pairs() == [], name
        assert all(s.offset % 64 == 0 for s in plan.slots.values())
        assert plan.arena_bytes < plan.unshared_bytes / 10  # reuse by liveness
    tiny = compile_model(tiny_config(layers=3))
    for plan in tiny.plans.values():
        assert plan.overlapping_live_pairs() == []


def test_plan_bound_covers_every_size():
    """Each buffer's slot holds it at the largest chunk and context the library accepts."""
    m = compile_model(tiny_config())
    for name, prog in m.variants.items():
        plan = m.plans[name]
        for slot in plan.slots.values():
            b = prog.buffers[slot.buffer]
            for seq, past in ((m.max_chunk, m.signature.max_positions - m.max_chunk), (1, 255), (64, 0)):
                assert b.size.evaluate({"seq": seq, "past": past}) * DTYPE_BYTES[b.dtype] <= slot.size
