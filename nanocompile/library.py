"""The compiled backend: a whole-model shared library called through ctypes, one call per step.

The library's fingerprint (config, precision, generator, target ISA) is checked against what
this package would generate for the model, and its ISA against this CPU, before anything runs;
the packed weights file's layout is checked by the library itself at init.
"""
from __future__ import annotations

import ctypes
import json
import sys
import tempfile
from functools import partial
from pathlib import Path

import numpy as np

from .build import find_or_build
from .cache.files import check_entry
from .cache.location import cache_root
from .cache.locks import entry_lock
from .cache.notes import note
from .checks import check_n_ctx, check_precision, check_tokens
from .choices import GRAPH_OF
from .compiler import DEFAULT_CHUNK, Module, compile_model
from .errors import ContextFullError, InputError, ModelError, NanocompileError
from .frontend.config import Qwen2Config
from .pack import made_from, pack_weights
from .quantize import native_forms
from .target import detect_march, missing_flags
from .tune.store import store_path, tuned_table

NC_OK, NC_ERR_ARGUMENT, NC_ERR_TOKEN, NC_ERR_CONTEXT, NC_ERR_WEIGHTS, NC_ERR_MEMORY, NC_ERR_CPU = range(7)

_c_int, _i32, _u64, _p, _s = ctypes.c_int, ctypes.c_int32, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_char_p
SIGNATURES = {
    "init": (_c_int, [ctypes.POINTER(_p), _p, _u64, _i32, _i32, _s, _u64]),
    "step": (_c_int, [_p, _p, _i32, _p, _i32]),
    "reset": (None, [_p]),
    "truncate": (_c_int, [_p, _i32]),
    "free": (None, [_p]),
    "past": (_i32, [_p]),
    "n_ctx": (_i32, [_p]),
    "threads": (_i32, [_p]),
    "set_threads": (_c_int, [_p, _i32]),
    "last_error": (_s, [_p]),
    "fingerprint": (_s, []),
    "layout_hash": (_s, []),
    "workspace_size": (_u64, []),
    "weights_size": (_u64, []),
    "input_limit": (_i32, []),
    "output_row": (_i32, []),
    "max_chunk": (_i32, []),
    "read_state": (_c_int, [_p, _i32, _i32, _p]),
}


class Library:
    """A loaded model library with every exported symbol's argtypes and restype declared."""

    def __init__(self, path: Path, prefix: str):
        try:
            self.cdll = ctypes.CDLL(str(path))
        except OSError as e:
            raise ModelError(f"{path}: cannot load the compiled library ({e})") from None
        self.path = path
        for name, (restype, argtypes) in SIGNATURES.items():
            try:
                fn = getattr(self.cdll, prefix + name)
            except AttributeError:
                raise ModelError(f"{path}: symbol {prefix + name} is missing; not a library for this model") from None
            fn.restype, fn.argtypes = restype, argtypes
            setattr(self, name, fn)

    def fingerprint_dict(self) -> dict:
        return json.loads(self.fingerprint().decode())


def check_fingerprint(lib: Library, module: Module) -> None:
    got, want = lib.fingerprint_dict(), module.fingerprint
    if got != want:
        differ = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        raise ModelError(f"{lib.path}: compiled for a different {', '.join(differ)} "
                         f"(library: {[got.get(k) for k in differ]}, wanted: {[want.get(k) for k in differ]})")
    missing = missing_flags(got.get("isa", []))
    if missing:
        raise ModelError(f"{lib.path}: compiled for {got.get('march')}, but this CPU lacks {', '.join(missing)}")


def packed_name(module: Module, weights_key: str, precision: str | None = None) -> str:
    """precision: the weights' form when it is not the module's own (native for int8's library)."""
    form = f"-{precision}" if precision and precision != module.precision else ""
    return f"packed/{weights_key[:20]}-{module.layout_hash[:16]}{form}.bin"


def packed_weights_path(module: Module, weights_key: str, precision: str | None = None) -> Path:
    """Where the cache keeps these weights in the layout this module's library reads."""
    return cache_root().path / packed_name(module, weights_key, precision)


