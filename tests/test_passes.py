"""Graph passes, each checked by running the graph before and after it in the interpreter
(bitwise), and fusion checked by running fused against unfused C (bitwise)."""
import numpy as np
import pytest
from bench.support.tiny import random_weights, tiny_config
from helpers import BOUNDED, ENVS, EXACT, feeds, make_graph

from nanocompile.codegen.options import Options
from nanocompile.compiler.driver import compile_model, run_pipeline
from nanocompile.compiler.graph_library import GraphLibrary
from nanocompile.engine.compiled import CompiledSession
from nanocompile.frontend import build_qwen2, cache_names
from nanocompile.frontend.qwen2 import qwen2_program
from nanocompile.generate import DEFAULT_ARCH
from nanocompile.ir import SEQ, GraphBuilder, interpreter, verify
from nanocompile.passes.cse import cse
from nanocompile.passes.fold import fold_constants


def _run_model_graph(g, cfg, w, ids, past_cache=None):
    cache = past_cache or {n: np.zeros((cfg.num_key_value_heads, 0, cfg.head_dim), np.float32)
                           for n in cache_names(cfg)}
    past = next(iter(cache.values())).shape[1]
    return interpreter.run(g, {"seq": len(ids), "past": past}, {"tokens": np.array(ids, np.int32), **cache}, w)


@pytest.mark.parametrize("logits", ["last", "all"])
def test_cse_and_folding_are_bitwise_on_qwen2(logits):
    cfg = tiny_config()
    w = random_weights(cfg, seed=4)
    g = build_qwen2(cfg, logits=logits)
    merged = cse(g)
    folded = fold_constants(merged)
    verify(merged), verify(folded)
    assert len(merged.nodes) < len(g.nodes)
    assert cse(merged).nodes.__len__() == len(merged.nodes)  # idempotent
    ids = [3, 1, 4, 1, 5, 9]
    want = _run_model_graph(g, cfg, w, ids)
    for other in (merged, folded):
        got = _run_model_graph(other, cfg, w, ids)
        for k in want:
            assert np.array_equal(got[k], want[k]), k


def test_folding_evaluates_what_constants_alone_decide():
    b = GraphBuilder("fold")
    c = b.add(b.const([1.5, 2.0, -3.0]), b.const([0.25, 0.5, 0.125]))
    s = b.sqrt(b.mul(c, c))
    x = b.input("x", [SEQ, 3])
    b.output("y", b.mul(x, b.broadcast(b.reshape(s, [1, 3]), [SEQ, 3])))
    b.output("z", b.exp(b.const(1.0)))
    g = b.finish()
    folded = fold_constants(g)
    assert {n.op for n in folded.nodes} == {"const", "input", "reshape", "broadcast", "mul"}
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    want = interpreter.run(g, {"seq": 4, "past": 0}, {"x": x}, {})
    got = interpreter.run(folded, {"seq": 4, "past": 0}, {"x": x}, {})
    for k in want:
        assert np.array_equal(got[k], want[k])


@pytest.mark.c
@pytest.mark.levels
@pytest.mark.parametrize("name", sorted(EXACT) + sorted(BOUNDED))
def test_fused_c_equals_unfused_c_on_every_primitive_test(name):
    g = make_graph(name, {**EXACT, **BOUNDED}[name])
    unfused, fused = GraphLibrary(g), GraphLibrary(g, fuse=True)
    rng = np.random.default_rng(7)
    for env in ENVS:
        inputs, weights = feeds(g, env, rng)
        a, b = unfused.run(env, inputs, weights), fused.run(env, inputs, weights)
        for k in a:
            assert np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)), (name, k, env)


@pytest.mark.slow
def test_fourteen_kernels_per_block():
    m = compile_model(DEFAULT_ARCH)
    calls = m.variants["last"].calls
    # gather, cos and sin tables; 14 per block; the final norm and the LM head
    assert len(calls) == 3 + 14 * DEFAULT_ARCH.num_hidden_layers + 2
    block = [c.kernel.rsplit("_", 1)[0].split("_v")[0] for c in calls[3:17]]
    assert [k.split("_seq")[0].split("_2x")[0].split("_14x")[0] for k in block] == [
        "rowreduce_sqrt_mul",        # input rms_norm
        "matmul_add", "matmul_add",  # q and k projections with their biases
        "matmul_add",                # v projection, stored straight into the V cache
        "select_add", "select_add",  # RoPE on q; on k, stored straight into the K cache
        "matmul_mul",                # attention scores, scaled
        "rowreduce_exp_select_exp",  # causal mask, softmax's row maximum and its exps, computed once
        "rowreduce_div",             # softmax's sum and quotients
        "matmul_store",              # context
        "matmul_add",                # output projection and the residual
        "rowreduce_sqrt_mul",        # post-attention rms_norm
        "matmul2_exp_mul",           # gate and up with SwiGLU
        "matmul_add",                # down projection and the residual
    ], block
    assert all(c.kernel.startswith(k.split("_seq")[0]) for c, k in zip(calls[17:31], block))


def test_fusion_plan_roots():
    c = run_pipeline(qwen2_program(tiny_config()), Options(schedule=False))
    g, plan = c.graphs["last"], c.fusion["last"]
    roots = [g.nodes[i].op for i in sorted(plan.materialize)]
    assert roots.count("matmul") == 2 + 1  # each layer's context product and the LM head; the rest end in epilogues
    assert "reduce_sum" not in roots  # reductions fold into row kernels
    assert roots.count("exp") == 2    # softmax's exps, read by its sum and its quotients: computed once
    assert len(plan.state_stores) == 2 * 2            # k and v of 2 layers store straight into the cache


@pytest.mark.c
@pytest.mark.levels
@pytest.mark.parametrize("cfg_args", [dict(hidden=45, heads=3, kv_heads=1, head_dim=14, ffn=97, layers=3, vocab=211,
                                           tied=True),
                                      dict(hidden=70, heads=7, kv_heads=1, head_dim=10, ffn=131, layers=2, vocab=301)])
def test_fused_model_is_bitwise_unfused_with_cache(cfg_args):
    cfg = tiny_config(**cfg_args)
    w = random_weights(cfg, seed=9)
    fused, unfused = CompiledSession.from_weights(cfg, w, n_ctx=120), CompiledSession.from_weights(cfg, w, n_ctx=120, fuse=False)
    ids = [int(t) for t in np.random.default_rng(2).integers(0, cfg.vocab_size, 70)]  # two chunks
    assert np.array_equal(fused.step(ids, all_logits=True), unfused.step(ids, all_logits=True))
    for t in (5, 6, 7, 8):
        assert np.array_equal(fused.step([t]), unfused.step([t]))
    for layer in range(cfg.num_hidden_layers):
        for a, b in zip(fused.read_cache(layer), unfused.read_cache(layer)):
            assert a.shape == (cfg.num_key_value_heads, 74, cfg.head_dim)
            assert np.array_equal(a, b)
