"""llama.cpp, the peer (llama-cpp-python, the test and bench extras), imported only here: the same
weights written by llama.cpp itself (F32 and Q8_0 requantized from a GGUF), an engine with the
interface the benchmarks time (reset, step -> the last row's logits), every row's logits for
accuracy, and ggml's own C reference for the block formats (dequantize_row_<type>,
quantize_row_<type>_ref from libggml-base: the gguf library has no dequantizer for Q8_K and
quantizes no K format; this is the code llama.cpp itself runs for both)."""
from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
from functools import lru_cache
from pathlib import Path

import numpy as np

FTYPES = {"f32": 0, "q8_0": 7}


@contextlib.contextmanager
def quiet_stderr():
    """llama.cpp logs to file descriptor 2 (not Python's sys.stderr)."""
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


@lru_cache(maxsize=None)
def llama_has_amx() -> bool:
    """Whether the installed llama.cpp was built with its AMX matrix products (a native build on
    a CPU with AMX)."""
    import llama_cpp

    return b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info()


def llama_build() -> dict:
    """What the benchmarks record of the peer: its ggml features and whether its weights may sit in
    ggml's extra buffer types (repacked rows, AMX tiles)."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    return {"llama_cpp_python": llama_cpp.__version__,
            "features": sorted(f.split("=")[0].strip() for f in info.split("|") if f.strip().endswith("= 1")),
            "extra_buffers": not llama_has_amx()}


def open_llama(path, **kwargs):
    """llama_cpp.Llama(model_path=path, **kwargs). Where the build has AMX, without ggml's extra
    buffer types: its AMX matrix product segfaults on the first decode of every file here (Intel
    Xeon with AMX, llama-cpp-python 0.3.36; llama.cpp issue 20824, closed unfixed), so the weights
    stay in plain CPU buffers, which also turns off repacking. For benchmarks on such a CPU, build
    llama-cpp-python without AMX (docs/results/README.md): then nothing is turned off."""
    from llama_cpp import Llama, llama_cpp

    if not llama_has_amx():
        return Llama(model_path=str(path), **kwargs)
    default = llama_cpp.llama_model_default_params

    def without_extra_buffers():
        params = default()
        params.use_extra_bufts = False
        return params

    llama_cpp.llama_model_default_params = without_extra_buffers  # Llama() takes no such argument
    try:
        return Llama(model_path=str(path), **kwargs)
    finally:
        llama_cpp.llama_model_default_params = default


def requantized(source: Path, precision: str, directory: Path) -> Path:
    """source written as an F32 or Q8_0 GGUF by llama.cpp (llama_model_quantize with
    allow_requantize), kept in directory for the next call."""
    import llama_cpp

    source = Path(source)
    dest = Path(directory) / f"{source.stem}.{precision}.gguf"
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[precision]
    params.allow_requantize = True
    params.nthread = 2
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    with quiet_stderr():
        rc = llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama_model_quantize failed ({rc}) on {source}")
    os.replace(tmp, dest)
    return dest


class LlamaCpp:
    """llama.cpp with its own KV cache, n_threads for prompt and decode: reset(), step(ids) -> the
    last id's logits (a view of llama.cpp's row, valid until the next step)."""

    def __init__(self, path: Path, n_ctx: int, threads: int, logits_all: bool = False):
        with quiet_stderr():
            self.llm = open_llama(path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                                  n_batch=512, n_ubatch=512, logits_all=logits_all, verbose=False)

    def reset(self) -> None:
        self.llm.reset()  # the next eval drops the cached rows past n_tokens

    def step(self, tokens: list[int]) -> np.ndarray:
        import llama_cpp

        self.llm.eval(tokens)
        row = llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(row, shape=(self.llm.n_vocab(),))

    def all_logits(self, ids: list[int]) -> np.ndarray:
        """Every row's logits (a context made with logits_all)."""
        self.llm.reset()
        with quiet_stderr():
            self.llm.eval(ids)
        return np.array(self.llm.scores[:len(ids)], dtype=np.float32)


# ggml's C reference ----------------------------------------------------------------------------

@lru_cache(maxsize=None)
def ggml_base() -> ctypes.CDLL | None:
    """libggml-base from the installed llama_cpp package, or None if it is not installed."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    for directory in spec.submodule_search_locations:
        found = sorted((Path(directory) / "lib").glob("libggml-base.so*"))
        if found:
            return ctypes.CDLL(str(found[0]))
    return None


def _c_name(type_name: str) -> str:
    if type_name.startswith("IQ"):
        return type_name.lower()  # IQ4_NL -> iq4_nl
    return type_name[0].lower() + type_name[1:]  # Q4_K -> q4_K, as ggml spells its functions


def _function(name: str):
    fn = getattr(ggml_base(), name)
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    return fn


def ggml_dequantize(type_name: str, raw: np.ndarray, block: int) -> np.ndarray:
    """dequantize_row_<type> over every block of raw ([..., nbytes] uint8)."""
    raw = np.ascontiguousarray(raw, np.uint8)
    n = raw.size // raw.shape[-1] * block
    out = np.empty(n, np.float32)
    _function(f"dequantize_row_{_c_name(type_name)}")(raw.ctypes.data, out.ctypes.data, n)
    return out


def ggml_quantize(type_name: str, values: np.ndarray, nbytes: int, block: int) -> np.ndarray:
    """quantize_row_<type>_ref: float32 values (a multiple of block) -> uint8 [n_blocks, nbytes]."""
    values = np.ascontiguousarray(values, np.float32).ravel()
    out = np.zeros((values.size // block, nbytes), np.uint8)
    _function(f"quantize_row_{_c_name(type_name)}_ref")(values.ctypes.data, out.ctypes.data, values.size)
    return out