def _map_checked(path: Path, want: dict) -> tuple[np.memmap | None, str]:
    """path mapped, if it passes its check (the mapping is of the file that was checked); else
    None and why not."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return None, "is missing"
    except OSError as e:
        return None, f"cannot be read ({e.strerror})"
    with f:
        problem = check_entry(path, want, file=f)
        if problem:
            return None, problem
        return np.memmap(f, dtype=np.uint8, mode="r"), ""


def open_packed(module: Module, weights, weights_key: str, progress: bool = False,
                precision: str | None = None) -> tuple[Path, np.memmap, bool]:
    """The packed weights for module's library from the cache, checked; packed from the source
    (under a lock, so concurrent runs pack once) if missing or damaged, with a note if damaged.
    precision: the weights' form, by default the module's (native: int8's library, its own file).
    Returns the file, its mapping, and whether it was packed now."""
    want = made_from(module, weights_key, precision)
    root = cache_root()
    name = packed_name(module, weights_key, precision)
    for candidate in root.candidates(name):
        mapped, _ = _map_checked(candidate, want)
        if mapped is not None:
            return candidate, mapped, False
    dest = root.place(name)
    with entry_lock(dest, f"the packed weights {dest.name}"):
        mapped, problem = _map_checked(dest, want)
        if mapped is not None:
            return dest, mapped, False
        if problem != "is missing":
            note(f"{dest} {problem}; packing it again")
        bar = progress_bar(module.weights_bytes, "packing weights") if progress else None
        try:
            pack_weights(module, weights, dest, bar.update if bar else None, source_key=weights_key,
                         precision=precision, say=partial(note_above, bar) if bar else note)
        finally:
            if bar:
                bar.close()
    return dest, np.memmap(dest, dtype=np.uint8, mode="r"), True


class CompiledSession:
    """Same interface as InterpreterSession, running the compiled whole-model library."""

    backend_name = "compiled"

    def __init__(self, config: Qwen2Config, weights: dict[str, np.ndarray], n_ctx: int = 4096, threads: int = 1,
                 weights_key: str | None = None, progress: bool = False, library: tuple[Path, dict] | None = None,
                 packed_path: Path | None = None, fuse: bool = True, schedule: bool = True,
                 march: str | None = None, precision: str = "f32", tuned: bool = True,
                 max_chunk: int = DEFAULT_CHUNK):
        """weights: a WeightSource (or a dict of arrays: float32, or already in the precision's
        form), read only if the packed file must be made. weights_key, the source's content hash
        (LoadedModel.key): with it, the packed weights file is kept in the cache for the next run;
        without, it lives as long as the session. fuse=False builds the unfused library (one
        kernel per primitive): fusion's baseline; schedule=False the unscheduled one (one thread):
        the schedules' baseline; march another target than this CPU's (x86-64-v3: AVX2 code on an
        AVX-512 machine); precision f32, int8 or native (int8's library, the weights packed from
        the file's own blocks where they are exact in its form: quantize.NativeWeights); tuned=False ignores the schedules `nanocompile
        tune` measured on this CPU (the recipes alone); max_chunk: the most prompt rows one pass
        takes (another chunk size is another library)."""
        self.config = config
        self.n_ctx = check_n_ctx(n_ctx, config)
        self.precision = check_precision(precision)
        table = tuned_schedules(march) if tuned and schedule else ()
        self.module = compile_model(config, GRAPH_OF[precision], max_chunk=max_chunk, fuse=fuse, schedule=schedule,
                                    march=march, tuned=table, **native_forms(weights, precision))
        if progress and self.module.tuned_kernels:
            _say(f"using {len(self.module.tuned_kernels)} schedules tuned on this CPU ({tuned_store(march)})")
        if progress and self.module.stale_tuned_kernels:
            _say(f"{len(self.module.stale_tuned_kernels)} schedules tuned on this CPU were measured against recipes "
                 f"that have changed since: the recipes run instead (nanocompile tune measures them again)")
        lib_path, manifest = library or find_or_build(self.module, _say if progress else None)
        self.lib = Library(lib_path, manifest["prefix"])
        check_fingerprint(self.lib, self.module)

        self._tmp = None
        if packed_path is not None:  # a file the caller names: packed if missing, used as it is
            if not packed_path.exists():
                pack_weights(self.module, weights, packed_path, precision=precision)
            self._weights = np.memmap(packed_path, dtype=np.uint8, mode="r")
        elif weights_key is not None:
            packed_path, self._weights, _ = open_packed(self.module, weights, weights_key, progress, precision)
        else:  # lives as long as the session
            self._tmp = tempfile.TemporaryDirectory(prefix="nanocompile-")
            packed_path = Path(self._tmp.name) / "weights.bin"
            pack_weights(self.module, weights, packed_path, precision=precision)
            self._weights = np.memmap(packed_path, dtype=np.uint8, mode="r")
        self.packed_path = packed_path
        self._handle = ctypes.c_void_p()
        error = ctypes.create_string_buffer(512)
        rc = self.lib.init(ctypes.byref(self._handle), self._weights.ctypes.data, self._weights.size,
                           self.n_ctx, threads, error, len(error))
        if rc != NC_OK:
            message = error.value.decode(errors="replace")
            if rc == NC_ERR_WEIGHTS:
                raise ModelError(f"{packed_path}: {message}")
            raise (InputError if rc == NC_ERR_ARGUMENT else NanocompileError)(message)
        self.vocab = self.lib.output_row()
        self.max_chunk = self.lib.max_chunk()  # the library runs longer steps in chunks of this many tokens
        self._last = np.empty(self.vocab, np.float32)
        self._history = np.zeros(self.n_ctx, np.int32)  # the cached tokens are _history[:past]

    @property
    def past(self) -> int:
        return self.lib.past(self._handle)

    @property
    def threads(self) -> int:
        return self.lib.threads(self._handle)

    def set_threads(self, n: int) -> None:
        self._check(self.lib.set_threads(self._handle, n))

    @property
    def tokens(self) -> list[int]:
        """The tokens in the KV cache, in order."""
        return self._history[:self.past].tolist()

    def reset(self) -> None:
        self.lib.reset(self._handle)

    def truncate(self, n_past: int) -> None:
        """Forgets the cached tokens from position n_past on; those before it stay."""
        self._check(self.lib.truncate(self._handle, n_past))

    def step(self, tokens, all_logits: bool = False) -> np.ndarray:
        ids = np.ascontiguousarray(check_tokens(tokens, self.config.vocab_size))
        past = self.past
        if past + ids.size <= self.n_ctx:
            # recorded before the call, so the record up to past is right whenever the call returns
            self._history[past:past + ids.size] = ids
        out = np.empty((ids.size, self.vocab), np.float32) if all_logits else self._last
        self._check(self.lib.step(self._handle, ids.ctypes.data, ids.size, out.ctypes.data, int(all_logits)))
        return out if all_logits else out.copy()

    def read_cache(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer's cached keys and values, [kv_heads, past, head_dim] like the graph's cache."""
        cfg = self.config
        out = []
        for array in (0, 1):  # the signature's state arrays: cache_k, cache_v
            rows = np.empty((self.past, cfg.num_key_value_heads, cfg.head_dim), np.float32)
            self._check(self.lib.read_state(self._handle, array, layer, rows.ctypes.data))
            out.append(rows.transpose(1, 0, 2).copy())
        return out[0], out[1]

    def raw_step(self, ids: np.ndarray, out: np.ndarray, all_logits: bool = False) -> int:
        """The library call alone, without Python's checks: for tests of the C side's own checks."""
        return self.lib.step(self._handle, ids.ctypes.data, ids.size, out.ctypes.data, int(all_logits))

    def _check(self, rc: int) -> None:
        if rc == NC_OK:
            return
        message = self.lib.last_error(self._handle).decode(errors="replace")
        if rc == NC_ERR_CONTEXT:
            raise ContextFullError(message)
        if rc in (NC_ERR_TOKEN, NC_ERR_ARGUMENT):
            raise InputError(message)
        raise NanocompileError(message)

    def close(self) -> None:
        if getattr(self, "_handle", None) and self._handle.value:
            self.lib.free(self._handle)
            self._handle = ctypes.c_void_p()
        if getattr(self, "_tmp", None):
            self._weights = None
            self._tmp.cleanup()
            self._tmp = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def tuned_store(march: str | None) -> Path:
    return store_path(march or detect_march()[0])


def tuned_schedules(march: str | None) -> tuple:
    """The schedules `nanocompile tune` measured on this CPU for this level (empty if none)."""
    try:
        return tuned_table(march or detect_march()[0])
    except ValueError as e:
        raise NanocompileError(str(e)) from None


def _say(message: str) -> None:
    print(f"nanocompile: {message}", file=sys.stderr)


def progress_bar(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, leave=False)


def note_above(bar, message: str) -> None:
    """A note on a line of its own above a progress bar."""
    bar.write(f"nanocompile: {message}", file=sys.stderr)
