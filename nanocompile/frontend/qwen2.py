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
from ..ir.ops import QBLOCK
from ..ir.signature import VARIANTS, Signature, State, StepInput, StepOutput, StepProgram, WeightSpec, identifier
from . import nn
from .config import Qwen2Config, weight_shapes

LOGITS = VARIANTS
# the graphs this frontend writes: float32 throughout, or int8's blocks for the projections
PRECISIONS = ("f32", "int8")


def quantized_weights(cfg: Qwen2Config) -> set[str]:
    """The weights int8 stores in blocks (every projection and the embedding); norms and
    biases stay float32."""
    return {name for name, shape in weight_shapes(cfg).items() if len(shape) == 2}


def weight_specs(cfg: Qwen2Config, precision: str = "f32",
                 superblocks: tuple = ()) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every weight the graph reads: name -> (shape, dtype). int8 stores a [N, K] weight as
    name.qs i8[N, Kp] and name.d f16[N, Kp / 32] (K padded with zeros to whole blocks).
    superblocks: (name, sub, block, mins) for the int8 graph's weights kept in a K format's
    numbers (superblock_matmul): name.qs i8[N, K], name.sc i8[N, K / sub], name.d f16[N, K / block],
    and with mins name.mn and name.dmin shaped as sc and d."""
    out = {}
    quantized = quantized_weights(cfg) if precision == "int8" else set()
    kinds = {name: (sub, block, mins) for name, sub, block, mins in superblocks}
    for name, shape in weight_shapes(cfg).items():
        if name in kinds and name in quantized:
            (n, k), (sub, block, mins) = shape, kinds[name]
            if k % block or block % sub:
                raise ValueError(f"{name}: a row of {k} is not whole super-blocks of {block} in sub-blocks of {sub}")
            out[name + ".qs"] = ((n, k), "i8")
            out[name + ".sc"] = ((n, k // sub), "i8")
            out[name + ".d"] = ((n, k // block), "f16")
            if mins:
                out[name + ".mn"] = ((n, k // sub), "i8")
                out[name + ".dmin"] = ((n, k // block), "f16")
        elif name in quantized:
            n, k = shape
            out[name + ".qs"] = ((n, nn.padded(k)), "i8")
            out[name + ".d"] = ((n, nn.padded(k) // QBLOCK), "f16")
        else:
            out[name] = (tuple(shape), "f32")
    return out


def build_qwen2(cfg: Qwen2Config, logits: str = "last", precision: str = "f32", superblocks: tuple = ()) -> Graph:
    if logits not in LOGITS:
        raise ValueError(f"logits must be one of {LOGITS}, got {logits!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    b = GraphBuilder(f"qwen2_logits_{logits}" + ("" if precision == "f32" else f"_{precision}"))
    specs, made = weight_specs(cfg, precision, superblocks), {}

    def weight(name):
        """The weight's node, made on first use (a tied embedding is read twice)."""
        if name not in made:
            shape, dtype = specs[name]
            made[name] = b.weight(name, shape, dtype)
        return made[name]

    def linear(x, name, bias=None):
        """x @ W.T (+ bias) for the weight called name, in the precision's form."""
        if name + ".sc" in specs:
            mins = (weight(name + ".mn"), weight(name + ".dmin")) if name + ".mn" in specs else (None, None)
            return nn.linear_k(b, x, weight(name + ".qs"), weight(name + ".sc"), weight(name + ".d"), *mins, bias=bias)
        if precision == "int8":
            return nn.linear_q8(b, x, weight(name + ".qs"), weight(name + ".d"), bias)
        return nn.linear(b, x, weight(name), bias)

    seq, past = Expr.sym("seq"), Expr.sym("past")
    h, d = cfg.hidden_size, cfg.head_dim
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads

    tokens = b.input("tokens", [seq], "i32")
    embed = "model.embed_tokens.weight"
    if embed + ".sc" in specs:  # a K format's numbers, as stored (native)
        mins = (weight(embed + ".mn"), weight(embed + ".dmin")) if embed + ".mn" in specs else (None, None)
        x = nn.gather_k(b, weight(embed + ".qs"), weight(embed + ".sc"), weight(embed + ".d"), *mins, tokens)
    elif precision == "int8":
        x = nn.gather_q8(b, weight("model.embed_tokens.weight.qs"), weight("model.embed_tokens.weight.d"), tokens, h)
    else:
        x = b.gather(weight("model.embed_tokens.weight"), tokens)
    with b.scope("rope"):
        cos, sin = nn.rope_tables(b, d, cfg.rope_theta)
        mask = nn.causal_mask(b)

    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."

        with b.scope(f"layers.{i}"):
            with b.scope("attn"):
                hn = nn.rms_norm(b, x, weight(p + "input_layernorm.weight"), cfg.rms_norm_eps)
                proj = {}
                for name, width in (("q", heads * d), ("k", kv_heads * d), ("v", kv_heads * d)):
                    bias = weight(p + f"self_attn.{name}_proj.bias") if cfg.qkv_bias else None
                    y = linear(hn, p + f"self_attn.{name}_proj.weight", bias)
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
                x = b.add(x, linear(context, p + "self_attn.o_proj.weight"))
            with b.scope("mlp"):
                hn = nn.rms_norm(b, x, weight(p + "post_attention_layernorm.weight"), cfg.rms_norm_eps)
                gate = linear(hn, p + "mlp.gate_proj.weight")
                up = linear(hn, p + "mlp.up_proj.weight")
                down = linear(b.mul(nn.silu(b, gate), up), p + "mlp.down_proj.weight")
                x = b.add(x, down)

    if logits == "none":
        return b.finish()
    with b.scope("head"):
        if logits == "last":
            x = b.slice(x, 0, seq - 1, seq)  # rows are independent from here on
        x = nn.rms_norm(b, x, weight("model.norm.weight"), cfg.rms_norm_eps)
        head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
        b.output("logits", linear(x, head))
    return b.finish()


def cache_names(cfg: Qwen2Config) -> list[str]:
    return [f"cache.{i}.{kv}" for i in range(cfg.num_hidden_layers) for kv in ("k", "v")]


def weight_cname(name: str) -> str:
    """model.layers.3.self_attn.q_proj.weight -> layers_3_q_proj_weight."""
    return identifier(name.removeprefix("model.").replace("self_attn.", "").replace("mlp.", ""))


def qwen2_signature(cfg: Qwen2Config, precision: str = "f32", superblocks: tuple = ()) -> Signature:
    """Token ids in, each layer's K and V cache updated in place, logits out."""
    kv_row = cfg.num_key_value_heads * cfg.head_dim
    state = tuple(State(f"cache.{i}.{kv}", f"cache_{kv}", i, kv_row)
                  for i in range(cfg.num_hidden_layers) for kv in ("k", "v"))
    weights = tuple(WeightSpec(name, shape, weight_cname(name), dtype)
                    for name, (shape, dtype) in weight_specs(cfg, precision, superblocks).items())
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


def qwen2_program(cfg: Qwen2Config, precision: str = "f32", superblocks: tuple = ()) -> StepProgram:
    cfg = canonical(cfg)
    return StepProgram(qwen2_signature(cfg, precision, superblocks),
                       {v: build_qwen2(cfg, v, precision, superblocks) for v in VARIANTS})
