"""Qwen2 as a graph: written once, for any Qwen2Config, with symbolic seq and past.

Inputs: tokens i32[seq] and, per layer i, cache.i.k and cache.i.v f32[kv_heads, past, head_dim].
Outputs: logits f32[1, vocab] of the last row (logits="last"), f32[seq, vocab] (logits="all")
or none at all (logits="none", for the chunks of a long prompt before its last), and the grown
caches cache.i.k, cache.i.v f32[kv_heads, past+seq, head_dim]. An uncached pass is past = 0.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np

from ..ir.expr import Expr
from ..ir.graph import Graph, GraphBuilder
from ..signature import VARIANTS, Signature, State, StepInput, StepOutput, StepProgram, WeightSpec, identifier
from . import nn
from .config import Qwen2Config, weight_shapes

LOGITS = VARIANTS


def build_qwen2(cfg: Qwen2Config, logits: str = "last") -> Graph:
    if logits not in LOGITS:
        raise ValueError(f"logits must be one of {LOGITS}, got {logits!r}")
    b = GraphBuilder(f"qwen2_logits_{logits}")
    seq, past = Expr.sym("seq"), Expr.sym("past")
    h, d = cfg.hidden_size, cfg.head_dim
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads

    tokens = b.input("tokens", [seq], "i32")
    embed = b.weight("model.embed_tokens.weight", [cfg.vocab_size, h])
    x = b.gather(embed, tokens)
    with b.scope("rope"):
        cos, sin = nn.rope_tables(b, d, cfg.rope_theta)
        mask = nn.causal_mask(b)

    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."

        def w(name, shape):
            return b.weight(p + name, shape)

        with b.scope(f"layers.{i}"):
            with b.scope("attn"):
                hn = nn.rms_norm(b, x, w("input_layernorm.weight", [h]), cfg.rms_norm_eps)
                proj = {}
                for name, width in (("q", heads * d), ("k", kv_heads * d), ("v", kv_heads * d)):
                    bias = w(f"self_attn.{name}_proj.bias", [width]) if cfg.qkv_bias else None
                    y = nn.linear(b, hn, w(f"self_attn.{name}_proj.weight", [width, h]), bias)
                    n_heads = width // d
                    proj[name] = b.permute(b.reshape(y, [seq, n_heads, d]), [1, 0, 2])
                q = nn.apply_rope(b, proj["q"], cos, sin)
                k = nn.apply_rope(b, proj["k"], cos, sin)
                k_all = b.concat([b.input(f"cache.{i}.k", [kv_heads, past, d]), k], 1)
                v_all = b.concat([b.input(f"cache.{i}.v", [kv_heads, past, d]), proj["v"]], 1)
                b.output(f"cache.{i}.k", k_all)
                b.output(f"cache.{i}.v", v_all)
                context = nn.attention(b, q, k_all, v_all, mask, kv_heads)
                context = b.reshape(b.permute(context, [1, 0, 2]), [seq, heads * d])
                x = b.add(x, nn.linear(b, context, w("self_attn.o_proj.weight", [h, heads * d])))
            with b.scope("mlp"):
                hn = nn.rms_norm(b, x, w("post_attention_layernorm.weight", [h]), cfg.rms_norm_eps)
                ffn = cfg.intermediate_size
                gate = nn.linear(b, hn, w("mlp.gate_proj.weight", [ffn, h]))
                up = nn.linear(b, hn, w("mlp.up_proj.weight", [ffn, h]))
                down = nn.linear(b, b.mul(nn.silu(b, gate), up), w("mlp.down_proj.weight", [h, ffn]))
                x = b.add(x, down)

    if logits == "none":
        return b.finish()
    with b.scope("head"):
        if logits == "last":
            x = b.slice(x, 0, seq - 1, seq)  # rows are independent from here on
        x = nn.rms_norm(b, x, b.weight("model.norm.weight", [h]), cfg.rms_norm_eps)
        head = embed if cfg.tie_word_embeddings else b.weight("lm_head.weight", [cfg.vocab_size, h])
        b.output("logits", nn.linear(b, x, head))
    return b.finish()


def cache_names(cfg: Qwen2Config) -> list[str]:
    return [f"cache.{i}.{kv}" for i in range(cfg.num_hidden_layers) for kv in ("k", "v")]


def weight_cname(name: str) -> str:
    """model.layers.3.self_attn.q_proj.weight -> layers_3_q_proj_weight."""
    return identifier(name.removeprefix("model.").replace("self_attn.", "").replace("mlp.", ""))


def qwen2_signature(cfg: Qwen2Config) -> Signature:
    """Token ids in, each layer's K and V cache updated in place, logits out."""
    kv_row = cfg.num_key_value_heads * cfg.head_dim
    state = tuple(State(f"cache.{i}.{kv}", f"cache_{kv}", i, kv_row)
                  for i in range(cfg.num_hidden_layers) for kv in ("k", "v"))
    weights = tuple(WeightSpec(name, tuple(shape), weight_cname(name)) for name, shape in weight_shapes(cfg).items())
    description = (
        f"Qwen2: {cfg.num_hidden_layers} layers, width {cfg.hidden_size}, {cfg.num_attention_heads} query heads, "
        f"{cfg.num_key_value_heads} key/value heads of {cfg.head_dim},",
        f"FFN {cfg.intermediate_size}, vocabulary {cfg.vocab_size}, "
        f"{'tied' if cfg.tie_word_embeddings else 'untied'} embeddings.",
    )
    return Signature("qwen2", inputs=(StepInput("tokens", "i32", cfg.vocab_size, "token id", "the vocabulary"),),
                     state=state, outputs=(StepOutput("logits", cfg.vocab_size),), weights=weights,
                     max_positions=cfg.max_position_embeddings, description=description,
                     config=json.loads(cfg.to_json()))


def canonical(cfg: Qwen2Config) -> Qwen2Config:
    """The generated code uses epsilon and theta as float32, so configs that differ only below
    float32's precision (1e-6 in config.json, its float32 in a GGUF) are one program."""
    return dataclasses.replace(cfg, rms_norm_eps=float(np.float32(cfg.rms_norm_eps)),
                               rope_theta=float(np.float32(cfg.rope_theta)))


def qwen2_program(cfg: Qwen2Config) -> StepProgram:
    cfg = canonical(cfg)
    return StepProgram(qwen2_signature(cfg), {v: build_qwen2(cfg, logits=v) for v in VARIANTS})
