"""llama.cpp, the peer the benchmarks and accuracy checks compare with (llama-cpp-python, an
optional dependency imported only here): the same weights written by llama.cpp itself."""
from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path

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
