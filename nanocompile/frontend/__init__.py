from .config import ConfigError, Qwen2Config, weight_shapes
from .qwen2 import build_qwen2, cache_names

__all__ = ["ConfigError", "Qwen2Config", "weight_shapes", "build_qwen2", "cache_names"]
