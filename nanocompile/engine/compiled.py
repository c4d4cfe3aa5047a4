"""The compiled backend: a whole-model shared library called through ctypes, one call per step.

A session opens on an Opened (engine/open.py). Its library is found by the key of its inputs
(engine/warm.py) without compiling; only without a record is the model compiled and the library
found (shipped or cached) or built. Either way the library's embedded fingerprint is checked
against what was compiled for these inputs, and its ISA against this CPU, before anything runs;
the packed weights file's layout is checked by the library itself at init.
"""
from __future__ import annotations

import copy
import ctypes
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..codegen.options import DEFAULT_CHUNK
from ..errors import ContextFullError, InputError, ModelError, NanocompileError
from . import warm
from .checks import check_n_ctx, check_tokens
from .library import NC_ERR_ARGUMENT, NC_ERR_CONTEXT, NC_ERR_TOKEN, NC_ERR_WEIGHTS, NC_OK, Library, check_fingerprint
from .open import Opened, open_model, tuned_store
from .pack import map_weights, open_packed, pack_weights
from .progress import say
from .rows import marked

if TYPE_CHECKING:
    from ..codegen.module import Module


class CompiledSession:
    """Same interface as InterpreterSession, running the compiled whole-model library."""

    backend_name = "compiled"
    # a row's logits are bitwise the same whether it comes in a step of one row or of many (every
    # output element is computed in the same order), so verifying drafts changes no token
    rows_exact = True

    def __init__(self, opened: Opened, n_ctx: int = 4096, threads: int = 1, progress: bool = False,
                 library: tuple[Path, dict] | None = None, packed_path: Path | None = None):
        """opened: the model, its precision, its weights' form and the compiler's options
        (open.open_model). With a source key, the packed weights file is kept in the cache for
        the next run; without, it lives as long as the session. library: a (path, manifest) to
        load instead of finding one (tests); packed_path: a weights file the caller names, packed
        if missing and used as it is."""
        self.opened = opened
        self.config = opened.config
        self.precision = opened.precision
        self.n_ctx = check_n_ctx(n_ctx, opened.config)
        self._module: "Module | None" = None
        key = None if library else warm.warm_key(opened)
        self.built = warm.find(key)
        self.warm = self.built is not None  # found by its key: nothing was compiled
        self._tmp = None
        weights = None
        if self.built is None:
            from ..compiler.build import find_or_build  # here: a warm start never loads the builder

            def pack():  # on this thread while the C compiler runs: a first run's two long jobs at once
                nonlocal weights
                weights = self._open_weights(self.module.layout_hash, self.module.weights_bytes, packed_path,
                                             progress)

            path, manifest = library or find_or_build(self.module, say if progress else None, meanwhile=pack)
            self.built = warm.Built.of(self.module, path, manifest)
            warm.remember(key, self.built)
        built = self.built
        if progress and built.tuned_kernels:
            say(f"using {built.tuned_kernels} schedules tuned on this CPU ({tuned_store(opened.options.march)})")
        if progress and built.stale_tuned_kernels:
            say(f"{built.stale_tuned_kernels} schedules tuned on this CPU were measured against recipes "
                f"that have changed since: the recipes run instead (nanocompile tune measures them again)")
        self.lib = Library(built.library, built.prefix)
        check_fingerprint(self.lib, built.fingerprint)
        if weights is None:
            weights = self._open_weights(built.layout_hash, built.weights_bytes, packed_path, progress)
        self.packed_path, self._weights = weights
        self._handle = ctypes.c_void_p()
        error = ctypes.create_string_buffer(512)
        rc = self.lib.init(ctypes.byref(self._handle), self._weights.ctypes.data, self._weights.size,
                           self.n_ctx, threads, error, len(error))
        if rc != NC_OK:
            message = error.value.decode(errors="replace")
            if rc == NC_ERR_WEIGHTS:
                raise ModelError(f"{self.packed_path}: {message}")
            raise (InputError if rc == NC_ERR_ARGUMENT else NanocompileError)(message)
        self.vocab = self.lib.output_row()
        self.max_chunk = self.lib.max_chunk()  # the library runs longer steps in chunks of this many tokens
        self._last = np.empty(self.vocab, np.float32)
        self._history = np.zeros(self.n_ctx, np.int32)  # the cached tokens are _history[:past]
        # the library's slot this session's sequence lives in (sequences() makes others), and
        # which slot the library has selected, shared by the sessions of one library instance
        self.slot = 0
        self._selected = [0]
        self._owner = True
        give_back_freed_memory()

    def _open_weights(self, layout_hash: str, weights_bytes: int, packed_path: Path | None,
                      progress: bool) -> tuple[Path, np.ndarray]:
        """The packed weights for a library of this layout: a file the caller names (packed if
        missing), the cache's for a source with a key, or a temporary one for the session."""
        opened = self.opened
        if packed_path is not None:
            if not packed_path.exists():
                pack_weights(self.module, opened.weights, packed_path)
            return packed_path, map_weights(packed_path)
        if opened.source_key is not None:
            path, mapped, _ = open_packed(layout_hash, weights_bytes, opened.graph, opened.weights,
                                          opened.source_key, lambda: self.module, progress)
            return path, mapped
        self._tmp = tempfile.TemporaryDirectory(prefix="nanocompile-")  # lives as long as the session
        path = Path(self._tmp.name) / "weights.bin"
        pack_weights(self.module, opened.weights, path)
        return path, map_weights(path)

    @classmethod
    def from_weights(cls, config, weights, n_ctx: int = 4096, threads: int = 1, weights_key: str | None = None,
                     progress: bool = False, library: tuple[Path, dict] | None = None, packed_path: Path | None = None,
                     fuse: bool = True, schedule: bool = True, march: str | None = None, precision: str = "f32",
                     tuned: bool = True, max_chunk: int = DEFAULT_CHUNK) -> "CompiledSession":
        """A session on weights and their config, opened here (open.open_model): a WeightSource, or a
        mapping of arrays (float32, or already in the precision's form). weights_key: the source's
        content hash, under which the packed weights are cached. fuse=False builds the unfused
        library (one kernel per primitive): fusion's baseline; schedule=False the unscheduled one
        (one thread): the schedules' baseline; march another target than this CPU's (x86-64-v3:
        AVX2 code on an AVX-512 machine); tuned=False ignores the schedules `nanocompile tune`
        measured; max_chunk: the most prompt rows one pass takes (another chunk size is another
        library)."""
        opened = open_model(weights, precision, march, config=config, key=weights_key, max_chunk=max_chunk,
                            fuse=fuse, schedule=schedule, tuned=tuned)
        return cls(opened, n_ctx, threads, progress, library, packed_path)

    @property
    def module(self) -> "Module":
        """The compiled module this library was generated from; compiled when first asked for
        after a warm start (packing the weights anew, or a test reading the kernels)."""
        if self._module is None:
            self._module = self.opened.compile()
        return self._module

    @property
    def march(self) -> str:
        """The target the library was built for (x86-64-v3, x86-64-v4+vnni, ...)."""
        return self.built.fingerprint["march"]

    @property
    def weights_bytes(self) -> int:
        """The packed weights' bytes (what a step reads), in the layout and form the library runs."""
        return self.built.weights_bytes

    def _use(self) -> ctypes.c_void_p:
        """The library instance, its selected slot this session's."""
        if self._selected[0] != self.slot:
            self._check(self.lib.select(self._handle, self.slot))
            self._selected[0] = self.slot
        return self._handle

    def sequences(self, n: int) -> list["CompiledSession"]:
        """n sequences on this library instance and its weights: this session (slot 0) and
        n - 1 more, each with its own KV cache of n_ctx positions, for step_batch. Sessions
        made before by this call stay valid while n is not smaller."""
        if not self._owner:
            raise InputError("sequences: ask the session that opened the library")
        if not 1 <= n <= self.max_chunk:
            raise InputError(f"sequences: {n} is outside 1..{self.max_chunk}")
        self._check(self.lib.set_slots(self._handle, n))
        self._selected[0] = 0  # a slot past n may have been selected; the library then selects 0
        self._check(self.lib.select(self._handle, 0))
        out = [self]
        for slot in range(1, n):
            other = copy.copy(self)
            other.slot, other._owner = slot, False
            other._history = np.zeros(self.n_ctx, np.int32)
            other._last = np.empty(self.vocab, np.float32)
            out.append(other)
        return out

    def step_batch(self, parts: list[tuple]) -> list[np.ndarray]:
        """One step over several sequences (sessions from sequences()): parts of (session, ids) or
        (session, ids, all_logits). Per sequence, what its own step(ids, all_logits) would return,
        bitwise: every row's logits [rows, vocab] (the default here), or the last row's [vocab];
        and each cache as its step would leave it. Only the rows asked for reach the head."""
        if not parts:
            raise InputError("step_batch: no sequences")
        ids, slots, rows, every = [], [], [], []
        for part in parts:
            session, tokens, *rest = part
            if session._handle is not self._handle:
                raise InputError("step_batch: a sequence of another library instance (use sequences())")
            x = np.ascontiguousarray(check_tokens(tokens, self.config.vocab_size))
            ids.append(x)
            slots.append(session.slot)
            rows.append(x.size)
            every.append(bool(rest[0]) if rest else True)
        if len(set(slots)) != len(slots):
            raise InputError("step_batch: a sequence is given twice")
        flat = np.ascontiguousarray(np.concatenate(ids), np.int32)
        slot_ids, row_counts, all_rows = (np.array(x, np.int32) for x in (slots, rows, every))
        pasts = [part[0].past for part in parts]
        for part, x, past in zip(parts, ids, pasts):
            if past + x.size <= self.n_ctx:
                part[0]._history[past:past + x.size] = x
        kept = [n if all_ else 1 for n, all_ in zip(rows, every)]
        out = np.empty((sum(kept), self.vocab), np.float32)
        self._check(self.lib.step_batch(self._handle, len(parts), slot_ids.ctypes.data, row_counts.ctypes.data,
                                        all_rows.ctypes.data, flat.ctypes.data, out.ctypes.data))
        return [o if all_ else o[0] for o, all_ in zip(np.split(out, np.cumsum(kept)[:-1]), every)]

    def mark_first_max(self, rows: list[np.ndarray]) -> list[np.ndarray]:
        """rows as they are, except each single row of logits (float32 [vocab], contiguous), which
        comes back as a ScannedRow (engine/rows.py) carrying its first largest value's index, or -1
        where it is not finite: all of them found in one pass on the library's threads."""
        single = [i for i, r in enumerate(rows) if r.shape == (self.vocab,) and r.dtype == np.float32
                  and r.flags.c_contiguous]
        if not single:
            return rows
        pointers = (ctypes.c_void_p * len(single))(*(rows[i].ctypes.data for i in single))
        found = np.empty(len(single), np.int32)
        self._check(self.lib.first_max_rows(self._handle, pointers, len(single), found.ctypes.data))
        out = list(rows)
        for i, first in zip(single, found.tolist()):
            out[i] = marked(rows[i], first)
        return out

    @property
    def past(self) -> int:
        return self.lib.past(self._use())

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
        self.lib.reset(self._use())

    def truncate(self, n_past: int) -> None:
        """Forgets the cached tokens from position n_past on; those before it stay."""
        self._check(self.lib.truncate(self._use(), n_past))

    def step(self, tokens, all_logits: bool = False) -> np.ndarray:
        ids = np.ascontiguousarray(check_tokens(tokens, self.config.vocab_size))
        past = self.past
        if past + ids.size <= self.n_ctx:
            # recorded before the call, so the record up to past is right whenever the call returns
            self._history[past:past + ids.size] = ids
        out = np.empty((ids.size, self.vocab), np.float32) if all_logits else self._last
        self._check(self.lib.step(self._use(), ids.ctypes.data, ids.size, out.ctypes.data, int(all_logits)))
        return out if all_logits else out.copy()

    def read_cache(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer's cached keys and values, [kv_heads, past, head_dim] like the graph's cache."""
        cfg = self.config
        out = []
        for array in (0, 1):  # the signature's state arrays: cache_k, cache_v
            rows = np.empty((self.past, cfg.num_key_value_heads, cfg.head_dim), np.float32)
            self._check(self.lib.read_state(self._use(), array, layer, rows.ctypes.data))
            out.append(rows.transpose(1, 0, 2).copy())
        return out[0], out[1]

    def raw_step(self, ids: np.ndarray, out: np.ndarray, all_logits: bool = False) -> int:
        """The library call alone, without Python's checks: for tests of the C side's own checks."""
        return self.lib.step(self._use(), ids.ctypes.data, ids.size, out.ctypes.data, int(all_logits))

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
        if not getattr(self, "_owner", True):
            return  # a sequence of another session's library: that session frees it
        if getattr(self, "_handle", None) and self._handle.value:
            self.lib.free(self._handle)
            self._handle.value = None  # in place: the sequences sharing it see it closed
        if getattr(self, "_tmp", None):
            self._weights = None
            self._tmp.cleanup()
            self._tmp = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def give_back_freed_memory() -> None:
    """Opening frees what it no longer needs into malloc's arenas, which keep some (18 MB of the
    default model's tokenizer tables read from the file, about 60 MB of a 3B first run's packing
    temporaries); the run would carry them in its resident size. glibc only."""
    try:
        ctypes.CDLL(None).malloc_trim(0)  # the process's own symbols: libc's, without a search
    except (OSError, AttributeError):
        pass
