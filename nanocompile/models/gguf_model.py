"""A Qwen2 GGUF file: its config and tokenizer from the metadata, its tensors mapped to
transformers' names and dequantized to float32 one at a time (by the `gguf` library).

gguf_file.py has checked the container; what is checked here is the model: each metadata key's
type and value (an integer key stored as a float, a non-finite epsilon, an unsupported rope
scaling), the tensor names, shapes and types against the config, and the vocabulary.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..errors import ModelError
from ..frontend.config import (MAX_DIM, RMS_NORM_EPS_BOUNDS, ROPE_THETA_BOUNDS, ConfigError, Qwen2Config,
                               number_problem, weight_shapes)
from .gguf_file import FLOAT_TYPES, INTEGER_TYPES, GGUFFile, TensorInfo, read_gguf

LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(gguf_name: str) -> str | None:
    """transformers' name for a GGUF tensor name, or None if Qwen2 has no such tensor."""
    if gguf_name in TOP_NAMES:
        return TOP_NAMES[gguf_name]
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", gguf_name)
    if m and m.group(2) in LAYER_NAMES:
        return f"model.layers.{int(m.group(1))}.{LAYER_NAMES[m.group(2)]}"
    return None


@dataclass
class GGUFTokenizerData:
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_id: int | None
    eos_id: int | None
    pre: str | None
    chat_template: str | None


def check_header(path: Path) -> None:
    """Rejects a path that is not a readable file before anything else looks at it."""
    if not path.exists():
        raise ModelError(f"{path}: no such file")
    if not path.is_file():
        raise ModelError(f"{path}: not a file")


