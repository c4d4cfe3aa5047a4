"""Attention in vector lanes and softmax's exps computed once (issue 14, point 5).

The scores (Q times every stored key) vectorize across keys: the K cache is stored in blocks of
positions ([n_ctx / B][row][B]), so at each element of a head consecutive keys are adjacent; the
kernel that appends keys stores them in that layout, and read_state gives them back
position-major. Softmax's exps get a buffer (fusion), so each is computed once. Both keep every
bit: the scheduled library equals the unscheduled one (position-major, one kernel per root) at
every prompt length and context, including n_ctx and pasts that are not whole blocks.
"""
import numpy as np
import pytest
from bench.support.tiny import random_weights, tiny_config

from nanocompile.compiler.driver import compile_model
from nanocompile.engine.compiled import CompiledSession
from nanocompile.loopir.ir import AccUpdate, Un
from nanocompile.loopir.traverse import find_loop, loops, walk
from nanocompile.schedule.directives import Pack, Parallel, UnrollJam, Vectorize

CFG = tiny_config(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=320, max_pos=2048)


GROUP = CFG.num_attention_heads // CFG.num_key_value_heads  # query heads sharing a key-value head


@pytest.mark.parametrize("march, lanes", [("x86-64-v4", 16), ("x86-64-v3", 8)])
def test_scores_vectorize_over_keys_stored_in_blocks(march, lanes):
    m = compile_model(CFG, march=march)
    scores = [k for k in m.kernels.values() if k.name.startswith("matmul_mul") and "past" in k.name]
    assert scores
    for k in scores:
        assert any(isinstance(d, Vectorize) and d.lanes == lanes for d in k.schedule), k.schedule
        packs = [d for d in k.schedule if isinstance(d, Pack)]
        assert [(d.row, d.block) for d in packs] == [(CFG.num_key_value_heads * CFG.head_dim, lanes)]
        # the heads sharing a block of keys are jammed: one read of the block serves the group
        assert UnrollJam("i1i", GROUP) in k.schedule and Parallel("i2o") in k.schedule, k.schedule
    assert m.state_blocks == {"cache_k": lanes}  # the values stay position-major: their columns are contiguous
    writers = [k for k in m.kernels.values() if any(isinstance(d, Pack) and k.params[0].name == d.param
                                                    for d in k.schedule)]
    assert writers, "the kernel appending keys stores them in blocks"


@pytest.mark.parametrize("march", ["x86-64-v4", "x86-64-v3"])
def test_the_keys_past_the_last_whole_block_run_the_groups_sums_side_by_side(march):
    """The scores' scalar tail (past + seq not a whole number of blocks) adds the group's sums side
    by side as the vector part does: one sum after another, each of 64 dependent adds, took as
    long as the whole vector part at 8 rows after 256 keys (docs/results/phase22.md)."""
    m = compile_model(CFG, march=march)
    scores = [k for k in m.kernels.values() if k.name.startswith("matmul_mul") and "past" in k.name]
    for k in scores:
        tail = find_loop(k.body, "i2t")
        assert tail, k.schedule
        sums = [lp for lp in loops(tail[0].body) if not lp.is_output]
        assert len(sums) == 1 and sum(isinstance(s, AccUpdate) for s in sums[0].body) == GROUP, k.schedule


@pytest.mark.parametrize("march, lanes", [("x86-64-v4", 16), ("x86-64-v3", 8)])
def test_values_are_read_once_per_group_of_heads(march, lanes):
    """Probabilities times the stored values: the group's rows are jammed (a decode step has no
    other rows, and each row alone would read every stored value again), the key-value heads
    across threads."""
    m = compile_model(CFG, march=march)
    products = [k for k in m.kernels.values() if k.name.startswith("matmul_store") and "x16" in k.name]
    assert products
    for k in products:
        assert UnrollJam("i1i", GROUP) in k.schedule and Parallel("i0") in k.schedule, k.schedule


def test_softmax_computes_each_exp_once():
    m = compile_model(CFG)
    softmax = [k for k in m.kernels.values() if "pastpseq" in k.name and k.name.startswith("rowreduce")]
    # counted in the kernels as fusion wrote them (a schedule's split copies the loop: a vector
    # part and a scalar tail, each element still in one of them)
    exps = {k.name: sum(1 for n in walk(k.lowered or k.body) if isinstance(n, Un) and n.op == "exp") for k in softmax}
    assert sorted(exps.values()) == [0, 1], exps  # one kernel computes and stores them, one reads them


@pytest.mark.c
@pytest.mark.levels
def test_blocked_keys_are_bitwise_equal_to_position_major(target):
    w = random_weights(CFG)
    n_ctx = 150  # not a whole number of blocks at either level
    ids = [int(t) for t in np.random.default_rng(2).integers(0, CFG.vocab_size, 70)]
    runs = {}
    for schedule in (True, False):
        s = CompiledSession.from_weights(CFG, w, n_ctx=n_ctx, threads=2, schedule=schedule, tuned=False)
        rows = [s.step(ids, all_logits=True)]
        token = int(np.argmax(rows[0][-1]))
        while s.past < n_ctx:  # to the last position: the tail of the last block
            rows.append(s.step([token])[None])
            token = int(np.argmax(rows[-1][0]))
        caches = [c for layer in range(CFG.num_hidden_layers) for c in s.read_cache(layer)]
        runs[schedule] = (np.concatenate(rows), caches)
        blocks = s.module.state_blocks
        s.close()
        if schedule:
            assert blocks.get("cache_k"), "the scheduled library stores keys in blocks"
    (a, ca), (b, cb) = runs[True], runs[False]
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    assert all(np.array_equal(x, y) for x, y in zip(ca, cb))
