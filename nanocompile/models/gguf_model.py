"""Reads a Qwen2 GGUF file: checks it, maps its tensor names, dequantizes every tensor to float32.

The `gguf` library parses the file and dequantizes; what is checked here first is what would
otherwise surface as a crash deep inside it: the magic, the version, counts and offsets that
point outside the file.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelError
from ..frontend.config import ConfigError, Qwen2Config

MAX_TENSORS = 1 << 16
MAX_KEYS = 1 << 16

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
    """Rejects what is not a GGUF v2/v3 file before the parser sees it."""
    if not path.exists():
        raise ModelError(f"{path}: no such file")
    if not path.is_file():
        raise ModelError(f"{path}: not a file")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24:
        raise ModelError(f"{path}: {size} bytes is too short to be a GGUF file")
    if head[:4] != b"GGUF":
        raise ModelError(f"{path}: not a GGUF file (starts with {head[:4]!r}, expected b'GGUF')")
    version, n_tensors, n_keys = struct.unpack("<IQQ", head[4:24])
    if version not in (2, 3):
        raise ModelError(f"{path}: GGUF version {version} is not supported (2 or 3)")
    if n_tensors > MAX_TENSORS:
        raise ModelError(f"{path}: header claims {n_tensors} tensors, more than the {MAX_TENSORS} allowed")
    if n_keys > MAX_KEYS:
        raise ModelError(f"{path}: header claims {n_keys} metadata keys, more than the {MAX_KEYS} allowed")


class GGUFModel:
    """A parsed, checked GGUF file; weights are dequantized by dequantize()."""

    def __init__(self, path: str | Path):
        import gguf  # imported here: the compiler core does not depend on it

        self.path = Path(path)
        check_header(self.path)
        try:
            self.reader = gguf.GGUFReader(self.path)
        except (ValueError, IndexError, KeyError, struct.error, OverflowError, TypeError, MemoryError) as e:
            raise ModelError(f"{self.path}: malformed GGUF file ({type(e).__name__}: {e})") from None
        self.size = self.path.stat().st_size
        self._check_tensors()
        arch = self.value("general.architecture")
        if arch != "qwen2":
            raise ModelError(f"{self.path}: unsupported architecture {arch!r}; nanocompile compiles qwen2")
        self.config = self._config()
        self._check_names_and_shapes()

    def value(self, key: str, default=None):
        field = self.reader.fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except Exception as e:  # the library raises various types for a malformed field
            raise ModelError(f"{self.path}: metadata key {key!r} is malformed ({e})") from None

    def _require(self, key: str):
        value = self.value(key)
        if value is None:
            raise ModelError(f"{self.path}: metadata key {key!r} is missing")
        return value

    def _check_tensors(self) -> None:
        seen = set()
        for t in self.reader.tensors:
            if t.name in seen:
                raise ModelError(f"{self.path}: tensor {t.name!r} appears twice")
            seen.add(t.name)
            end = int(t.data_offset) + int(t.n_bytes)
            if end > self.size:
                raise ModelError(f"{self.path}: tensor {t.name!r} ends at byte {end} but the file has "
                                 f"{self.size} bytes (truncated?)")

    def _config(self) -> Qwen2Config:
        a = "qwen2."
        heads = int(self._require(a + "attention.head_count"))
        hidden = int(self._require(a + "embedding_length"))
        names = {t.name for t in self.reader.tensors}
        embd = next((t for t in self.reader.tensors if t.name == "token_embd.weight"), None)
        if embd is None:
            raise ModelError(f"{self.path}: tensor 'token_embd.weight' is missing")
        vocab = int(embd.shape[1]) if len(embd.shape) == 2 else -1
        try:
            return Qwen2Config(
                hidden_size=hidden,
                intermediate_size=int(self._require(a + "feed_forward_length")),
                num_hidden_layers=int(self._require(a + "block_count")),
                num_attention_heads=heads,
                num_key_value_heads=int(self.value(a + "attention.head_count_kv", heads)),
                vocab_size=vocab,
                head_dim=int(self.value(a + "attention.key_length", hidden // heads)),
                rope_theta=float(self.value(a + "rope.freq_base", 10000.0)),
                rms_norm_eps=float(self._require(a + "attention.layer_norm_rms_epsilon")),
                tie_word_embeddings="output.weight" not in names,
                max_position_embeddings=int(self.value(a + "context_length", 32768)),
            )
        except ConfigError as e:
            raise ModelError(f"{self.path}: {e}") from None

    def _check_names_and_shapes(self) -> None:
        from ..frontend.config import weight_shapes

        expected = weight_shapes(self.config)
        found = {}
        for t in self.reader.tensors:
            name = hf_name(t.name)
            if name is None or name not in expected:
                raise ModelError(f"{self.path}: unexpected tensor {t.name!r} for a "
                                 f"{self.config.num_hidden_layers}-layer qwen2 model")
            shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists the fastest axis first
            if shape != expected[name]:
                raise ModelError(f"{self.path}: tensor {t.name!r} has shape {list(shape)}, but the config "
                                 f"says {list(expected[name])}")
            found[name] = t
        missing = [n for n in expected if n not in found]
        if missing:
            raise ModelError(f"{self.path}: {len(missing)} tensor(s) missing, first {missing[0]!r}")
        self._tensors = found

    def tensor_types(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.reader.tensors:
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        return counts

    def dequantize(self, progress=None) -> dict[str, np.ndarray]:
        """Every tensor as float32 in transformers' layout ([out, in] for a projection)."""
        from gguf.quants import dequantize

        out = {}
        for name, t in self._tensors.items():
            shape = tuple(int(d) for d in reversed(t.shape))
            try:
                array = dequantize(t.data, t.tensor_type)
            except NotImplementedError:
                raise ModelError(f"{self.path}: tensor {t.name!r} has type {t.tensor_type.name}, "
                                 f"which the gguf library cannot dequantize") from None
            out[name] = np.ascontiguousarray(array.reshape(shape), dtype=np.float32)
            if progress is not None:
                progress(int(t.n_bytes))
        return out

    def raw_tensors(self, type_name: str) -> dict[str, tuple[np.ndarray, tuple[int, ...]]]:
        """transformers' name -> (the tensor's bytes as stored, its [rows, row] shape) for every
        tensor of one GGUF type (e.g. Q8_0): what a precision reads without a float32 round trip."""
        out = {}
        for name, t in self._tensors.items():
            if t.tensor_type.name == type_name:
                shape = tuple(int(d) for d in reversed(t.shape))
                out[name] = (np.asarray(t.data).view(np.uint8).reshape(-1), shape)
        return out

    def tokenizer_data(self) -> GGUFTokenizerData | None:
        tokens = self.value("tokenizer.ggml.tokens")
        if tokens is None:
            return None
        model = self.value("tokenizer.ggml.model")
        if model != "gpt2":
            raise ModelError(f"{self.path}: tokenizer model {model!r} is not supported (gpt2 byte-level BPE)")
        return GGUFTokenizerData(
            tokens=list(tokens),
            token_types=list(self.value("tokenizer.ggml.token_type") or [1] * len(tokens)),
            merges=list(self.value("tokenizer.ggml.merges") or []),
            bos_id=self.value("tokenizer.ggml.bos_token_id"),
            eos_id=self.value("tokenizer.ggml.eos_token_id"),
            pre=self.value("tokenizer.ggml.pre"),
            chat_template=self.value("tokenizer.chat_template"),
        )