@lru_cache(maxsize=None)
def dequantizable(type_name: str) -> bool:
    """Whether the gguf library can dequantize this ggml type (tried on one block of zeros)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType[type_name]
    try:
        dequantize(np.zeros((1, GGML_QUANT_SIZES[qtype][1]), np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


class GGUFModel:
    """A parsed, checked Qwen2 GGUF file; convert() dequantizes one tensor."""

    def __init__(self, path: str | Path, parsed: GGUFFile | None = None):
        """parsed: the container as read_gguf gives it, if it has been read already."""
        self.path = Path(path)
        if parsed is None:
            check_header(self.path)
            parsed = read_gguf(self.path)
        self.file: GGUFFile = parsed
        self.size = self.file.size
        arch = self.value("general.architecture")
        if arch != "qwen2":
            raise ModelError(f"{self.path}: unsupported architecture {arch!r}; nanocompile compiles qwen2")
        self.config = self._config()
        self._check_names_and_shapes()

    # metadata -------------------------------------------------------------------------------
    def fail(self, message: str):
        raise ModelError(f"{self.path}: {message}")

    def value(self, key: str, default=None):
        found = self.file.metadata.get(key)
        return default if found is None else found.value

    def _typed(self, key: str, types: set[str], expected: str):
        found = self.file.metadata.get(key)
        if found is None:
            return None
        if found.type not in types:
            shown = repr(found.value)[:40] if not isinstance(found.value, Sequence) or isinstance(found.value, str) \
                else f"{len(found.value)} elements"
            self.fail(f"metadata key {key!r} has type {found.type} ({shown}), expected {expected}")
        return found.value

    def integer(self, key: str, default: int | None = None, required: bool = False) -> int:
        v = self._typed(key, INTEGER_TYPES, "an integer type")
        if v is None:
            if required:
                self.fail(f"metadata key {key!r} is missing")
            return default
        if not 1 <= v <= MAX_DIM:
            self.fail(f"metadata key {key!r} is {v}, expected an integer from 1 to {MAX_DIM}")
        return v

    def number(self, key: str, bounds: tuple[float, float], default: float | None = None,
               required: bool = False) -> float:
        v = self._typed(key, INTEGER_TYPES | FLOAT_TYPES, "a number")
        if v is None:
            if required:
                self.fail(f"metadata key {key!r} is missing")
            return default
        problem = number_problem(v, bounds)
        if problem:
            self.fail(f"metadata key {key!r} is {v}, expected {problem}")
        return float(v)

    def string(self, key: str) -> str | None:
        return self._typed(key, {"STRING"}, "STRING")

    def _config(self) -> Qwen2Config:
        a = "qwen2."
        hidden = self.integer(a + "embedding_length", required=True)
        heads = self.integer(a + "attention.head_count", required=True)
        kv_heads = self.integer(a + "attention.head_count_kv", heads)
        layers = self.integer(a + "block_count", required=True)
        if layers > len(self.file.tensors):
            self.fail(f"metadata key {a + 'block_count'!r} is {layers}, but the file has only "
                      f"{len(self.file.tensors)} tensors")
        if heads % kv_heads:
            self.fail(f"metadata key {a + 'attention.head_count'!r} ({heads}) is not a multiple of "
                      f"{a + 'attention.head_count_kv'!r} ({kv_heads})")
        head_dim = self.integer(a + "attention.key_length", None)
        if head_dim is None:  # llama.cpp divides the width among the heads
            if hidden % heads:
                self.fail(f"metadata key {a + 'embedding_length'!r} ({hidden}) is not a multiple of "
                          f"{a + 'attention.head_count'!r} ({heads}), and no {a + 'attention.key_length'!r} "
                          f"is given")
            head_dim = hidden // heads
        value_dim = self.integer(a + "attention.value_length", head_dim)
        if value_dim != head_dim:
            self.fail(f"metadata keys {a + 'attention.key_length'!r} ({head_dim}) and "
                      f"{a + 'attention.value_length'!r} ({value_dim}) differ; qwen2 has one head size")
        if head_dim % 2:
            self.fail(f"the head size ({a + 'attention.key_length'!r}, or {a + 'embedding_length'!r} / "
                      f"{a + 'attention.head_count'!r}) is {head_dim}; rotary embeddings need an even size")
        scaling = self.string(a + "rope.scaling.type")
        if scaling not in (None, "none"):
            self.fail(f"metadata key {a + 'rope.scaling.type'!r} is {scaling!r}; only unscaled rope is supported")
        embd = self._tensor_info("token_embd.weight")
        if len(embd.dims) != 2:
            self.fail(f"tensor 'token_embd.weight' has {len(embd.dims)} dimensions {list(embd.dims)}, expected 2")
        vocab = embd.dims[1]
        if vocab > MAX_DIM:
            self.fail(f"tensor 'token_embd.weight' has {vocab} rows, more than {MAX_DIM}")
        try:
            return Qwen2Config(
                hidden_size=hidden,
                intermediate_size=self.integer(a + "feed_forward_length", required=True),
                num_hidden_layers=layers,
                num_attention_heads=heads,
                num_key_value_heads=kv_heads,
                vocab_size=vocab,
                head_dim=head_dim,
                rope_theta=self.number(a + "rope.freq_base", ROPE_THETA_BOUNDS, 10000.0),
                rms_norm_eps=self.number(a + "attention.layer_norm_rms_epsilon", RMS_NORM_EPS_BOUNDS, required=True),
                tie_word_embeddings=not any(t.name == "output.weight" for t in self.file.tensors),
                max_position_embeddings=self.integer(a + "context_length", 32768),
            )
        except ConfigError as e:  # the checks above cover what Qwen2Config checks; kept as a backstop
            raise ModelError(f"{self.path}: {e}") from None

    # tensors --------------------------------------------------------------------------------
    def _tensor_info(self, name: str) -> TensorInfo:
        found = next((t for t in self.file.tensors if t.name == name), None)
        if found is None:
            self.fail(f"tensor {name!r} is missing")
        return found

    def _check_names_and_shapes(self) -> None:
        expected = weight_shapes(self.config)
        found: dict[str, TensorInfo] = {}
        for t in self.file.tensors:
            name = hf_name(t.name)
            if name is None or name not in expected:
                self.fail(f"unexpected tensor {t.name!r} for a {self.config.num_hidden_layers}-layer qwen2 model")
            shape = tuple(reversed(t.dims))  # GGUF lists the fastest axis first
            if shape != expected[name]:
                self.fail(f"tensor {t.name!r} has shape {list(shape)}, but the config says {list(expected[name])}")
            found[name] = t
        missing = [n for n in expected if n not in found]
        if missing:
            self.fail(f"{len(missing)} tensor(s) missing, first {missing[0]!r}")
        self.tensors = found

    def gguf_name(self, name: str) -> str:
        return self.tensors[name].name

    def tensor_types(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.file.tensors:
            counts[t.type] = counts.get(t.type, 0) + 1
        return counts

    def raw(self, name: str) -> tuple[str, np.ndarray]:
        """One tensor as stored: its ggml type name, and its bytes as rows ([rows, bytes per row],
        rows in transformers' [out] order), mapped from the file."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        t = self.tensors[name]
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(t.type_id)]
        rows = t.n_bytes // (t.dims[0] // block * type_size)
        # a mapping per tensor: once converted, its pages leave this process (a float32 result
        # that is a view keeps only its own)
        return t.type, np.memmap(self.path, dtype=np.uint8, mode="r", offset=t.start,
                                 shape=(t.n_bytes,)).reshape(rows, -1)

    def check_convertible(self, name: str) -> None:
        """ModelError unless the gguf library can convert the tensor to float32. Asked when a
        tensor is to be converted, not when the file is opened: native runs most tensors as
        stored, and a warm start converts none (importing the gguf library costs it 0.03 s)."""
        t = self.tensors[name]
        if not dequantizable(t.type):
            self.fail(f"tensor {t.name!r} has type {t.type}, which the gguf library cannot dequantize")

    def convert(self, name: str) -> np.ndarray:
        """One tensor, by transformers' name, as float32 in transformers' layout ([out, in])."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        t = self.tensors[name]
        self.check_convertible(name)
        qtype = GGMLQuantizationType(t.type_id)
        _, raw = self.raw(name)
        with np.errstate(invalid="ignore", over="ignore"):  # a non-finite scale: reported by the finite check
            array = dequantize(raw, qtype)
        return np.ascontiguousarray(array.reshape(tuple(reversed(t.dims))), dtype=np.float32)

    def dequantize(self, progress=None) -> dict[str, np.ndarray]:
        """Every tensor as float32 (convert() for each)."""
        out = {}
        for name, t in self.tensors.items():
            out[name] = self.convert(name)
            if progress is not None:
                progress(t.n_bytes)
        return out

    # tokenizer ------------------------------------------------------------------------------
    def tokenizer_data(self) -> GGUFTokenizerData | None:
        tokens = self._typed("tokenizer.ggml.tokens", {"ARRAY[STRING]"}, "an array of strings")
        if tokens is None:
            return None
        model = self.string("tokenizer.ggml.model")
        if model != "gpt2":
            self.fail(f"tokenizer model {model!r} is not supported (gpt2 byte-level BPE)")
        if len(tokens) > self.config.vocab_size:
            self.fail(f"metadata key 'tokenizer.ggml.tokens' has {len(tokens)} tokens, more than the "
                      f"{self.config.vocab_size} rows of 'token_embd.weight'")
        if len(set(tokens)) != len(tokens):
            first = {}
            for i, tok in enumerate(tokens):
                if tok in first:
                    self.fail(f"metadata key 'tokenizer.ggml.tokens' has token {tok!r} twice (ids {first[tok]} "
                              f"and {i})")
                first[tok] = i
        types = self._typed("tokenizer.ggml.token_type", {f"ARRAY[{t}]" for t in INTEGER_TYPES},
                            "an array of integers")
        if types is not None and len(types) != len(tokens):
            self.fail(f"metadata key 'tokenizer.ggml.token_type' has {len(types)} entries for {len(tokens)} tokens")
        merges = self._typed("tokenizer.ggml.merges", {"ARRAY[STRING]"}, "an array of strings") or []
        bad = next((i for i, m in enumerate(merges) if " " not in m), None)
        if bad is not None:
            self.fail(f"metadata key 'tokenizer.ggml.merges' entry {bad} ({merges[bad]!r}) is not two tokens "
                      f"separated by a space")
        return GGUFTokenizerData(
            tokens=tokens,
            token_types=types if types is not None else [1] * len(tokens),
            merges=merges,
            bos_id=self._token_id("tokenizer.ggml.bos_token_id", len(tokens)),
            eos_id=self._token_id("tokenizer.ggml.eos_token_id", len(tokens)),
            pre=self.string("tokenizer.ggml.pre"),
            chat_template=self.string("tokenizer.chat_template"),
        )

    def _token_id(self, key: str, n_tokens: int) -> int | None:
        v = self._typed(key, INTEGER_TYPES, "an integer type")
        if v is not None and not 0 <= v < n_tokens:
            self.fail(f"metadata key {key!r} is {v}, outside the vocabulary of {n_tokens} tokens")
        return v
