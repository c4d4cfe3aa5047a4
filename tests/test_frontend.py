"""The Qwen2 frontend: one graph per config, its structure and node counts."""
import subprocess
import sys

import numpy as np
import pytest
from bench.support.tiny import random_weights, tiny_config

from nanocompile.frontend import Qwen2Config, build_qwen2, cache_names, weight_shapes
from nanocompile.ir import PAST, SEQ, interpreter, verify
from nanocompile.ir.stats import node_counts

QWEN05 = dict(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
              vocab_size=151936)


@pytest.mark.parametrize("layers", [1, 2, 24])
def test_node_counts_are_per_block_times_layers(layers):
    cfg = Qwen2Config(num_hidden_layers=layers, **QWEN05)
    g = build_qwen2(cfg)
    c = node_counts(g, layers)
    assert c["all_blocks_equal"]
    assert c["total"] == c["outside"] + layers * c["per_block"]
    ops = c["block_ops"]
    # seven projections and the two attention products; q/k/v weights and biases, o, gate, up,
    # down and two norm gains; the two cache inputs
    assert ops["matmul"] == 9 and ops["weight"] == 12 and ops["input"] == 2
    assert ops["exp"] == 2  # softmax and SiLU


def test_node_counts_tool_prints_what_the_counter_counts():
    cfg = Qwen2Config(num_hidden_layers=24, **QWEN05)
    c = node_counts(build_qwen2(cfg), 24)
    out = subprocess.run([sys.executable, "-m", "nanocompile", "graph"], capture_output=True, text=True, check=True)
    assert f"nodes, whole model (24 layers): {c['total']}" in out.stdout
    assert f"nodes per transformer block: {c['per_block']}" in out.stdout
    assert f"nodes outside the blocks: {c['outside']}" in out.stdout


def test_graph_interface():
    cfg = tiny_config(layers=3)
    g = build_qwen2(cfg)
    verify(g)
    inputs = g.inputs()
    assert inputs["tokens"].shape == (SEQ,) and inputs["tokens"].dtype == "i32"
    for name in cache_names(cfg):
        assert inputs[name].shape == (cfg.num_key_value_heads, PAST, cfg.head_dim)
        assert g.nodes[g.outputs[name]].shape == (cfg.num_key_value_heads, PAST + SEQ, cfg.head_dim)
    assert g.nodes[g.outputs["logits"]].shape == (1, cfg.vocab_size)
    assert build_qwen2(cfg, logits="all").nodes[-1].shape == (SEQ, cfg.vocab_size)
    assert {n: tuple(int(d.as_int()) for d in node.shape) for n, node in g.weights().items()} == weight_shapes(cfg)


def test_tied_embeddings_share_one_weight():
    untied = build_qwen2(tiny_config(tied=False)).weights()
    tied = build_qwen2(tiny_config(tied=True)).weights()
    assert "lm_head.weight" in untied and "lm_head.weight" not in tied
    assert len(untied) == len(tied) + 1


def test_one_graph_serves_prompt_and_decode():
    """The same graph, run at seq=5 past=0 and then at seq=1 past=5, equals one run at seq=6."""
    cfg = tiny_config()
    w = random_weights(cfg, seed=3)
    g = build_qwen2(cfg, logits="all")
    ids = np.array([5, 17, 42, 7, 99, 3], np.int32)
    empty = {n: np.zeros((cfg.num_key_value_heads, 0, cfg.head_dim), np.float32) for n in cache_names(cfg)}
    full = interpreter.run(g, {"seq": 6, "past": 0}, {"tokens": ids, **empty}, w)
    first = interpreter.run(g, {"seq": 5, "past": 0}, {"tokens": ids[:5], **empty}, w)
    cache = {n: first[n] for n in cache_names(cfg)}
    second = interpreter.run(g, {"seq": 1, "past": 5}, {"tokens": ids[5:], **cache}, w)
    np.testing.assert_allclose(second["logits"][0], full["logits"][5], atol=1e-5)
    for n in cache_names(cfg):
        np.testing.assert_allclose(second[n], full[n], atol=1e-6)


def test_config_validation():
    from nanocompile.frontend import ConfigError
    with pytest.raises(ConfigError, match="not a multiple"):
        tiny_config(heads=4, kv_heads=3)
    with pytest.raises(ConfigError, match="head_dim must be even"):
        tiny_config(head_dim=9)
    with pytest.raises(ConfigError, match="positive integer"):
        tiny_config(layers=0)


def test_rope_frequencies_are_the_same_on_every_cpu():
    """theta ** (-2i / d) correctly rounded to float32: each frequency is the float32 nearest the
    value computed with 60 digits, whatever NumPy's float32 power gives on this CPU (its AVX2 and
    AVX-512 code differ). A float32 halfway case would be decided to even: none occurs here."""
    from decimal import Decimal, localcontext

    from nanocompile.frontend.nn import nearest_float32, rope_frequencies

    for theta, d in ((1_000_000.0, 64), (10_000.0, 128), (1_000_000.0, 128), (500_000.0, 80)):
        got = rope_frequencies(d, theta)
        with localcontext() as ctx:
            ctx.prec = 60
            exact = [(Decimal(theta).ln() * -2 * i / d).exp() for i in range(d // 2)]
        for g, x in zip(got, exact):
            up, down = np.nextafter(g, np.float32(np.inf)), np.nextafter(g, np.float32(-np.inf))
            here = abs(Decimal(float(g)) - x)
            assert here <= abs(Decimal(float(up)) - x) and here <= abs(Decimal(float(down)) - x)
    # halfway cases go to the even neighbour: 1 + 2^-24 to 1; 1 + 3 * 2^-24 to 1 + 2^-22, not 1 + 2^-23
    assert nearest_float32(Decimal(1) + Decimal(2) ** -24) == np.float32(1.0)
    assert nearest_float32(Decimal(1) + 3 * Decimal(2) ** -24) == np.float32(1 + 2 ** -22)
    assert nearest_float32(Decimal(1) + Decimal(2) ** -23 + Decimal(2) ** -30) == np.float32(1 + 2 ** -23)
