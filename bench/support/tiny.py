"""Tiny Qwen2 models for tests and quick benchmarks: random configs and weights, written as a GGUF
file (tensors in F32, Q8_0 or any ggml type, the K formats by ggml's own quantizer) or a Hugging
Face directory (config.json in either rope form, safetensors, sharded, bfloat16), so every loader
runs on real files of real formats."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from nanocompile.frontend import Qwen2Config, weight_shapes


def tiny_config(hidden=40, heads=4, kv_heads=2, head_dim=10, ffn=72, layers=2, vocab=300, tied=False,
                theta=10000.0, eps=1e-6, max_pos=256) -> Qwen2Config:
    return Qwen2Config(hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                       head_dim=head_dim, rope_theta=theta, rms_norm_eps=eps, tie_word_embeddings=tied,
                       max_position_embeddings=max_pos)


def random_weights(cfg: Qwen2Config, seed: int = 0, scale: float = 0.15) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in weight_shapes(cfg).items():
        if name.endswith("norm.weight"):
            out[name] = (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (scale * rng.standard_normal(shape)).astype(np.float32)
    return out


def byte_vocab(vocab_size: int) -> tuple[list[str], list[int]]:
    """A byte-level vocabulary: the 256 byte symbols, filler, and three chat control tokens."""
    from nanocompile.models.tokenizer import bytes_to_unicode

    tokens = list(bytes_to_unicode().values())
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens.append("ĠĠ")  # the one merge's result
    tokens += [f"<|extra_{i}|>" for i in range(vocab_size - len(tokens) - len(specials))]
    types = [1] * len(tokens) + [3] * len(specials)
    return tokens + specials, types


CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def write_gguf(path: Path, cfg: Qwen2Config, weights: dict[str, np.ndarray], quantize: bool = True,
               tokenizer: bool = True, arch: str = "qwen2", skip: tuple = (), rename: dict | None = None,
               tensor_types: dict[str, str] | None = None) -> Path:
    """tensor_types: a ggml type name per tensor (transformers' names; "F32" too) where quantize's rule
    (Q8_0 for matrices of whole blocks) should not decide."""
    import gguf

    from nanocompile.models.gguf_model import LAYER_NAMES, TOP_NAMES

    to_gguf = {v: k for k, v in TOP_NAMES.items()}
    for i in range(cfg.num_hidden_layers):
        for g, h in LAYER_NAMES.items():
            to_gguf[f"model.layers.{i}.{h}"] = f"blk.{i}.{g}"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if tokenizer:
        tokens, types = byte_vocab(cfg.vocab_size)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(["Ġ Ġ"])
        w.add_eos_token_id(cfg.vocab_size - 1)
        w.add_bos_token_id(cfg.vocab_size - 3)
        w.add_chat_template(CHATML)
    for name, array in weights.items():
        if name in skip:
            continue
        gname = (rename or {}).get(name, to_gguf[name])
        kind = (tensor_types or {}).get(name)
        if kind is None and quantize and array.ndim == 2 and array.shape[1] % 32 == 0:
            kind = "Q8_0"
        if kind not in (None, "F32"):
            qtype = gguf.GGMLQuantizationType[kind]
            values = np.ascontiguousarray(array, dtype=np.float32)
            try:
                q = gguf.quants.quantize(values, qtype)
            except NotImplementedError:  # the K formats: ggml's own reference quantizer
                from .peer import ggml_quantize
                block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
                q = ggml_quantize(kind, values, nbytes, block).reshape(values.shape[0], -1)
            w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=qtype)
        else:
            w.add_tensor(gname, np.ascontiguousarray(array, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def hf_config_dict(cfg: Qwen2Config, rope_form: str = "parameters") -> dict:
    d = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps, "tie_word_embeddings": cfg.tie_word_embeddings,
        "max_position_embeddings": cfg.max_position_embeddings, "hidden_act": "silu",
        "torch_dtype": "float32", "use_sliding_window": False,
    }
    if rope_form == "parameters":
        d["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    else:
        d["rope_theta"] = cfg.rope_theta
        d["rope_scaling"] = None
    return d


def write_hf_dir(path: Path, cfg: Qwen2Config, weights: dict[str, np.ndarray], rope_form: str = "parameters",
                 shards: int = 1, bf16: bool = False, tokenizer_json: str | None = None) -> Path:
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf_config_dict(cfg, rope_form), indent=1))
    names = list(weights)

    def encode(a):
        if not bf16:
            return np.ascontiguousarray(a, dtype=np.float32)
        bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
        return (bits >> 16).astype(np.uint16)  # truncation: a valid bf16 value

    if shards == 1:
        tensors = {n: encode(weights[n]) for n in names}
        _save(save_file, tensors, path / "model.safetensors", bf16)
    else:
        weight_map = {}
        for s in range(shards):
            part = names[s::shards]
            file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            _save(save_file, {n: encode(weights[n]) for n in part}, path / file, bf16)
            weight_map.update({n: file for n in part})
        (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    if tokenizer_json is not None:
        (path / "tokenizer.json").write_text(tokenizer_json)
        (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML, "eos_token": "<|im_end|>"}))
    return path


def _save(save_file, tensors, file, bf16):
    save_file(tensors, str(file))
    if bf16:
        # safetensors' NumPy writer has no bfloat16: write U16, then relabel the dtype in the header
        raw = bytearray(file.read_bytes())
        n = int.from_bytes(raw[:8], "little")
        header = raw[8:8 + n].decode().rstrip().replace('"U16"', '"BF16"').encode()
        header += b" " * (-len(header) % 8)  # data offsets are relative to the header's end
        file.write_bytes(len(header).to_bytes(8, "little") + header + bytes(raw[8 + n:]))


def bf16_round(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What write_hf_dir(bf16=True) stores, as float32."""
    return {k: ((np.ascontiguousarray(v, np.float32).view(np.uint32) >> 16) << 16).view(np.float32)
            for k, v in weights.items()}


# one graph per primitive ------------------------------------------------------------------------
