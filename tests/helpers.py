"""What the tests share, in one module: the targets this CPU runs; tiny Qwen2 models (random
configs and weights, written as a GGUF file or a Hugging Face directory, so every loader runs on
real files of real formats); one graph per primitive with random feeds; the real prompts."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from nanocompile.compiler import Options, compile_program
from nanocompile.frontend import Qwen2Config, weight_shapes
from nanocompile.ir import PAST, SEQ, GraphBuilder
from nanocompile.ir.expr import evaluate_shape
from nanocompile.signature import StepProgram, plain_signature
from nanocompile.target import cpu_flags, detect_march, level_flags, vector_lanes

THREADS = (1, 2, 3, 8)
EPS = np.finfo(np.float32).eps

# targets ----------------------------------------------------------------------------------------

LEVELS = ("x86-64-v4", "x86-64-v3")  # the levels with vector code: AVX-512 and AVX2


def target_level() -> str:
    """The level the tests build for: this CPU's, or NANOCOMPILE_MARCH."""
    return detect_march()[0]


def target_lanes() -> int:
    return vector_lanes(target_level())


def require_level(march: str) -> None:
    """Skips (with the reason) a test of a level this CPU cannot run."""
    missing = sorted(set(level_flags(march)) - cpu_flags())
    if missing:
        pytest.skip(f"this CPU cannot run {march} code: it lacks {', '.join(missing)}")


def require_lanes(lanes: int) -> None:
    require_level({16: "x86-64-v4", 8: "x86-64-v3"}[lanes])


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
    from nanocompile.tokenizer import bytes_to_unicode

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
                from ggml_reference import ggml_quantize
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

ENVS = [{"seq": s, "past": p} for s in (1, 3, 7) for p in (0, 5)]


def superblock_values(parts: dict, fmt) -> np.ndarray:
    """What superblock_matmul multiplies: sc * d * qs - mn * dmin per sub-block, as float32."""
    per_super = fmt.block // fmt.sub
    scale = parts["sc"].astype(np.float32) * np.repeat(parts["d"].astype(np.float32), per_super, axis=1)
    w = np.repeat(scale, fmt.sub, axis=1) * parts["qs"].astype(np.float32)
    if fmt.has_min:
        least = parts["mn"].astype(np.float32) * np.repeat(parts["dmin"].astype(np.float32), per_super, axis=1)
        w = w - np.repeat(least, fmt.sub, axis=1)
    return w


def make_graph(name, build):
    """A graph whose outputs out0, out1, ... are what build(builder) returns."""
    b = GraphBuilder(name)
    out = build(b)
    for i, o in enumerate(out if isinstance(out, list) else [out]):
        b.output(f"out{i}", o)
    return b.finish()


def x_(b, shape=(SEQ, 6), name="x", dtype="f32"):
    """The input called name, made on first use (each test graph reads its inputs several times)."""
    existing = b.graph.inputs().get(name)
    if existing is not None:
        assert existing.dtype == dtype
        return existing.id
    return b.input(name, list(shape), dtype)


def feeds(graph, env, rng):
    """Random inputs and weights for a graph at the sizes env gives."""
    inputs = {}
    for name, node in graph.inputs().items():
        shape = evaluate_shape(node.shape, env)
        if node.dtype == "f32":
            inputs[name] = (rng.standard_normal(shape) * 2).astype(np.float32)
        elif node.dtype == "i32":  # also valid rows of the gather test's 10-row table
            inputs[name] = rng.integers(0, 10, shape).astype(np.int32)
        else:
            inputs[name] = rng.integers(0, 2, shape).astype(bool)
    weights = {name: (rng.standard_normal(evaluate_shape(n.shape, env))).astype(np.float32)
               for name, n in graph.weights().items()}
    return inputs, weights


def ulps(a, b):
    """How many float32 values apart a and b are, elementwise."""
    ai = a.view(np.int32).astype(np.int64)
    bi = b.view(np.int32).astype(np.int64)
    ai = np.where(ai < 0, -(1 << 31) - ai, ai)  # order floats as integers
    bi = np.where(bi < 0, -(1 << 31) - bi, bi)
    return np.abs(ai - bi)


