"""Errors a user can cause and can fix: each says what is wrong and where."""


class NanocompileError(Exception):
    """Base class: the command line prints these as one line, without a traceback."""


class ModelError(NanocompileError):
    """A model file or directory that cannot be used: missing, malformed, or not Qwen2."""


class InputError(NanocompileError):
    """A prompt, token id or option that the model cannot take."""


class ContextFullError(InputError):
    """The context window has no room for the requested tokens."""


class NonFiniteLogitsError(NanocompileError):
    """A step gave NaN or infinite logits: generation stops there, and no token is chosen from them."""
