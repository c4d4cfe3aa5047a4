"""Qwen2Config: the hyperparameters that decide a Qwen2 graph's shapes."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import NanocompileError

MAX_DIM = (1 << 31) - 1  # the generated C indexes with 32-bit integers
# the graph holds both as float32 constants: each must be a normal float32 within these bounds
ROPE_THETA_BOUNDS = (1.0, float(np.finfo(np.float32).max))  # below 1 the frequencies grow with i
RMS_NORM_EPS_BOUNDS = (float(np.finfo(np.float32).tiny), 1.0)


class ConfigError(NanocompileError, ValueError):
    """A model configuration that is incomplete or inconsistent."""


@dataclass(frozen=True)
class Qwen2Config:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    qkv_bias: bool = True

    def __post_init__(self):
        if self.head_dim == 0 and self.num_attention_heads > 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        self.validate()

    def validate(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "vocab_size", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_DIM:
                raise ConfigError(f"{name} must be a positive integer at most {MAX_DIM}, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                              f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        for name, bounds in (("rope_theta", ROPE_THETA_BOUNDS), ("rms_norm_eps", RMS_NORM_EPS_BOUNDS)):
            problem = number_problem(getattr(self, name), bounds)
            if problem:
                raise ConfigError(f"{name} is {getattr(self, name)!r}, expected {problem}")
        for name in ("tie_word_embeddings", "qkv_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (the GQA ratio)."""
        return self.num_attention_heads // self.num_key_value_heads

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_hf_dict(d: dict, where: str = "config.json") -> "Qwen2Config":
        """Reads a transformers config.json, in both the older top-level `rope_theta` form and
        the newer `rope_parameters` form. Every field must have its JSON type (an integer is not
        read from 40.5, "40" or true), so the config used is the one the file states."""
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: expected a JSON object, found {_json_kind(d)}")
        arch = d.get("model_type")
        if arch != "qwen2":
            raise ConfigError(f"{where}: unsupported architecture {arch!r}; nanocompile compiles qwen2")
        rope = _field(d, "rope_parameters", dict, where, {}, nullable=True)
        scaling = _field(d, "rope_scaling", dict, where, {}, nullable=True)
        if "rope_theta" in d:
            theta = _number(d, "rope_theta", where)
        elif "rope_theta" in rope:
            theta = _number(rope, "rope_theta", where, label="rope_parameters.rope_theta")
        else:
            theta = 10000.0
        for source, label in ((rope, "rope_parameters"), (scaling, "rope_scaling")):
            for key in ("rope_type", "type"):
                kind = source.get(key, "default")
                if kind not in ("default", None):
                    raise ConfigError(f"{where}: {label}.{key} is {kind!r}; only 'default' rope is supported")
        if _field(d, "use_sliding_window", bool, where, False, nullable=True):
            raise ConfigError(f"{where}: use_sliding_window is true; sliding-window attention is not supported")
        act = _field(d, "hidden_act", str, where, "silu")
        if act != "silu":
            raise ConfigError(f"{where}: hidden_act is {act!r}; qwen2 uses 'silu'")
        hidden = _dimension(d, "hidden_size", where)
        heads = _dimension(d, "num_attention_heads", where)
        head_dim = _dimension(d, "head_dim", where, None, nullable=True)
        if head_dim is None:  # transformers divides the width among the heads
            if hidden % heads:
                raise ConfigError(f"{where}: hidden_size ({hidden}) is not a multiple of num_attention_heads "
                                  f"({heads}), and no head_dim is given")
            head_dim = hidden // heads
        fields = dict(
            hidden_size=hidden,
            intermediate_size=_dimension(d, "intermediate_size", where),
            num_hidden_layers=_dimension(d, "num_hidden_layers", where),
            num_attention_heads=heads,
            num_key_value_heads=_dimension(d, "num_key_value_heads", where, heads, nullable=True),
            vocab_size=_dimension(d, "vocab_size", where),
            head_dim=head_dim,
            rope_theta=float(theta),
            rms_norm_eps=float(_number(d, "rms_norm_eps", where, 1e-6)),
            tie_word_embeddings=_field(d, "tie_word_embeddings", bool, where, False),
            max_position_embeddings=_dimension(d, "max_position_embeddings", where, 32768),
        )
        try:
            return Qwen2Config(**fields)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None


_REQUIRED = object()


def _json_kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {json.dumps(value)[:60]}"
    if isinstance(value, list):
        return "a list"
    return "an object"


def number_problem(value, bounds: tuple[float, float]) -> str | None:
    """None if value is a finite number within bounds (inclusive); else the rule it breaks."""
    low, high = bounds
    if _is_number(value) and math.isfinite(value) and low <= value <= high:
        return None
    return f"a finite number from {low:g} to {high:g}"


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _field(d: dict, key: str, kind: type, where: str, default=_REQUIRED, label: str | None = None,
           nullable: bool = False):
    """d[key] if it has JSON type kind; default if the key is absent (or null, where transformers
    reads null as "not set": nullable)."""
    if key not in d or (d[key] is None and nullable):
        if default is _REQUIRED:
            raise ConfigError(f"{where}: missing key {label or key!r}")
        return default
    value = d[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = {int: "an integer", bool: "true or false", str: "a string", dict: "an object"}[kind]
        raise ConfigError(f"{where}: {label or key} must be {expected}, found {_json_kind(value)}")
    return value


def _dimension(d: dict, key: str, where: str, default=_REQUIRED, nullable: bool = False) -> int:
    """d[key]: an integer from 1 to MAX_DIM (a size, a count: checked before anything divides by it)."""
    value = _field(d, key, int, where, default, nullable=nullable)
    if value is not None and not 0 < value <= MAX_DIM:
        raise ConfigError(f"{where}: {key} is {value}, expected an integer from 1 to {MAX_DIM}")
    return value


def _number(d: dict, key: str, where: str, default=_REQUIRED, label: str | None = None) -> float:
    if key not in d:
        if default is _REQUIRED:
            raise ConfigError(f"{where}: missing key {label or key!r}")
        return default
    value = d[key]
    if not _is_number(value) or not math.isfinite(value):
        raise ConfigError(f"{where}: {label or key} must be a finite number, found {_json_kind(value)}")
    return value


def weight_shapes(cfg: Qwen2Config) -> dict[str, tuple[int, ...]]:
    """Every parameter a Qwen2 model has, by its transformers name, with its shape."""
    h, d = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (q, h)
        shapes[p + "self_attn.k_proj.weight"] = (kv, h)
        shapes[p + "self_attn.v_proj.weight"] = (kv, h)
        if cfg.qkv_bias:
            shapes[p + "self_attn.q_proj.bias"] = (q,)
            shapes[p + "self_attn.k_proj.bias"] = (kv,)
            shapes[p + "self_attn.v_proj.bias"] = (kv,)
        shapes[p + "self_attn.o_proj.weight"] = (h, q)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (cfg.intermediate_size, h)
        shapes[p + "mlp.up_proj.weight"] = (cfg.intermediate_size, h)
        shapes[p + "mlp.down_proj.weight"] = (h, cfg.intermediate_size)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    return shapes
