"""Qwen2Config: the hyperparameters that decide a Qwen2 graph's shapes."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass


from ..errors import NanocompileError


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
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                              f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if not self.rope_theta > 0:
            raise ConfigError(f"rope_theta must be positive, got {self.rope_theta}")
        if not self.rms_norm_eps > 0:
            raise ConfigError(f"rms_norm_eps must be positive, got {self.rms_norm_eps}")

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (the GQA ratio)."""
        return self.num_attention_heads // self.num_key_value_heads

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_hf_dict(d: dict, where: str = "config.json") -> "Qwen2Config":
        """Reads a transformers config.json, in both the older top-level `rope_theta` form and
        the newer `rope_parameters` form."""
        arch = d.get("model_type")
        if arch != "qwen2":
            raise ConfigError(f"{where}: unsupported architecture {arch!r}; nanocompile compiles qwen2")
        rope = d.get("rope_parameters") or {}
        if "rope_theta" in d:
            theta = d["rope_theta"]
        elif "rope_theta" in rope:
            theta = rope["rope_theta"]
        else:
            theta = 10000.0
        rope_type = rope.get("rope_type", (d.get("rope_scaling") or {}).get("rope_type", "default"))
        if rope_type not in ("default", None):
            raise ConfigError(f"{where}: rope type {rope_type!r} is not supported (only 'default')")
        try:
            heads = d["num_attention_heads"]
            return Qwen2Config(
                hidden_size=d["hidden_size"],
                intermediate_size=d["intermediate_size"],
                num_hidden_layers=d["num_hidden_layers"],
                num_attention_heads=heads,
                num_key_value_heads=d.get("num_key_value_heads", heads),
                vocab_size=d["vocab_size"],
                head_dim=d.get("head_dim") or d["hidden_size"] // heads,
                rope_theta=float(theta),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                max_position_embeddings=d.get("max_position_embeddings", 32768),
            )
        except KeyError as e:
            raise ConfigError(f"{where}: missing key {e.args[0]!r}") from None
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None


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
