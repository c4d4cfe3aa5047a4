"""nanocompile: an ahead-of-time tensor compiler for the Qwen2 transformer.

The Python API (nanocompile.api), loaded on first use so that `import nanocompile` stays light:

    import nanocompile
    model = nanocompile.load("default")          # or Model(path, n_ctx=..., n_threads=...)
    print(model.create_completion("def quicksort(arr):", max_tokens=64).text)
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .version import __version__

_API = {
    "Model": "api", "load": "api",
    "Completion": "results", "CompletionChunk": "results", "ChatCompletion": "results",
    "ChatCompletionChunk": "results", "ChatMessage": "results", "Usage": "results", "Timings": "results",
    "TokenLogprob": "results",
    "NanocompileError": "errors", "ModelError": "errors", "InputError": "errors", "ContextFullError": "errors",
    "NonFiniteLogitsError": "errors", "Grammar": "engine.constrain", "LookupParams": "engine.lookup",
    "SamplingParams": "engine.sampling",
}
__all__ = ["ChatCompletion", "ChatCompletionChunk", "ChatMessage", "Completion", "CompletionChunk", "ContextFullError",
           "Grammar", "InputError", "LookupParams", "Model", "ModelError", "NanocompileError", "NonFiniteLogitsError",
           "SamplingParams", "Timings", "TokenLogprob", "Usage", "load", "__version__"]

if TYPE_CHECKING:
    from .api import Model, load
    from .engine.constrain import Grammar
    from .engine.lookup import LookupParams
    from .engine.sampling import SamplingParams
    from .errors import ContextFullError, InputError, ModelError, NanocompileError, NonFiniteLogitsError
    from .results import (ChatCompletion, ChatCompletionChunk, ChatMessage, Completion, CompletionChunk, Timings,
                          TokenLogprob, Usage)


def __getattr__(name: str):
    # PEP 562: the API (and NumPy with it) is imported when first asked for, after the command
    # line has set the BLAS thread count that NumPy reads when it loads
    if name in _API:
        import importlib
        return getattr(importlib.import_module(f".{_API[name]}", __name__), name)
    raise AttributeError(f"module 'nanocompile' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
