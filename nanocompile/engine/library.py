"""A compiled model library through ctypes: every exported symbol declared, its error codes, and
the check that a library is the one wanted (its fingerprint) and runs on this CPU (its ISA)."""
from __future__ import annotations

import ctypes
import json
from pathlib import Path

from ..errors import ModelError
from ..target import missing_flags

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
    "set_slots": (_c_int, [_p, _i32]),
    "slots": (_i32, [_p]),
    "select": (_c_int, [_p, _i32]),
    "step_batch": (_c_int, [_p, _i32, _p, _p, _p, _p, _p]),
    "first_max_rows": (_c_int, [_p, _p, _i32, _p]),
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


def check_fingerprint(lib: Library, want: dict) -> None:
    """The library's embedded fingerprint must be `want` (what the module it is loaded for records),
    and this CPU must have the ISA flags the library was compiled for."""
    got = lib.fingerprint_dict()
    if got != want:
        differ = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        raise ModelError(f"{lib.path}: compiled for a different {', '.join(differ)} "
                         f"(library: {[got.get(k) for k in differ]}, wanted: {[want.get(k) for k in differ]})")
    missing = missing_flags(got.get("isa", []))
    if missing:
        raise ModelError(f"{lib.path}: compiled for {got.get('march')}, but this CPU lacks {', '.join(missing)}")