EXACT = {
    "add": lambda b: b.add(x_(b), x_(b, name="y")),
    "sub": lambda b: b.sub(x_(b), x_(b, name="y")),
    "mul": lambda b: b.mul(x_(b), x_(b, name="y")),
    "div": lambda b: b.div(x_(b), x_(b, name="y")),
    "neg": lambda b: b.neg(x_(b)),
    "sqrt": lambda b: b.sqrt(b.mul(x_(b), x_(b))),
    "reciprocal": lambda b: b.reciprocal(x_(b)),
    "where_less_equal": lambda b: b.where(b.less_equal(x_(b), x_(b, name="y")), x_(b), x_(b, name="y")),
    "cast": lambda b: [b.cast(x_(b), "i32"), b.cast(x_(b, name="i", dtype="i32"), "f32"),
                       b.cast(x_(b, name="m", dtype="bool"), "f32")],
    "int_arith": lambda b: [b.add(x_(b, name="i", dtype="i32"), x_(b, name="j", dtype="i32")),
                            b.mul(x_(b, name="i", dtype="i32"), x_(b, name="j", dtype="i32")),
                            b.neg(x_(b, name="i", dtype="i32"))],
    "reduce_max": lambda b: [b.reduce_max(x_(b), 1), b.reduce_max(x_(b), 0)],
    "gather": lambda b: b.gather(b.weight("table", [10, 5]), x_(b, (SEQ,), "i", "i32")),
    "iota_dim": lambda b: [b.iota(PAST + SEQ), b.add(b.iota(SEQ), b.broadcast(b.reshape(b.dim(PAST), [1]), [SEQ]))],
    "const": lambda b: b.mul(x_(b, (SEQ, 3)), b.broadcast(b.reshape(b.const([0.5, -2.0, 3.25]), [1, 3]), [SEQ, 3])),
    "movement": lambda b: [
        b.permute(x_(b, (2, SEQ, 3), "a"), [1, 2, 0]),
        b.broadcast(b.reshape(x_(b, (SEQ,), "v"), [1, SEQ, 1]), [4, SEQ, 3]),
        b.slice(x_(b), 1, 1, 5),
        b.slice(x_(b), 0, SEQ - 1, SEQ),
        b.reshape(x_(b), [SEQ, 2, 3]),
    ],
    "reshape_copy": lambda b: b.reshape(b.permute(x_(b, (SEQ, 4, 2), "a"), [1, 0, 2]), [4 * SEQ, 2]),
    "concat": lambda b: [b.concat([x_(b, (2, PAST, 3), "c"), x_(b, (2, SEQ, 3), "n")], 1),
                         b.concat([b.neg(b.slice(x_(b), 1, 3, 6)), b.slice(x_(b), 1, 0, 3)], 1)],
}

BOUNDED = {
    "exp": lambda b: b.exp(x_(b)),
    "sin": lambda b: b.sin(b.mul(x_(b), x_(b, name="y"))),
    "cos": lambda b: b.cos(b.mul(x_(b), x_(b, name="y"))),
    "reduce_sum": lambda b: [b.reduce_sum(x_(b, (SEQ, 37)), 1), b.reduce_sum(x_(b), 0)],
    "matmul": lambda b: [b.matmul(x_(b, (SEQ, 19)), b.permute(b.weight("w", [11, 19]), [1, 0])),
                         b.matmul(x_(b, (3, SEQ, 8), "q"), b.permute(x_(b, (3, PAST + SEQ, 8), "k"), [0, 2, 1]))],
}


def graph_kernels(graph, fuse=True):
    """The kernels a graph compiles to (fused unless told otherwise), unscheduled."""
    program = StepProgram(plain_signature(graph), {"run": graph})
    return compile_program(program, Options(fuse=fuse, schedule=False)).kernels


# the real model's prompts -----------------------------------------------------------------------

REAL_PROMPTS = {
    "code": "def quicksort(arr):\n",
    "english": "The three laws of thermodynamics are",
    "chat": None,  # a chat-templated question, rendered with the model's template
}
N_TOKENS = 32


def real_prompt_ids(model, name):
    tok = model.tokenizer
    if name == "chat":
        return tok.encode(tok.render_chat([{"role": "user", "content": "Write a haiku about compilers."}]))
    return tok.encode(REAL_PROMPTS[name])


def greedy_run(session, ids, n):
    """Greedy tokens and the logits before each of them, on a nanocompile session."""
    session.reset()
    prompt_logits = session.step(ids, all_logits=True)
    logits, tokens, steps = prompt_logits[-1], [], []
    for _ in range(n):
        steps.append(logits)
        tokens.append(int(np.argmax(logits)))
        logits = session.step([tokens[-1]])
    return {"tokens": tokens, "step_logits": steps, "prompt_logits": prompt_logits}
